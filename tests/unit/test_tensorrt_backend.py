"""The tensorrt backend without TensorRT or a GPU: the load error such a machine gives, and the
pure rules (types, auto-complete, load checks, profile choice) over a described engine."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.onnx_models import add_sub_model
from tests.server_process import start_server
from tritonactor._proto.inference import DataType, ModelConfig
from tritonactor.backends.base import ModelContext
from tritonactor.backends.registry import BackendRegistry
from tritonactor.backends.tensorrt import (
    EngineSignature,
    EngineTensor,
    TensorRTBackend,
    complete_config,
    config_type,
    select_profile,
    validate_config,
)
from tritonactor.config.model_config import parse_pbtxt
from tritonactor.core.errors import ErrorCode, TritonError

NEEDS = "the tensorrt backend needs an NVIDIA GPU and the tensorrt package"


def add_sub_engine(
    dtype: str = "FLOAT",
    profiles: tuple[tuple[int, int, int], ...] = ((1, 4, 8),),
    batch: bool = True,
) -> EngineSignature:
    """What TensorRT reports for the add/sub model built with batch ranges `profiles`."""
    shape = (-1, 16) if batch else (16,)
    ranges = tuple(
        ((low, 16), (opt, 16), (high, 16)) if batch else ((16,), (16,), (16,))
        for low, opt, high in profiles
    )
    return EngineSignature.of(
        [
            EngineTensor("INPUT0", "INPUT", dtype, shape, ranges),
            EngineTensor("INPUT1", "INPUT", dtype, shape, ranges),
            EngineTensor("OUTPUT0", "OUTPUT", dtype, shape),
            EngineTensor("OUTPUT1", "OUTPUT", dtype, shape),
        ],
        num_profiles=len(profiles),
    )


def config_of(text: str) -> ModelConfig:
    return parse_pbtxt(text)


def invalid(config: ModelConfig, signature: EngineSignature) -> TritonError:
    with pytest.raises(TritonError) as caught:
        validate_config(config, config.name, signature)
    return caught.value


# ---------------------------------------------------------------------------------------------
# Without TensorRT or a GPU


@pytest.fixture
def no_tensorrt(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # `import tensorrt` raises ImportError


def plan_context(tmp_path: Path) -> ModelContext:
    vdir = tmp_path / "plan" / "1"
    vdir.mkdir(parents=True)
    (vdir / "model.plan").write_bytes(b"not an engine")
    config = config_of('name: "plan" platform: "tensorrt_plan"')
    return ModelContext("plan", 1, config, vdir.parent, vdir, vdir / "model.plan")


@pytest.mark.usefixtures("no_tensorrt")
def test_load_without_gpu_or_tensorrt_is_unavailable_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("tritonactor.backends.tensorrt.runtime.gpu_count", lambda: 0)
    context = plan_context(tmp_path)
    backend = TensorRTBackend()
    for attempt in (
        lambda: backend.load_model(context),
        lambda: backend.auto_complete_config(context.config, context.version_dir),
    ):
        with pytest.raises(TritonError) as caught:
            attempt()
        assert caught.value.code is ErrorCode.UNAVAILABLE
        assert caught.value.message == (
            "model 'plan': the tensorrt backend needs an NVIDIA GPU and the tensorrt package "
            "(pip install 'tritonactor[gpu]'); this machine has no CUDA device and the "
            "tensorrt package is not installed"
        )


@pytest.mark.usefixtures("no_tensorrt")
def test_a_gpu_without_tensorrt_names_the_missing_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("tritonactor.backends.tensorrt.runtime.gpu_count", lambda: 1)
    with pytest.raises(TritonError) as caught:
        TensorRTBackend().load_model(plan_context(tmp_path))
    assert caught.value.code is ErrorCode.UNAVAILABLE
    assert caught.value.message.endswith("; the tensorrt package is not installed")


def test_registry_resolves_the_tensorrt_plan_platform(tmp_path: Path) -> None:
    registry = BackendRegistry()
    config = config_of('name: "m" platform: "tensorrt_plan"')
    assert registry.backend_name(config, tmp_path, [1]) == "tensorrt"
    backend = registry.get("tensorrt")
    assert isinstance(backend, TensorRTBackend)
    assert backend.platforms == ("tensorrt_plan",)
    assert backend.default_model_filename == "model.plan"


@pytest.mark.e2e
def test_a_plan_model_is_unavailable_while_others_serve(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    add_sub_model(repo / "simple" / "1" / "model.onnx", datatype="FP32")
    (repo / "engine" / "1").mkdir(parents=True)
    (repo / "engine" / "1" / "model.plan").write_bytes(b"not an engine")
    # No visible CUDA device, whatever this machine has: the same reason everywhere.
    server = start_server(
        [repo],
        tmp_path,
        {"CUDA_VISIBLE_DEVICES": "", "TRITONACTOR_EXIT_ON_ERROR": "false"},
        wait_ready=False,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            entries = httpx.post(f"{server.base}/v2/repository/index", json={}).json()
            states = {e["name"]: e for e in entries if e.get("state")}
            if len(states) == 2 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert states["simple"]["state"] == "READY"
        assert states["engine"]["state"] == "UNAVAILABLE"
        assert NEEDS in states["engine"]["reason"]
        assert "this machine has no CUDA device" in states["engine"]["reason"]

        client = httpclient.InferenceServerClient(server.url)
        a = np.arange(16, dtype=np.float32).reshape(1, 16)
        inputs = [httpclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(a)
        np.testing.assert_array_equal(client.infer("simple", inputs).as_numpy("OUTPUT0"), a + a)
        client.close()
    finally:
        server.stop()


# ---------------------------------------------------------------------------------------------
# Data types


def test_tensorrt_types_map_to_triton_types() -> None:
    assert config_type("FLOAT") is DataType.TYPE_FP32
    assert config_type("HALF") is DataType.TYPE_FP16
    assert config_type("BF16") is DataType.TYPE_BF16
    assert config_type("INT8") is DataType.TYPE_INT8
    assert config_type("INT32") is DataType.TYPE_INT32
    assert config_type("INT64") is DataType.TYPE_INT64
    assert config_type("BOOL") is DataType.TYPE_BOOL
    assert config_type("UINT8") is DataType.TYPE_UINT8
    for unmapped in ("FP8", "INT4", "FP4"):
        assert config_type(unmapped) is None


# ---------------------------------------------------------------------------------------------
# Auto-complete


def test_auto_complete_takes_max_batch_size_from_profile_zero() -> None:
    signature = add_sub_engine(profiles=((1, 4, 8), (8, 16, 32)))
    completed = complete_config(config_of('name: "m"'), signature)
    assert completed.max_batch_size == 8
    assert completed.dynamic_batching is not None
    assert completed.backend == "tensorrt"
    assert completed.platform == "tensorrt_plan"
    assert [(t.name, t.data_type, list(t.dims)) for t in completed.input] == [
        ("INPUT0", DataType.TYPE_FP32, [16]),
        ("INPUT1", DataType.TYPE_FP32, [16]),
    ]
    assert [(t.name, list(t.dims)) for t in completed.output] == [
        ("OUTPUT0", [16]),
        ("OUTPUT1", [16]),
    ]
    validate_config(completed, "m", signature)


def test_auto_complete_without_a_dynamic_first_dim_does_not_batch() -> None:
    signature = add_sub_engine(batch=False)
    completed = complete_config(config_of('name: "m"'), signature)
    assert completed.max_batch_size == 0
    assert completed.dynamic_batching is None
    assert [list(t.dims) for t in completed.input] == [[16], [16]]
    validate_config(completed, "m", signature)


def test_auto_complete_keeps_what_the_config_lists() -> None:
    signature = add_sub_engine()
    config = config_of(
        'name: "m" max_batch_size: 0 '
        'input [ { name: "INPUT0" }, { name: "INPUT1" dims: [-1, 16] } ]'
    )
    completed = complete_config(config, signature)
    assert completed.max_batch_size == 0  # the config lists tensors: its batch choice stands
    assert [(t.data_type, list(t.dims)) for t in completed.input] == [
        (DataType.TYPE_FP32, [-1, 16]),
        (DataType.TYPE_FP32, [-1, 16]),
    ]
    assert [t.name for t in completed.output] == ["OUTPUT0", "OUTPUT1"]
    validate_config(completed, "m", signature)


def test_auto_complete_writes_a_scalar_as_dims_one() -> None:
    """A model that does not batch: dims [1] and no reshape (Triton refuses an empty reshape
    there), read against the rank-0 tensor (base.model_reshape)."""
    signature = EngineSignature.of(
        [
            EngineTensor("X", "INPUT", "INT32", (), (((), (), ()),)),
            EngineTensor("Y", "OUTPUT", "INT32", ()),
        ]
    )
    completed = complete_config(config_of('name: "m"'), signature)
    assert completed.max_batch_size == 0
    (x,) = completed.input
    assert list(x.dims) == [1]
    assert x.reshape is None
    validate_config(completed, "m", signature)


def test_auto_complete_names_a_type_triton_lacks() -> None:
    signature = add_sub_engine(dtype="FP8")
    with pytest.raises(TritonError, match="has type FP8, which has no Triton data type"):
        complete_config(config_of('name: "m"'), signature)


# ---------------------------------------------------------------------------------------------
# Load checks

GOOD = """
name: "m"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [16] },
        { name: "INPUT1" data_type: TYPE_FP32 dims: [16] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [16] } ]
