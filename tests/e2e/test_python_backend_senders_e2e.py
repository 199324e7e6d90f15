"""The python backend behaving as Triton's, through a real server and tritonclient: answers sent
through response senders (during execute or after it returned, decoupled or not), concurrent
decoupled `async def execute`, decoupled BLS, rescheduling, error codes, a clean argv, the
requested outputs a model sees, and `--backend-config=python,...`."""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.server_process import ServerProcess, start_server
from tritonactor.backends.python.ipc import SHM_DIR

pytestmark = pytest.mark.e2e

MODELS = Path(__file__).resolve().parent.parent / "python_models"
SERVED = (
    "late_answer",
    "late_answer_async",
    "stream_after",
    "async_handshake",
    "bls_stream",
    "argv_unittest",
    "error_code",
    "reschedule",
    "iterate",
    "introspect",
)
PATIENCE_S = 60
BACKEND_CONFIG = '["python,shm-default-byte-size=65536","python,stub-timeout-seconds=90"]'


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("python_senders_repo")
    for name in SERVED:
        shutil.copytree(MODELS / name, repo / name)
    # The same model without `iterative_sequence`: it may not ask for a rerun.
    plain = repo / "reschedule_plain"
    shutil.copytree(MODELS / "reschedule", plain)
    config = (plain / "config.pbtxt").read_text()
    config = config.replace('"reschedule"', '"reschedule_plain"')
    config = config.replace("sequence_batching { iterative_sequence: true }", "")
    (plain / "config.pbtxt").write_text(config)
    process = start_server(
        [repo],
        tmp_path_factory.mktemp("python_senders_server"),
        extra_env={"TRITONACTOR_BACKEND_CONFIG": BACKEND_CONFIG},
    )
    yield process
    process.stop()


@pytest.fixture
def http(server: ServerProcess) -> httpclient.InferenceServerClient:
    # Room for a request held by the model while the next one goes through.
    return httpclient.InferenceServerClient(server.url, concurrency=4, network_timeout=PATIENCE_S)


