"""CUDA shared memory on a real GPU: regions made by tritonclient's `cuda_shared_memory`
utilities (cuda-python) in this process, opened by the server from their CUDA IPC handles.
Runs only where a CUDA device is visible and cuda-python can make a region."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import SIMPLE_CONFIG, write_config
from tests.onnx_models import add_sub_model
from tests.server_process import ServerProcess, start_server
from tritonactor.core.devices import gpu_count

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(gpu_count() == 0, reason="no CUDA device visible on this machine"),
]

cudashm: Any = pytest.importorskip(
    "tritonclient.utils.cuda_shared_memory",
    reason="tritonclient's CUDA shared-memory utilities need cuda-python",
)

INPUT0 = np.arange(16, dtype=np.int32)
INPUT1 = np.full(16, 2, dtype=np.int32)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("cudashm")
    repo = root / "models"
    add_sub_model(repo / "simple" / "1" / "model.onnx", batch=False)
    write_config(repo / "simple", SIMPLE_CONFIG.format(name="simple", max_batch_size=0))
    process = start_server([repo], root)
    yield process
    process.stop()


@pytest.fixture
def regions() -> Iterator[list[Any]]:
    made: list[Any] = []
    yield made
    for handle in made:
        cudashm.destroy_shared_memory_region(handle)


def make_region(regions: list[Any], size: int) -> Any:
    handle = cudashm.create_shared_memory_region(f"t{uuid.uuid4().hex[:8]}", size, 0)
    regions.append(handle)
    return handle


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_inputs_and_outputs_in_cuda_shared_memory(
    server: ServerProcess, regions: list[Any], protocol: str
) -> None:
    module: Any = httpclient if protocol == "http" else grpcclient
    triton = module.InferenceServerClient(server.url if protocol == "http" else server.grpc_url)
    inputs_region = make_region(regions, 128)
    outputs_region = make_region(regions, 128)
    cudashm.set_shared_memory_region(inputs_region, [INPUT0, INPUT1])
    triton.register_cuda_shared_memory("in", cudashm.get_raw_handle(inputs_region), 0, 128)
    triton.register_cuda_shared_memory("out", cudashm.get_raw_handle(outputs_region), 0, 128)
    try:
        status = triton.get_cuda_shared_memory_status()
        listed = status if protocol == "http" else list(status.regions.values())
        assert len(listed) == 2

        inputs, outputs = [], []
        for index, (inp, out) in enumerate((("INPUT0", "OUTPUT0"), ("INPUT1", "OUTPUT1"))):
            tensor = module.InferInput(inp, [16], "INT32")
            tensor.set_shared_memory("in", 64, offset=64 * index)
            inputs.append(tensor)
            output = module.InferRequestedOutput(out)
            output.set_shared_memory("out", 64, offset=64 * index)
            outputs.append(output)
        triton.infer("simple", inputs, outputs=outputs)

        got = cudashm.get_contents_as_numpy(outputs_region, np.int32, [2, 16])
        assert got.tolist() == [(INPUT0 + INPUT1).tolist(), (INPUT0 - INPUT1).tolist()]

        with pytest.raises(InferenceServerException, match="already in manager"):
            triton.register_cuda_shared_memory("in", cudashm.get_raw_handle(inputs_region), 0, 128)
        with pytest.raises(InferenceServerException, match="invalid args"):
            triton.register_cuda_shared_memory(
                "big", cudashm.get_raw_handle(inputs_region), 0, 1 << 40
            )
    finally:
        triton.unregister_cuda_shared_memory()
    status = triton.get_cuda_shared_memory_status()
    assert (status if protocol == "http" else list(status.regions)) == []