"""


def test_a_matching_config_loads() -> None:
    validate_config(config_of(GOOD), "m", add_sub_engine())


def test_load_checks_name_the_mismatch() -> None:
    signature = add_sub_engine()
    error = invalid(config_of(GOOD.replace("INPUT1", "INPUT9")), signature)
    assert error.code is ErrorCode.INVALID_ARG
    assert "config input 'INPUT9' is not an input of the TensorRT engine" in error.message

    error = invalid(
        config_of(GOOD.replace('"INPUT1" data_type: TYPE_FP32', '"INPUT1" data_type: TYPE_INT32')),
        signature,
    )
    assert "has data type TYPE_INT32 in the config but TYPE_FP32 (FLOAT)" in error.message

    error = invalid(config_of(GOOD.replace("OUTPUT0", "OUTPUT7")), signature)
    assert "config output 'OUTPUT7' is not an output" in error.message

    error = invalid(config_of(GOOD.replace("dims: [16] },\n", "dims: [15] },\n", 1)), signature)
    assert "input 'INPUT0' has dims [15] plus the batch dimension" in error.message

    one_input = GOOD.replace(',\n        { name: "INPUT1" data_type: TYPE_FP32 dims: [16] }', "")
    error = invalid(config_of(one_input), signature)
    assert "inputs ['INPUT1'] are missing from the config" in error.message


def test_batching_needs_a_dynamic_first_dim_within_the_profiles() -> None:
    error = invalid(config_of(GOOD), add_sub_engine(batch=False))
    assert "max_batch_size 8 but the engine's input 'INPUT0' has shape [16]" in error.message

    error = invalid(
        config_of(GOOD.replace("max_batch_size: 8", "max_batch_size: 9")), add_sub_engine()
    )
    assert "max_batch_size 9 but no optimization profile" in error.message
    assert "accepts a batch above 8" in error.message

    two_profiles = add_sub_engine(profiles=((1, 4, 8), (9, 12, 16)))
    validate_config(
        config_of(GOOD.replace("max_batch_size: 8", "max_batch_size: 16")), "m", two_profiles
    )


def test_shape_tensors_and_unknown_profiles_are_refused() -> None:
    shaped = EngineSignature.of(
        [
            EngineTensor("SHAPE", "INPUT", "INT32", (2,), is_shape_tensor=True),
            EngineTensor("Y", "OUTPUT", "FLOAT", (-1, -1)),
        ]
    )
    error = invalid(config_of('name: "m"'), shaped)
    assert error.code is ErrorCode.UNSUPPORTED
    assert "shape tensors ['SHAPE']" in error.message

    config = config_of(GOOD + 'instance_group [ { name: "g" kind: KIND_GPU profile: ["1"] } ]')
    error = invalid(config, add_sub_engine())
    assert "instance group 'g' names optimization profile '1'" in error.message
    assert "profiles 0 to 0" in error.message


# ---------------------------------------------------------------------------------------------
# Optimization profiles


def test_profile_zero_serves_what_fits_it() -> None:
    signature = add_sub_engine(profiles=((1, 4, 8), (9, 12, 16)))
    shapes = {"INPUT0": (4, 16), "INPUT1": (4, 16)}
    assert select_profile("m", shapes, signature, current=0, allowed=[0, 1]) == 0


def test_a_shape_outside_profile_zero_switches_to_one_that_fits() -> None:
    signature = add_sub_engine(profiles=((1, 4, 8), (9, 12, 16)))
    shapes = {"INPUT0": (12, 16), "INPUT1": (12, 16)}
    assert select_profile("m", shapes, signature, current=0, allowed=[0, 1]) == 1


def test_the_current_profile_is_kept_while_it_fits() -> None:
    signature = add_sub_engine(profiles=((1, 4, 8), (1, 8, 16)))
    shapes = {"INPUT0": (4, 16), "INPUT1": (4, 16)}
    assert select_profile("m", shapes, signature, current=1, allowed=[0, 1]) == 1
    # An instance restricted to profile 0 leaves profile 1 even when it would fit.
    assert select_profile("m", shapes, signature, current=1, allowed=[0]) == 0


def test_no_fitting_profile_names_the_shape_and_the_ranges() -> None:
    signature = add_sub_engine(profiles=((1, 4, 8), (9, 12, 16)))
    shapes = {"INPUT0": (17, 16), "INPUT1": (17, 16)}
    with pytest.raises(TritonError) as caught:
        select_profile("m", shapes, signature, current=0, allowed=[0, 1])
    assert caught.value.code is ErrorCode.INVALID_ARG
    assert caught.value.message == (
        "model 'm': input shapes INPUT0 [17, 16], INPUT1 [17, 16] fit no optimization profile "
        "of the TensorRT engine (profile 0: INPUT0 [1, 16]..[8, 16], INPUT1 [1, 16]..[8, 16]; "
        "profile 1: INPUT0 [9, 16]..[16, 16], INPUT1 [9, 16]..[16, 16])"
    )


def test_a_wrong_rank_fits_no_profile() -> None:
    signature = add_sub_engine()
    with pytest.raises(TritonError, match="fit no optimization profile"):
        select_profile("m", {"INPUT0": (16,), "INPUT1": (16,)}, signature, 0, [0])