@pytest.fixture
def grpc(server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    yield client
    client.close()


def http_inputs(**tensors: Any) -> list[httpclient.InferInput]:
    return [_input(httpclient, name, value) for name, value in tensors.items()]


def grpc_inputs(**tensors: Any) -> list[grpcclient.InferInput]:
    return [_input(grpcclient, name, value) for name, value in tensors.items()]


def _input(module: Any, name: str, value: Any) -> Any:
    data = (
        np.array([value.encode()], dtype=np.object_)
        if isinstance(value, str)
        else np.array([value], dtype=np.int32)
    )
    tensor = module.InferInput(
        name, list(data.shape), "BYTES" if isinstance(value, str) else "INT32"
    )
    tensor.set_data_from_numpy(data)
    return tensor


def executions(http: httpclient.InferenceServerClient, model: str) -> int:
    """Requests of `model` whose execute is over (a deferred one counts in its batch when its
    execute returns, before its answer)."""
    stats = http.get_inference_statistics(model)["model_stats"][0]
    return int(stats["inference_count"])


def wait_for_execution(http: httpclient.InferenceServerClient, model: str, count: int) -> None:
    """Wait until `model` executed `count` requests in all: a parked request is in the model
    (the requests of a test must reach it in order, whichever connection they take)."""
    deadline = time.monotonic() + PATIENCE_S
    while executions(http, model) < count:
        assert time.monotonic() < deadline, f"{model} did not execute request {count}"
        time.sleep(0.01)


class Stream:
    """A gRPC stream's answers in a queue."""

    def __init__(self, client: grpcclient.InferenceServerClient) -> None:
        self.client = client
        self.answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
        client.start_stream(callback=lambda result, error: self.answers.put((result, error)))

    def next(self) -> tuple[Any, Any]:
        return self.answers.get(timeout=PATIENCE_S)

    def close(self) -> None:
        self.client.stop_stream()


@pytest.fixture
def stream(grpc: grpcclient.InferenceServerClient) -> Iterator[Stream]:
    opened = Stream(grpc)
    yield opened
    opened.close()


# -- not decoupled, answering through the response sender ---------------------------------------


@pytest.mark.parametrize("model", ["late_answer", "late_answer_async"])
def test_answer_sent_after_execute_returned_over_http(
    http: httpclient.InferenceServerClient, model: str
) -> None:
    executed = executions(http, model)
    parked = http.async_infer(model, http_inputs(MODE="park", VALUE=11))
    wait_for_execution(http, model, executed + 1)
    # The instance takes this next request while the first one's answer is outstanding.
    released = http.infer(model, http_inputs(MODE="release", VALUE=12))
    assert released.as_numpy("OUT").tolist() == [12]
    assert parked.get_result(timeout=PATIENCE_S).as_numpy("OUT").tolist() == [11]


def test_answer_sent_after_execute_returned_over_grpc(
    http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient
) -> None:
    answers: Future[Any] = Future()
    executed = executions(http, "late_answer")
    grpc.async_infer(
        "late_answer",
        grpc_inputs(MODE="park", VALUE=21),
        callback=lambda result, error: answers.set_result((result, error)),
    )
    wait_for_execution(http, "late_answer", executed + 1)
    released = grpc.infer("late_answer", grpc_inputs(MODE="release", VALUE=22))
    assert released.as_numpy("OUT").tolist() == [22]
    result, error = answers.result(timeout=PATIENCE_S)
    assert error is None and result.as_numpy("OUT").tolist() == [21]


def test_answer_sent_during_execute_and_refused_extras(
    http: httpclient.InferenceServerClient,
) -> None:
    before = http.infer("late_answer", http_inputs(MODE="before", VALUE=3))
    assert before.as_numpy("OUT").tolist() == [3]
    # A second response is refused in the model; the first one stands.
    twice = http.infer("late_answer", http_inputs(MODE="twice", VALUE=4))
    assert twice.as_numpy("OUT").tolist() == [4]
    with pytest.raises(InferenceServerException) as refused:
        http.infer("late_answer", http_inputs(MODE="final_first", VALUE=5))
    assert "Non-decoupled model cannot send complete final before sending a response" in (
        refused.value.message()
    )


def test_request_the_model_forgot_fails_instead_of_hanging(
    http: httpclient.InferenceServerClient,
) -> None:
    with pytest.raises(InferenceServerException) as failed:
        http.infer("late_answer", http_inputs(MODE="drop", VALUE=0))
    assert "released a request without finishing it" in failed.value.message()


# -- decoupled ------------------------------------------------------------------------------------


def test_decoupled_responses_after_execute_returned(stream: Stream) -> None:
    stream.client.async_stream_infer(
        "stream_after", grpc_inputs(MODE="park", COUNT=2), request_id="parked"
    )
    stream.client.async_stream_infer(
        "stream_after", grpc_inputs(MODE="release", COUNT=7), request_id="release"
    )
    seen: dict[str, list[int]] = {"parked": [], "release": []}
    while len(seen["parked"]) < 2 or len(seen["release"]) < 1:
        result, error = stream.next()
        assert error is None, error
        response = result.get_response()
        seen[response.id].append(result.as_numpy("OUT").tolist()[0])
    assert seen == {"parked": [0, 1], "release": [7]}


def test_decoupled_execute_returning_responses_is_an_error(stream: Stream) -> None:
    stream.client.async_stream_infer("stream_after", grpc_inputs(MODE="return", COUNT=1))
    _, error = stream.next()
    assert error is not None
    assert (
        "Python model 'stream_after_0' is using the decoupled mode and the execute function "
        "must return None." in error.message()
    )


def backend_failures(server: ServerProcess, model: str) -> int:
    """`nv_inference_request_failure{reason="BACKEND"}` of `model` (0 before it has one)."""
    port = server.env["TRITONACTOR_METRICS_PORT"]
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=PATIENCE_S).text
    labels = (f'model="{model}"', 'reason="BACKEND"')
    for line in text.splitlines():
        if line.startswith("nv_inference_request_failure{") and all(x in line for x in labels):
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


