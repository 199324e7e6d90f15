"""Triton's shared-memory extension against a real server, with tritonclient's shared-memory
utilities and both of its clients: regions registered, inputs read from them and outputs
written into them, Triton's errors, a region in use, CUDA without a GPU."""

from __future__ import annotations

import base64
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as client_shm
from tritonclient.utils import (
    InferenceServerException,
    serialize_byte_tensor,
    serialized_byte_size,
)

from tests.e2e.conftest import SIMPLE_CONFIG, write_config
from tests.onnx_models import add_sub_model, identity_model, string_identity_model
from tests.server_process import ServerProcess, start_server

pytestmark = pytest.mark.e2e

PATIENCE_S = 60
LARGE_CONFIG = """
name: "large"
platform: "onnxruntime_onnx"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""
LONG_CONFIG = """
name: "long"
platform: "onnxruntime_onnx"
input [
  { name: "INPUT0" data_type: TYPE_INT32 dims: [ -1 ] },
  { name: "INPUT1" data_type: TYPE_INT32 dims: [ -1 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ -1 ] },
  { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ -1 ] }
]
"""
GATED_CONFIG = """
name: "gated"
backend: "python"
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
parameters { key: "gate" value: { string_value: "GATE" } }
"""
# Echoes INPUT0 once the file its `gate` parameter names exists, after writing `<gate>.entered`
# (and `<gate>.cancelled` once it sees its request cancelled).
GATED_MODEL = """
import json, os, time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.gate = json.loads(args["model_config"])["parameters"]["gate"]["string_value"]

    def execute(self, requests):
        open(self.gate + ".entered", "w").close()
        while not os.path.exists(self.gate):
            if any(r.is_cancelled() for r in requests):
                open(self.gate + ".cancelled", "w").close()
            time.sleep(0.01)
        inputs = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]) for x in inputs]
