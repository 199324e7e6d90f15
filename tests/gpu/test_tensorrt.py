"""The tensorrt backend on a real GPU: engines built here from the ONNX add/sub model with
TensorRT's ONNX parser, served by a real server, called over HTTP and gRPC. Runs only where
tensorrt imports and a CUDA device is visible: `bash tests/gpu/run.sh` on a CUDA machine."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.onnx_models import add_sub_model
from tests.server_process import ServerProcess, start_server
from tritonactor.core.devices import gpu_count


def _why_not_runnable() -> str | None:
    if gpu_count() == 0:
        return "no CUDA device visible on this machine"
    try:
        import tensorrt  # noqa: F401
    except Exception as exc:
        return f"tensorrt does not import here ({type(exc).__name__}: {exc}); install the gpu extra"
    try:
        import torch
    except Exception as exc:
        return f"torch does not import here ({type(exc).__name__}: {exc})"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} cannot use CUDA here"
    return None


_SKIP = _why_not_runnable()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_SKIP is not None, reason=_SKIP or "")]

INPUTS = ("INPUT0", "INPUT1")

CONFIG = """
name: "{name}"
platform: "tensorrt_plan"
max_batch_size: {max_batch_size}
input [
  {{ name: "INPUT0" data_type: TYPE_FP32 dims: {dims} }},
  {{ name: "INPUT1" data_type: TYPE_FP32 dims: {dims} }}
]
output [
  {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: {dims} }},
  {{ name: "OUTPUT1" data_type: TYPE_FP32 dims: {dims} }}
]
instance_group [ {{ kind: KIND_GPU count: 1 gpus: [ 0 ] }} ]
"""


def build_engine(onnx_path: Path, plan_path: Path, profiles: list[tuple[int, int, int]]) -> None:
    """Build `plan_path` from the ONNX model with one optimization profile per batch range."""
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)  # explicit batch: TensorRT 10's only mode
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(onnx_path.read_bytes()):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        raise RuntimeError(f"TensorRT's ONNX parser refused {onnx_path}: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, 1 << 28)
    for low, opt, high in profiles:
        profile = builder.create_optimization_profile()
        for name in INPUTS:
            profile.set_shape(name, (low, 16), (opt, 16), (high, 16))
        config.add_optimization_profile(profile)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise RuntimeError("TensorRT failed to build the engine")
    plan_path.parent.mkdir(parents=True, exist_ok=True)
    plan_path.write_bytes(bytes(serialized))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("tensorrt")
    onnx_path = add_sub_model(root / "onnx" / "model.onnx", datatype="FP32")
    repo = root / "models"
    one_profile = repo / "trt_config" / "1" / "model.plan"
    build_engine(onnx_path, one_profile, [(1, 4, 8)])
    two_profiles = repo / "trt_profiles" / "1" / "model.plan"
    build_engine(onnx_path, two_profiles, [(1, 4, 8), (9, 12, 16)])

    (repo / "trt_config" / "config.pbtxt").write_text(
        CONFIG.format(name="trt_config", max_batch_size=8, dims="[ 16 ]")
    )
    # No config: auto-complete reads the engine.
    (repo / "trt_auto" / "1").mkdir(parents=True)
    (repo / "trt_auto" / "1" / "model.plan").write_bytes(one_profile.read_bytes())
    # No batching in the config: the batch is an ordinary dynamic dim, bounded by the profile.
    (repo / "trt_nobatch" / "1").mkdir(parents=True)
    (repo / "trt_nobatch" / "1" / "model.plan").write_bytes(one_profile.read_bytes())
    (repo / "trt_nobatch" / "config.pbtxt").write_text(
        CONFIG.format(name="trt_nobatch", max_batch_size=0, dims="[ -1, 16 ]")
    )
    (repo / "trt_profiles" / "config.pbtxt").write_text(
        CONFIG.format(name="trt_profiles", max_batch_size=16, dims="[ 16 ]")
    )
    process = start_server([repo], root, timeout=180)
    try:
        yield process
    finally:
        process.stop()


def pair(batch: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed + batch)
    a = rng.standard_normal((batch, 16)).astype(np.float32)
    b = rng.standard_normal((batch, 16)).astype(np.float32)
    return a, b


def http_infer(server: ServerProcess, model: str, a: np.ndarray, b: np.ndarray) -> Any:
    client = httpclient.InferenceServerClient(server.url)
    try:
        inputs = [httpclient.InferInput(n, list(a.shape), "FP32") for n in INPUTS]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        return client.infer(model, inputs)
    finally:
        client.close()


def grpc_infer(server: ServerProcess, model: str, a: np.ndarray, b: np.ndarray) -> Any:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        inputs = [grpcclient.InferInput(n, list(a.shape), "FP32") for n in INPUTS]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        return client.infer(model, inputs)
    finally:
        client.close()


def assert_add_sub(result: Any, a: np.ndarray, b: np.ndarray) -> None:
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("model", ["trt_config", "trt_auto", "trt_nobatch"])
@pytest.mark.parametrize("batch", [1, 4, 8])
def test_http_infer(server: ServerProcess, model: str, batch: int) -> None:
    a, b = pair(batch)
    assert_add_sub(http_infer(server, model, a, b), a, b)


@pytest.mark.parametrize("model", ["trt_config", "trt_auto"])
def test_grpc_infer(server: ServerProcess, model: str) -> None:
    a, b = pair(3, seed=1)
    assert_add_sub(grpc_infer(server, model, a, b), a, b)


def test_auto_complete_reads_the_engine(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.url)
    try:
        config = client.get_model_config("trt_auto")
    finally:
        client.close()
    assert config["platform"] == "tensorrt_plan"
    assert config["backend"] == "tensorrt"
    assert config["max_batch_size"] == 8  # profile 0's largest batch
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [
        ("INPUT0", "TYPE_FP32", [16]),
        ("INPUT1", "TYPE_FP32", [16]),
    ]
    assert sorted(t["name"] for t in config["output"]) == ["OUTPUT0", "OUTPUT1"]


@pytest.mark.parametrize("model", ["trt_config", "trt_auto"])
def test_batch_nine_is_rejected(server: ServerProcess, model: str) -> None:
    a, b = pair(9)
    with pytest.raises(InferenceServerException, match="batch-size must be <= 8"):
        http_infer(server, model, a, b)
    with pytest.raises(InferenceServerException, match="batch-size must be <= 8"):
        grpc_infer(server, model, a, b)


def test_a_shape_outside_every_profile_fails_that_request(server: ServerProcess) -> None:
    a, b = pair(9)
    with pytest.raises(InferenceServerException, match="fit no optimization profile"):
        http_infer(server, "trt_nobatch", a, b)
    a, b = pair(2)  # the instance still serves
    assert_add_sub(http_infer(server, "trt_nobatch", a, b), a, b)


def test_profiles_switch_with_the_batch(server: ServerProcess) -> None:
    for batch in (12, 2, 16, 9, 8, 1):  # profile 1, 0, 1, 1, 0, 0
        a, b = pair(batch, seed=2)
        assert_add_sub(http_infer(server, "trt_profiles", a, b), a, b)