@pytest.mark.parametrize("mode", ["raise", "return"])
def test_a_decoupled_execute_that_fails_counts_as_a_failure(
    stream: Stream, http: httpclient.InferenceServerClient, server: ServerProcess, mode: str
) -> None:
    """As Triton 2.51 counts it (checked against it): a failed request, a BACKEND failure in
    the metrics (it counted as a success)."""

    def counts() -> tuple[int, int, int]:
        stats = http.get_inference_statistics("stream_after")["model_stats"][0]
        inference = stats["inference_stats"]
        failures = backend_failures(server, "stream_after")
        return int(inference["success"]["count"]), int(inference["fail"]["count"]), failures

    success, fail, failures = counts()
    stream.client.async_stream_infer("stream_after", grpc_inputs(MODE=mode, COUNT=1))
    _, error = stream.next()
    assert error is not None
    assert counts() == (success, fail + 1, failures + 1)


def test_decoupled_async_executes_run_concurrently(stream: Stream) -> None:
    for role in ("a", "b"):
        stream.client.async_stream_infer("async_handshake", grpc_inputs(ROLE=role))
    for _ in range(2):
        result, error = stream.next()
        assert error is None, error
        assert result.as_numpy("PARTNER_SEEN").tolist() == [True]


def test_decoupled_bls_iterates_every_response(http: httpclient.InferenceServerClient) -> None:
    result = http.infer("bls_stream", http_inputs(MODE="count", COUNT=3))
    report = json.loads(result.as_numpy("REPORT")[0])
    # Three responses, then Triton's empty final response for the bare final flag.
    expected = [{"out": [0]}, {"out": [1]}, {"out": [2]}, {"out": None}]
    for way in ("exec", "exec_again", "async_for", "async_iter"):
        assert report[way] == expected, way
    [refused] = report["not_decoupled"]
    assert "doesn't support models using the decoupled transaction policy" in refused["error"]
    # A final flag that comes with the last response: no empty response after it.
    result = http.infer("bls_stream", http_inputs(MODE="last", COUNT=2))
    report = json.loads(result.as_numpy("REPORT")[0])
    assert report["exec"] == [{"out": [0]}, {"out": [1]}]


# -- rescheduling ---------------------------------------------------------------------------------


def test_rescheduled_request_runs_again(http: httpclient.InferenceServerClient) -> None:
    result = http.infer("reschedule", http_inputs(MODE="ok", VALUE=8), request_id="e2e-1")
    assert result.as_numpy("OUT").tolist() == [8]
    assert result.as_numpy("RUNS").tolist() == [2]


def test_decoupled_iterative_model_answers_from_each_run(stream: Stream) -> None:
    stream.client.async_stream_infer("iterate", grpc_inputs(COUNT=3), request_id="it-e2e")
    left = []
    for _ in range(3):
        result, error = stream.next()
        assert error is None, error
        left.append(result.as_numpy("LEFT").tolist()[0])
    assert left == [2, 1, 0]


def test_reschedule_without_iterative_sequence_is_a_clear_error(
    http: httpclient.InferenceServerClient,
) -> None:
    with pytest.raises(InferenceServerException) as failed:
        http.infer("reschedule_plain", http_inputs(MODE="ok", VALUE=1), request_id="p")
    assert "not configured to handle such a flag" in failed.value.message()
    # Nothing changed: the model serves the next request.
    with pytest.raises(InferenceServerException) as wrong:
        http.infer("reschedule", http_inputs(MODE="wrong", VALUE=1), request_id="w")
    assert "Expected a None object in the execute function return list" in wrong.value.message()


# -- codes, argv, requested outputs, settings -----------------------------------------------------


def test_unknown_error_code_reaches_grpc_as_unknown(
    grpc: grpcclient.InferenceServerClient, http: httpclient.InferenceServerClient
) -> None:
    with pytest.raises(InferenceServerException) as failed:
        grpc.infer("error_code", grpc_inputs(CODE="UNKNOWN"))
    assert failed.value.status() == "StatusCode.UNKNOWN"
    assert failed.value.message() == "failed with UNKNOWN"
    with pytest.raises(InferenceServerException) as invalid:
        grpc.infer("error_code", grpc_inputs(CODE="INVALID_ARG"))
    assert invalid.value.status() == "StatusCode.INVALID_ARGUMENT"
    # Over HTTP Triton answers UNKNOWN with 400 (it has no status of its own).
    with pytest.raises(InferenceServerException) as over_http:
        http.infer("error_code", http_inputs(CODE="UNKNOWN"))
    assert over_http.value.status() == "400"
    assert over_http.value.message() == "failed with UNKNOWN"