"""


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gate") / "gate"


@pytest.fixture(scope="module")
def shm_server(tmp_path_factory: pytest.TempPathFactory, gate: Path) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("shm")
    repo = root / "models"
    add_sub_model(repo / "simple" / "1" / "model.onnx", batch=False)
    write_config(repo / "simple", SIMPLE_CONFIG.format(name="simple", max_batch_size=0))
    add_sub_model(repo / "batched" / "1" / "model.onnx", batch=True)
    batched = SIMPLE_CONFIG.format(name="batched", max_batch_size=4) + "dynamic_batching { }\n"
    write_config(repo / "batched", batched)
    string_identity_model(repo / "strings" / "1" / "model.onnx")
    identity_model(repo / "large" / "1" / "model.onnx", "FP32", ["n"])
    write_config(repo / "large", LARGE_CONFIG)
    add_sub_model(repo / "long" / "1" / "model.onnx", dims=["n"], batch=False)
    write_config(repo / "long", LONG_CONFIG)
    write_config(repo / "gated", GATED_CONFIG.replace("GATE", str(gate)))
    (repo / "gated" / "1").mkdir(parents=True)
    (repo / "gated" / "1" / "model.py").write_text(GATED_MODEL)
    process = start_server([repo], root)
    yield process
    process.stop()


class Regions:
    """System shared-memory objects made as a client makes them, destroyed at the end."""

    def __init__(self) -> None:
        self.handles: list[Any] = []

    def create(self, size: int = 256) -> tuple[str, Any]:
        key = f"/tritonactor_e2e_{uuid.uuid4().hex[:12]}"
        handle = client_shm.create_shared_memory_region(key, key, size)
        self.handles.append(handle)
        return key, handle


@pytest.fixture
def regions(shm_server: ServerProcess) -> Iterator[Regions]:
    made = Regions()
    yield made
    httpx.post(f"{shm_server.base}/v2/systemsharedmemory/unregister", timeout=10)
    for handle in made.handles:
        client_shm.destroy_shared_memory_region(handle)


def client(server: ServerProcess, protocol: str) -> Any:
    if protocol == "http":
        return httpclient.InferenceServerClient(server.url)
    return grpcclient.InferenceServerClient(server.grpc_url)


def module_of(protocol: str) -> Any:
    return httpclient if protocol == "http" else grpcclient


INPUT0 = np.arange(16, dtype=np.int32)
INPUT1 = np.full(16, 3, dtype=np.int32)


def simple_request(module: Any, place: str = "io", size: int = 64) -> tuple[list[Any], list[Any]]:
    """INPUT0 at 0 and INPUT1 at 64 of region "in"; OUTPUT0 to 0 and OUTPUT1 to 64 of "out"
    when `place` has "o"."""
    inputs = []
    for index, name in enumerate(("INPUT0", "INPUT1")):
        tensor = module.InferInput(name, [16], "INT32")
        tensor.set_shared_memory("in", 64, offset=64 * index)
        inputs.append(tensor)
    outputs = []
    for index, name in enumerate(("OUTPUT0", "OUTPUT1")):
        output = module.InferRequestedOutput(name)
        if "o" in place:
            output.set_shared_memory("out", size, offset=64 * index)
        outputs.append(output)
    return inputs, outputs


def register_simple(triton: Any, regions: Regions) -> tuple[Any, Any]:
    in_key, in_handle = regions.create()
    out_key, out_handle = regions.create()
    client_shm.set_shared_memory_region(in_handle, [INPUT0, INPUT1])
    triton.register_system_shared_memory("in", in_key, 128)
    triton.register_system_shared_memory("out", out_key, 128)
    return in_handle, out_handle


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_outputs_due_where_their_inputs_lie_are_computed_from_the_inputs_as_sent(
    shm_server: ServerProcess, regions: Regions, protocol: str
) -> None:
    # One object registered twice, under two spellings of its key (two regions, mapped at two
    # addresses), each output due where the other's input lies: written there while the model
    # ran (in place), the second operation would read the first one's result, not the input.
    # Large tensors, which reach the engine as where they lie, not copied.
    count = 1 << 15  # 128 KiB of INT32 a tensor
    first = np.arange(count, dtype=np.int32)
    second = np.full(count, 3, dtype=np.int32)
    triton = client(shm_server, protocol)
    module = module_of(protocol)
    key, handle = regions.create(2 * first.nbytes)
    client_shm.set_shared_memory_region(handle, [first, second])
    triton.register_system_shared_memory("in", key, 2 * first.nbytes)
    triton.register_system_shared_memory("out", key.lstrip("/"), 2 * first.nbytes)
    inputs, outputs = [], []
    for index, name in enumerate(("INPUT0", "INPUT1")):
        tensor = module.InferInput(name, [count], "INT32")
        tensor.set_shared_memory("in", first.nbytes, offset=index * first.nbytes)
        inputs.append(tensor)
    for name, offset in (("OUTPUT0", first.nbytes), ("OUTPUT1", 0)):  # over the other input
        output = module.InferRequestedOutput(name)
        output.set_shared_memory("out", first.nbytes, offset=offset)
        outputs.append(output)
    triton.infer("long", inputs, outputs=outputs)
    got = client_shm.get_contents_as_numpy(handle, np.int32, [2, count])
    assert got[0].tolist() == (first - second).tolist()
    assert got[1].tolist() == (first + second).tolist()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_inputs_from_and_outputs_into_system_shared_memory(
    shm_server: ServerProcess, regions: Regions, protocol: str
) -> None:
    triton = client(shm_server, protocol)
    _, out_handle = register_simple(triton, regions)

    inputs, outputs = simple_request(module_of(protocol))
    result = triton.infer("simple", inputs, outputs=outputs)

    # No data in the response, as in Triton.
    if protocol == "http":
        assert result.get_response()["outputs"][0] == {
            "name": "OUTPUT0",
            "datatype": "INT32",
            "shape": [16],
        }
    else:
        assert result.get_response().raw_output_contents == [b"", b""]
    got = client_shm.get_contents_as_numpy(out_handle, np.int32, [2, 16])
    assert got.tolist() == [(INPUT0 + INPUT1).tolist(), (INPUT0 - INPUT1).tolist()]
    # Inputs only in shared memory: the outputs come in the response.
    inputs, outputs = simple_request(module_of(protocol), place="i")
    result = triton.infer("simple", inputs, outputs=outputs)
    assert result.as_numpy("OUTPUT1").tolist() == (INPUT0 - INPUT1).tolist()

    status = triton.get_system_shared_memory_status()
    names = [r["name"] for r in status] if protocol == "http" else sorted(status.regions)
    assert names == ["in", "out"]
    triton.unregister_system_shared_memory("in")
    triton.unregister_system_shared_memory()
    status = triton.get_system_shared_memory_status()
    assert (status if protocol == "http" else list(status.regions)) == []


def test_grpc_stream_reads_and_writes_shared_memory(
    shm_server: ServerProcess, regions: Regions
) -> None:
    triton = grpcclient.InferenceServerClient(shm_server.grpc_url)
    _, out_handle = register_simple(triton, regions)
    answers: list[tuple[Any, Any]] = []
    triton.start_stream(callback=lambda result, error: answers.append((result, error)))
    inputs, outputs = simple_request(grpcclient)
    triton.async_stream_infer("simple", inputs, outputs=outputs)
    small_inputs, small_outputs = simple_request(grpcclient, size=8)
    triton.async_stream_infer("simple", small_inputs, outputs=small_outputs, request_id="small")
    triton.stop_stream()  # waits for the answers

    # In the order they finish: the model has two instances (Triton's count for ONNX Runtime).
    assert len(answers) == 2
    ((result, _),) = [answer for answer in answers if answer[1] is None]
    ((_, failure),) = [answer for answer in answers if answer[1] is not None]
    assert result.get_response().raw_output_contents == [b"", b""]
    got = client_shm.get_contents_as_numpy(out_handle, np.int32, [16])
    assert got.tolist() == (INPUT0 + INPUT1).tolist()
    assert failure.message() == (
        "shared memory size specified with the request for output 'OUTPUT0' (8 bytes) should "
        "be at least 64 bytes to hold the results"
    )
    # Both requests are over: nothing holds the regions.
    triton.unregister_system_shared_memory()


def test_bytes_tensors_in_shared_memory(shm_server: ServerProcess, regions: Regions) -> None:
    http = httpclient.InferenceServerClient(shm_server.url)
    key, handle = regions.create()
    strings = np.array([b"hello", b"shared", b""], dtype=np.object_)
    serialized = serialize_byte_tensor(strings)
    client_shm.set_shared_memory_region(handle, [serialized])
    http.register_system_shared_memory("s", key, 256)
    tensor = httpclient.InferInput("INPUT0", [1, 3], "BYTES")
    tensor.set_shared_memory("s", serialized_byte_size(serialized))
    output = httpclient.InferRequestedOutput("OUTPUT0")
    output.set_shared_memory("s", 128, offset=128)

    http.infer("strings", [tensor], outputs=[output])

    got = client_shm.get_contents_as_numpy(handle, np.object_, [3], offset=128)
    assert got.tolist() == strings.tolist()


def infer_body(inputs: list[dict[str, Any]], outputs: list[dict[str, Any]] | None = None) -> Any:
    body: dict[str, Any] = {"inputs": inputs}
    if outputs is not None:
        body["outputs"] = outputs
    return body


def shm_input(name: str, region: str, offset: int, size: int = 64) -> dict[str, Any]:
    parameters = {
        "shared_memory_region": region,
        "shared_memory_offset": offset,
        "shared_memory_byte_size": size,
    }
    return {"name": name, "datatype": "INT32", "shape": [16], "parameters": parameters}


def shm_output(name: str, region: str, offset: int, size: int) -> dict[str, Any]:
    parameters = {
        "shared_memory_region": region,
        "shared_memory_offset": offset,
        "shared_memory_byte_size": size,
    }
    return {"name": name, "parameters": parameters}


GOOD_INPUTS = [shm_input("INPUT0", "in", 0), shm_input("INPUT1", "in", 64)]


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (
            infer_body([shm_input("INPUT0", "nope", 0), shm_input("INPUT1", "in", 64)]),
            404,
            "Unable to find shared memory region: 'nope'",
        ),
        (
            infer_body([shm_input("INPUT0", "in", 128), shm_input("INPUT1", "in", 64)]),
            400,
            "Invalid offset for shared memory region: 'in'",
        ),
        (
            infer_body([shm_input("INPUT0", "in", 96), shm_input("INPUT1", "in", 64)]),
            400,
            "Invalid offset + byte size for shared memory region: 'in'",
        ),
        (
            infer_body([shm_input("INPUT0", "in", 0, 60), shm_input("INPUT1", "in", 64)]),
            400,
            "input byte size mismatch for input 'INPUT0' for model 'simple'. Expected 64, got 60",
        ),
        (
            infer_body(GOOD_INPUTS, [shm_output("OUTPUT0", "out", 120, 64)]),
            400,
            "Invalid offset + byte size for shared memory region: 'out'",
        ),
        (  # a size that wraps past Triton's unsigned bounds check: held against the tensor
            infer_body([shm_input("INPUT0", "in", 64, 2**64 - 1), shm_input("INPUT1", "in", 64)]),
            400,
            "input byte size mismatch for input 'INPUT0' for model 'simple'. Expected 64, got "
            "18446744073709551615",
        ),
        (  # the same for an output: refused (Triton writes past the region)
            infer_body(GOOD_INPUTS, [shm_output("OUTPUT0", "out", 100, 2**64 - 1)]),
            500,
            "shared memory region 'out' holds 28 bytes from offset 100, too few for output "
            "'OUTPUT0' (64 bytes)",
        ),
        (
            infer_body(GOOD_INPUTS, [shm_output("OUTPUT0", "out", 0, 8)]),
            500,
            "shared memory size specified with the request for output 'OUTPUT0' (8 bytes) "
            "should be at least 64 bytes to hold the results",
        ),
        (
            infer_body(
                GOOD_INPUTS,
                [{**shm_output("OUTPUT0", "out", 0, 64), "parameters": {
                    **shm_output("OUTPUT0", "out", 0, 64)["parameters"], "binary_data": True}}],
            ),
            400,
            "Output can't set both 'shared_memory_region' and 'binary_data'",
        ),
    ],
)  # fmt: skip
def test_http_infer_errors_are_tritons_and_write_nothing(
    shm_server: ServerProcess, regions: Regions, body: Any, status: int, message: str
) -> None:
    http = httpclient.InferenceServerClient(shm_server.url)
    _, out_handle = register_simple(http, regions)

    answer = httpx.post(f"{shm_server.base}/v2/models/simple/infer", json=body, timeout=30)

    assert answer.status_code == status
    assert message in answer.json()["error"]
    assert client_shm.get_contents_as_numpy(out_handle, np.int32, [32]).tolist() == [0] * 32
    # Whatever failed, nothing holds the regions any more.
    http.unregister_system_shared_memory()


def test_http_an_input_in_shared_memory_and_binary_is_refused(
    shm_server: ServerProcess, regions: Regions
) -> None:
    http = httpclient.InferenceServerClient(shm_server.url)
    register_simple(http, regions)
    both = shm_input("INPUT0", "in", 0)
    both["parameters"]["binary_data_size"] = 64
    header = httpx.Request("POST", "/", json=infer_body([both, GOOD_INPUTS[1]])).content
    answer = httpx.post(
        f"{shm_server.base}/v2/models/simple/infer",
        content=header + INPUT0.tobytes(),
        headers={"Inference-Header-Content-Length": str(len(header))},
        timeout=30,
    )
    assert answer.status_code == 400
    assert answer.json()["error"] == (
        "Input must set only one of the following fields: 'data', 'binary_data_size' in "
        "'parameters', 'shared_memory_region' in 'parameters'. But set 'binary_data_size' "
        "'shared_memory_region'"
    )


@pytest.mark.parametrize(
    ("call", "status", "message"),
    [
        (
            lambda t, key: t.register_system_shared_memory("in", key, 64),
            ("StatusCode.ALREADY_EXISTS", "400"),
            "shared memory region 'in' already in manager",
        ),
        (
            lambda t, key: t.register_system_shared_memory("x", "/tritonactor_no_such_key", 64),
            ("StatusCode.INTERNAL", "500"),
            "Unable to open shared memory region: '/tritonactor_no_such_key'",
        ),
        (
            lambda t, key: t.register_system_shared_memory("x", key, 64, offset=200),
            ("StatusCode.INVALID_ARGUMENT", "400"),
            "failed to register shared memory region 'x': invalid args",
        ),
        (
            lambda t, key: t.get_system_shared_memory_status("x"),
            ("StatusCode.NOT_FOUND", "404"),
            "Unable to find system shared memory region: 'x'",
        ),
        (
            lambda t, key: t.get_cuda_shared_memory_status("in"),
            ("StatusCode.NOT_FOUND", "404"),
            "The region named 'in' is registered as system shared memory, not CUDA shared memory",
        ),
        (
            lambda t, key: t.register_cuda_shared_memory("c", base64.b64encode(b"\0" * 64), 0, 64),
            ("StatusCode.INVALID_ARGUMENT", "400"),
            "failed to register CUDA shared memory region: 'c', GPUs not supported",
        ),
        (  # a name taken, whatever the kind, a GPU or none, as Triton answers it
            lambda t, key: t.register_cuda_shared_memory("in", base64.b64encode(b"\0" * 64), 0, 64),
            ("StatusCode.ALREADY_EXISTS", "400"),
            "shared memory region 'in' already in manager",
        ),
    ],
)
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_extension_errors_are_tritons_and_change_nothing(
    shm_server: ServerProcess,
    regions: Regions,
    protocol: str,
    call: Callable[[Any, str], object],
    status: tuple[str, str],
    message: str,
) -> None:
    triton = client(shm_server, protocol)
    key, _ = regions.create()
    triton.register_system_shared_memory("in", key, 128)

    with pytest.raises(InferenceServerException) as caught:
        call(triton, key)

    assert caught.value.status() == status[0 if protocol == "grpc" else 1]
    assert caught.value.message().startswith(message)
    listed = httpx.get(f"{shm_server.base}/v2/systemsharedmemory/status", timeout=10).json()
    assert listed == [{"name": "in", "key": key, "offset": 0, "byte_size": 128}]
    assert httpx.get(f"{shm_server.base}/v2/cudasharedmemory/status", timeout=10).json() == []


def test_http_routes_answer_as_tritons(shm_server: ServerProcess) -> None:
    base = shm_server.base
    for prefix, what in (("systemsharedmemory", "system"), ("cudasharedmemory", "cuda")):
        answer = httpx.post(f"{base}/v2/{prefix}/register", json={}, timeout=10)
        assert (answer.status_code, answer.json()) == (
            400,
            {"error": f"'region name' is necessary to register {what} shared memory region"},
        )
        for path, method in (("status", "POST"), ("region/r/unregister", "GET")):
            answer = httpx.request(method, f"{base}/v2/{prefix}/{path}", timeout=10)
            assert answer.status_code == 405
        # Unregistering what is not registered is no error, as in Triton.
        assert httpx.post(f"{base}/v2/{prefix}/region/r/unregister", timeout=10).status_code == 200
    answer = httpx.post(
        f"{base}/v2/systemsharedmemory/region/r/register", json={"key": "/k"}, timeout=10
    )
    assert (answer.status_code, answer.json()) == (
        400,
        {"error": "Shared memory register request has no 'byte_size' field"},
    )
    answer = httpx.post(
        f"{base}/v2/cudasharedmemory/region/r/register",
        json={"raw_handle": {"b64": "AAAA"}, "device_id": 0, "byte_size": 8},
        timeout=10,
    )
    assert (answer.status_code, answer.json()) == (
        400,
        {"error": "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t"},
    )
    extensions = httpx.get(f"{base}/v2", timeout=10).json()["extensions"]
    assert {"system_shared_memory", "cuda_shared_memory"} <= set(extensions)


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + PATIENCE_S
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_region_in_use_cannot_be_unregistered(
    shm_server: ServerProcess, regions: Regions, gate: Path, protocol: str
) -> None:
    gate.unlink(missing_ok=True)
    entered = Path(f"{gate}.entered")
    entered.unlink(missing_ok=True)
    module = module_of(protocol)
    triton = client(shm_server, protocol)
    _, out_handle = register_simple(triton, regions)
    key, _ = regions.create()
    triton.register_system_shared_memory("free", key, 64)
    tensor = module.InferInput("INPUT0", [16], "INT32")
    tensor.set_shared_memory("in", 64)
    output = module.InferRequestedOutput("OUTPUT0")
    output.set_shared_memory("out", 64)

    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(
            client(shm_server, protocol).infer, "gated", [tensor], outputs=[output]
        )
        wait_for(entered.exists, "the gated model never ran")
        for name in ("in", "out"):
            with pytest.raises(InferenceServerException) as caught:
                triton.unregister_system_shared_memory(name)
            assert caught.value.message() == (
                f"Cannot unregister shared memory region '{name}', it is currently in use."
            )
        with pytest.raises(InferenceServerException) as caught:
            triton.unregister_system_shared_memory()
        assert caught.value.message() == (
            "Failed to unregister the following system shared memory regions: in ,out ,"
        )
        status = httpx.get(f"{shm_server.base}/v2/systemsharedmemory/status", timeout=10).json()
        assert [region["name"] for region in status] == ["in", "out"]  # "free" went
        gate.touch()
        running.result(timeout=PATIENCE_S)

    got = client_shm.get_contents_as_numpy(out_handle, np.int32, [16])
    assert got.tolist() == INPUT0.tolist()
    triton.unregister_system_shared_memory()
    assert httpx.get(f"{shm_server.base}/v2/systemsharedmemory/status", timeout=10).json() == []


def test_the_shared_memory_category_can_be_restricted(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    server = start_server(
        [tmp_path / "models"],
        tmp_path,
        {
            "TRITONACTOR_HTTP_RESTRICTED_API": "shared-memory:shm-key=yes",
            "TRITONACTOR_GRPC_RESTRICTED_PROTOCOL": "shared-memory:shm-key=yes",
        },
    )
    try:
        url = f"{server.base}/v2/systemsharedmemory/status"
        answer = httpx.get(url, timeout=10)
        assert (answer.status_code, answer.json()) == (
            403,
            {"error": "This API is restricted, expecting header 'shm-key'"},
        )
        assert httpx.get(url, headers={"shm-key": "yes"}, timeout=10).json() == []
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        with pytest.raises(InferenceServerException) as caught:
            grpc.get_cuda_shared_memory_status()
        assert caught.value.status() == "StatusCode.UNAVAILABLE"
        assert caught.value.message() == (
            "This protocol is restricted, expecting header 'triton-grpc-protocol-shm-key'"
        )
        grpc.get_cuda_shared_memory_status(headers={"triton-grpc-protocol-shm-key": "yes"})
    finally:
        server.stop()


def mapped_keys(server: ServerProcess) -> list[str]:
    """The /dev/shm objects the server's processes have mapped (from /proc/<pid>/maps):
    hypercorn's and its worker's."""
    pids, keys = [server.process.pid], []
    while pids:
        pid = pids.pop()
        for task in Path(f"/proc/{pid}/task").iterdir():
            pids += [int(child) for child in (task / "children").read_text().split()]
        maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
        keys += [line.split()[-1] for line in maps if "/dev/shm/tritonactor_e2e_" in line]
    return keys


@pytest.mark.parametrize("model", ["simple", "batched", "gated"])
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_unregistered_region_is_unmapped_at_once(
    shm_server: ServerProcess, regions: Regions, gate: Path, protocol: str, model: str
) -> None:
    # Nothing may keep a view of the region once its request is answered: not the model
    # instance's mailbox loop holding its last message until the next one comes, nor a
    # scheduler its last batch, nor the python backend its last call.
    gate.touch()
    triton = client(shm_server, protocol)
    in_key, in_handle = regions.create()
    out_key, _ = regions.create()
    client_shm.set_shared_memory_region(in_handle, [INPUT0, INPUT1])
    triton.register_system_shared_memory("in", in_key, 128)
    triton.register_system_shared_memory("out", out_key, 128)
    inputs, outputs = simple_request(module_of(protocol))
    if model == "batched":
        for tensor in inputs:
            tensor.set_shape([1, 16])
    elif model == "gated":
        inputs, outputs = inputs[:1], outputs[:1]
    triton.infer(model, inputs, outputs=outputs)
    keys = {f"/dev/shm{in_key}", f"/dev/shm{out_key}"}
    assert keys <= set(mapped_keys(shm_server))

    triton.unregister_system_shared_memory()

    assert keys.isdisjoint(mapped_keys(shm_server))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_key_with_a_nul_is_a_key_that_does_not_open(
    shm_server: ServerProcess, protocol: str
) -> None:
    triton = client(shm_server, protocol)
    with pytest.raises(InferenceServerException) as caught:
        triton.register_system_shared_memory("nul", "/x\0y", 64)
    assert caught.value.status() == ("StatusCode.INTERNAL" if protocol == "grpc" else "500")
    # Triton's words, C strings: its JSON parser cuts the key at the NUL (HTTP), gRPC's
    # message is cut there.
    cut = "'/x" if protocol == "grpc" else "'/x'"
    assert caught.value.message() == f"Unable to open shared memory region: {cut}"
    assert httpx.get(f"{shm_server.base}/v2/systemsharedmemory/status", timeout=10).json() == []


def test_a_cancelled_grpc_call_holds_its_regions_until_its_request_is_over(
    shm_server: ServerProcess, regions: Regions, gate: Path
) -> None:
    # The client gives up; the request still runs in the model (it reads and writes the
    # regions): as in Triton, they stay in use until it is over.
    gate.unlink(missing_ok=True)
    entered, cancelled = Path(f"{gate}.entered"), Path(f"{gate}.cancelled")
    entered.unlink(missing_ok=True)
    cancelled.unlink(missing_ok=True)
    triton = grpcclient.InferenceServerClient(shm_server.grpc_url)
    register_simple(triton, regions)
    tensor = grpcclient.InferInput("INPUT0", [16], "INT32")
    tensor.set_shared_memory("in", 64)
    output = grpcclient.InferRequestedOutput("OUTPUT0")
    output.set_shared_memory("out", 64)
    call = triton.async_infer("gated", [tensor], lambda result, error: None, outputs=[output])
    wait_for(entered.exists, "the gated model never ran")

    call.cancel()
    wait_for(cancelled.exists, "the model never saw its request cancelled")

    for name in ("in", "out"):
        with pytest.raises(InferenceServerException) as caught:
            triton.unregister_system_shared_memory(name)
        assert caught.value.message() == (
            f"Cannot unregister shared memory region '{name}', it is currently in use."
        )
    gate.touch()

    def unregistered() -> bool:
        try:
            triton.unregister_system_shared_memory()
        except InferenceServerException:
            return False
        return True

    wait_for(unregistered, "the regions stayed in use after the request was over")


def test_a_grpc_call_past_its_deadline_ends_deadline_exceeded_and_cancels_its_request(
    shm_server: ServerProcess, gate: Path
) -> None:
    """The real client's deadline (grpc-timeout) on a unary call, which the gRPC front end's
    lane answers itself (frontends/grpc/direct.py): the client gets DEADLINE_EXCEEDED, the
    model sees its request cancelled, and the connection serves the next call."""
    gate.unlink(missing_ok=True)
    entered, cancelled = Path(f"{gate}.entered"), Path(f"{gate}.cancelled")
    entered.unlink(missing_ok=True)
    cancelled.unlink(missing_ok=True)
    triton = grpcclient.InferenceServerClient(shm_server.grpc_url)
    tensor = grpcclient.InferInput("INPUT0", [16], "INT32")
    data = np.arange(16, dtype=np.int32)
    tensor.set_data_from_numpy(data)
    answers: list[tuple[Any, Any]] = []
    triton.async_infer(
        "gated", [tensor], lambda result, error: answers.append((result, error)), client_timeout=3
    )
    wait_for(entered.exists, "the gated model never ran")
    wait_for(lambda: bool(answers), "the call never ended")
    [(result, error)] = answers
    assert result is None and error.status() == "StatusCode.DEADLINE_EXCEEDED"
    wait_for(cancelled.exists, "the model never saw its request cancelled")
    gate.touch()
    answer = triton.infer("gated", [tensor])
    assert np.array_equal(answer.as_numpy("OUTPUT0"), data)


@pytest.mark.parametrize("protocol", ["http", "grpc", "stream"])
def test_a_large_output_is_written_into_its_region(
    shm_server: ServerProcess, regions: Regions, protocol: str
) -> None:
    # More than lease.OFF_LOOP_BYTES: the copy into the region runs on a worker thread.
    count = 3 << 18  # 3 MiB of FP32
    data = np.arange(count, dtype=np.float32)
    module = grpcclient if protocol == "stream" else module_of(protocol)
    triton = (
        grpcclient.InferenceServerClient(shm_server.grpc_url)
        if protocol == "stream"
        else client(shm_server, protocol)
    )
    in_key, in_handle = regions.create(data.nbytes)
    out_key, out_handle = regions.create(data.nbytes)
    client_shm.set_shared_memory_region(in_handle, [data])
    triton.register_system_shared_memory("in", in_key, data.nbytes)
    triton.register_system_shared_memory("out", out_key, data.nbytes)
    tensor = module.InferInput("INPUT0", [count], "FP32")
    tensor.set_shared_memory("in", data.nbytes)
    output = module.InferRequestedOutput("OUTPUT0")
    output.set_shared_memory("out", data.nbytes)

    if protocol == "stream":
        answers: list[tuple[Any, Any]] = []
        triton.start_stream(callback=lambda result, error: answers.append((result, error)))
        triton.async_stream_infer("large", [tensor], outputs=[output])
        triton.stop_stream()  # waits for the answer
        assert [error for _, error in answers] == [None]
    else:
        triton.infer("large", [tensor], outputs=[output])

    got = client_shm.get_contents_as_numpy(out_handle, np.float32, [count])
    assert np.array_equal(got, data)
    triton.unregister_system_shared_memory()  # nothing holds the regions any more