def test_model_runs_unittest_main_with_a_clean_argv(
    http: httpclient.InferenceServerClient,
) -> None:
    result = http.infer("argv_unittest", [])
    assert result.as_numpy("ARGV").tolist() == [b""]
    assert result.as_numpy("PASSED").tolist() == [True]


def test_request_naming_no_outputs_shows_all_to_the_model(
    http: httpclient.InferenceServerClient,
) -> None:
    data = np.array([1.0], dtype=np.float32)
    tensor = httpclient.InferInput("INPUT0", [1], "FP32")
    tensor.set_data_from_numpy(data)
    result = http.infer("introspect", [tensor])
    seen = json.loads(result.as_numpy("REQUEST")[0])
    assert seen["requested_output_names"] == ["ARGS", "DLPACK", "REQUEST"]


def test_a_model_finds_its_version_folder(
    server: ServerProcess, http: httpclient.InferenceServerClient
) -> None:
    """`pb_utils.get_model_dir()`: the folder of the version, which holds model.py. (And a
    request's parameters as text keep their UTF-8, as Triton writes them.)"""
    tensor = httpclient.InferInput("INPUT0", [1], "FP32")
    tensor.set_data_from_numpy(np.array([1.0], dtype=np.float32))
    result = http.infer("introspect", [tensor], parameters={"u": "h\u00e9"})
    seen = json.loads(result.as_numpy("REQUEST")[0])
    repository = Path(server.env["TRITONACTOR_MODEL_REPOSITORY"])
    assert seen["model_dir"] == str(repository / "introspect" / "1")
    assert seen["parameters_text"] == '{"u":"h\u00e9"}'


def test_backend_config_settings_are_taken(server: ServerProcess) -> None:
    assert "shm-default-byte-size=65536" in server.log()


def test_backend_config_malformed_setting_fails_the_load(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(MODELS / "error_code", repo / "error_code")
    # The model cannot load, so the server stops (--exit-on-error), saying why.
    with pytest.raises(RuntimeError) as stopped:
        start_server(
            [repo],
            tmp_path,
            extra_env={"TRITONACTOR_BACKEND_CONFIG": '["python,stub-timeout-seconds=soon"]'},
        )
    assert "python backend setting stub-timeout-seconds must be a positive integer, not 'soon'" in (
        str(stopped.value)
    )


# -- model control from a model (explicit mode) ---------------------------------------------------


@pytest.fixture(scope="module")
def explicit_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("python_control_repo")
    for name in (
        "model_loader",
        "error_code",
        "init_loader",
        "finalize_answers",
        "introspect",
        "stream_after",
    ):
        shutil.copytree(MODELS / name, repo / name)
    # A second model loader, to unload itself.
    shutil.copytree(MODELS / "model_loader", repo / "self_unloader")
    config = repo / "self_unloader" / "config.pbtxt"
    config.write_text(config.read_text().replace('"model_loader"', '"self_unloader"'))
    process = start_server(
        [repo],
        tmp_path_factory.mktemp("python_control_server"),
        extra_env={
            "TRITONACTOR_MODEL_CONTROL_MODE": "explicit",
            "TRITONACTOR_LOAD_MODEL": "model_loader,self_unloader,finalize_answers",
        },
    )
    pids = process_tree(process.process.pid)
    yield process
    process.stop()
    # Nothing of the server's python models is left in shared memory.
    assert shm_files_of(pids) == []


def shm_files_of(pids: list[int]) -> list[str]:
    """The python-backend shared-memory files of the server processes `pids` (hypercorn's
    parent, its worker and, on two cores or more, the engine: the instances are the engine's,
    or the worker's when it is the whole server)."""
    prefixes = tuple(f"tritonactor-py-{pid}-" for pid in pids)
    return sorted(name for name in os.listdir(SHM_DIR) if name.startswith(prefixes))


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants."""
    tree = [pid]
    for child in children_of(pid):
        tree += process_tree(child)
    return tree


def control(
    server: ServerProcess, action: str, target: str = "error_code", model: str = "model_loader"
) -> dict[str, Any]:
    client = httpclient.InferenceServerClient(server.url, network_timeout=PATIENCE_S)
    result = client.infer(model, http_inputs(ACTION=action, TARGET=target))
    return json.loads(result.as_numpy("REPORT")[0])


def test_a_model_unloads_itself_without_waiting_for_its_own_request(
    explicit_server: ServerProcess,
) -> None:
    # Triton's unload returns at once; waiting for the model's requests to finish would wait
    # for the very request that asks (it used to hang).
    report = control(explicit_server, "unload", target="self_unloader", model="self_unloader")
    assert report == {"error": None, "ready": False}
    deadline = time.monotonic() + PATIENCE_S
    while state_of(explicit_server, "self_unloader") != "UNAVAILABLE":
        assert time.monotonic() < deadline, "self_unloader was not unloaded"
        time.sleep(0.05)


def state_of(server: ServerProcess, name: str) -> str | None:
    client = httpclient.InferenceServerClient(server.url)
    entries = [e for e in client.get_model_repository_index() if e["name"] == name]
    return entries[0].get("state") if entries else None


def test_a_model_loads_another_from_initialize(explicit_server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(explicit_server.url, network_timeout=PATIENCE_S)
    client.load_model("init_loader")
    result = client.infer("init_loader", http_inputs(TARGET="introspect"))
    report = json.loads(result.as_numpy("REPORT")[0])
    assert report["error"] is None and report["ready_after"] is True


def test_answers_a_model_sends_from_finalize_reach_their_clients(
    explicit_server: ServerProcess,
) -> None:
    grpc = grpcclient.InferenceServerClient(explicit_server.grpc_url)
    answers: queue.Queue[Any] = queue.Queue()
    grpc.start_stream(lambda result, error: answers.put((result, error)))
    count = 40
    for value in range(count):
        grpc.async_stream_infer("finalize_answers", grpc_inputs(IN=value))
    http = httpclient.InferenceServerClient(explicit_server.url)
    # Every request reached the model (parked), then the model is unloaded: it answers them all
    # from finalize, as it exits.
    wait_for_execution(http, "finalize_answers", count)
    http.unload_model("finalize_answers")
    got = []
    for _ in range(count):
        result, error = answers.get(timeout=PATIENCE_S)
        assert error is None, error
        got.append(int(result.as_numpy("OUT")[0]))
    grpc.stop_stream()
    grpc.close()
    assert sorted(got) == list(range(count))


def test_an_unload_waits_for_a_decoupled_requests_last_response(
    explicit_server: ServerProcess, tmp_path: Path
) -> None:
    """As Triton 2.51 does (checked against it): a decoupled model being unloaded finishes
    the requests it holds, every response and the final flag, after its execute returned;
    it is out of routing meanwhile. (It was stopped once execute returned, its client told
    the instance was finalized.)"""
    http = httpclient.InferenceServerClient(explicit_server.url, network_timeout=PATIENCE_S)
    http.load_model("stream_after")
    gate = tmp_path / "gate"
    grpc = grpcclient.InferenceServerClient(explicit_server.grpc_url)
    answers: queue.Queue[Any] = queue.Queue()
    grpc.start_stream(lambda result, error: answers.put((result, error)))
    grpc.async_stream_infer(
        "stream_after",
        grpc_inputs(MODE=f"gated:{gate}", COUNT=4),
        enable_empty_final_response=True,
    )
    result, error = answers.get(timeout=PATIENCE_S)
    assert error is None and int(result.as_numpy("OUT")[0]) == 0
    with ThreadPoolExecutor(1) as pool:
        unloading = pool.submit(
            httpx.post,
            f"{explicit_server.base}/v2/repository/models/stream_after/unload",
            timeout=PATIENCE_S,
        )
        deadline = time.monotonic() + PATIENCE_S
        while http.is_model_ready("stream_after"):  # out of routing at once
            assert time.monotonic() < deadline, "stream_after did not leave"
            time.sleep(0.01)
        assert not unloading.done()  # the request holds it
        gate.touch()
        got, final = [], False
        while not final:
            result, error = answers.get(timeout=PATIENCE_S)
            assert error is None, error
            response = result.get_response()
            final = response.parameters["triton_final_response"].bool_param
            if response.outputs:
                got.append(int(result.as_numpy("OUT")[0]))
        assert unloading.result(timeout=PATIENCE_S).status_code == 200
    grpc.stop_stream()
    grpc.close()
    assert got == [1, 2, 3]
    assert state_of(explicit_server, "stream_after") == "UNAVAILABLE"


def test_model_loads_and_unloads_another_model(explicit_server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(explicit_server.url)
    assert control(explicit_server, "ready") == {"error": None, "ready": False}
    assert control(explicit_server, "load") == {"error": None, "ready": True}
    assert client.is_model_ready("error_code")
    assert control(explicit_server, "unload") == {"error": None, "ready": False}
    assert not client.is_model_ready("error_code")
    # With a config of its own, as the repository API's load takes it.
    assert control(explicit_server, "load_config") == {"error": None, "ready": True}
    config = client.get_model_config("error_code")
    assert config["parameters"]["loaded_by"]["string_value"] == "bls"


def test_model_loading_an_unknown_model_gets_the_servers_error(
    explicit_server: ServerProcess,
) -> None:
    report = control(explicit_server, "load", target="no_such_model")
    assert report["ready"] is False
    assert "no_such_model" in report["error"]


def test_model_control_is_refused_outside_explicit_mode(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(MODELS / "model_loader", repo / "model_loader")
    process = start_server([repo], tmp_path)
    try:
        report = control(process, "unload", target="model_loader")
        assert "explicit model load / unload is not allowed" in report["error"]
        assert report["ready"] is True
    finally:
        process.stop()


def children_of(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry))
    return found


def test_a_killed_servers_model_processes_clear_its_shared_memory(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(MODELS / "introspect", repo / "introspect")
    process = start_server([repo], tmp_path)
    try:
        client = httpclient.InferenceServerClient(process.url)
        # Past the few KiB that travel inside the messages: the instance's arenas now exist.
        data = httpclient.InferInput("INPUT0", [4096], "FP32")
        data.set_data_from_numpy(np.arange(4096, dtype=np.float32))
        client.infer("introspect", [data])
        tree = process_tree(process.process.pid)
        assert shm_files_of(tree)
        stubs = [pid for pid in tree if is_stub(pid)]
        server = [pid for pid in tree if pid not in stubs]
        assert stubs and server
    finally:
        # The server's processes die at once: no finalize, no cleanup by the server. (Not
        # multiprocessing's resource tracker: it owns nothing of ours, and once the processes it
        # serves are gone it unlinks the semaphores hypercorn's workers shared, which would
        # otherwise stay in /dev/shm after the test.)
        trackers = []
        for pid in process_tree(process.process.pid):
            if is_resource_tracker(pid):
                trackers.append(pid)
            elif not is_stub(pid):
                os.kill(pid, signal.SIGKILL)
        process.process.wait()
    # Each stub notices its server is gone, clears the instance's files and exits.
    deadline = time.monotonic() + PATIENCE_S
    while any(os.path.exists(f"/proc/{pid}") for pid in stubs + trackers):
        assert time.monotonic() < deadline, "a model process outlived its server"
        time.sleep(0.05)
    assert shm_files_of(tree) == []


def is_stub(pid: int) -> bool:
    return _runs(pid, b"tritonactor.backends.python.stub")


def is_resource_tracker(pid: int) -> bool:
    return _runs(pid, b"multiprocessing.resource_tracker")


def _runs(pid: int, module: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return module in cmdline.read()
    except OSError:
        return False
