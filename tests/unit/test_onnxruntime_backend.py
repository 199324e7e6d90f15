"""The onnxruntime backend, called directly: auto-complete, load validation, instances, execute."""

from __future__ import annotations

import mmap
from pathlib import Path

import ml_dtypes
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from tests.onnx_models import (
    add_constant_model,
    add_sub_model,
    identity_model,
    save_model,
    string_identity_model,
)
from tritonactor._proto.inference import (
    DataType,
    ModelConfig,
    ModelDynamicBatching,
    ModelInput,
    ModelOutput,
    ModelTensorReshape,
)
from tritonactor.backends.base import InstanceContext, ModelContext
from tritonactor.backends.onnxruntime import OnnxRuntimeBackend, OnnxRuntimeInstance
from tritonactor.config.model_config import parse_pbtxt, read_pbtxt
from tritonactor.config.normalize import fill_defaults
from tritonactor.config.validate import validate_config
from tritonactor.core.datatypes import to_numpy_dtype
from tritonactor.core.errors import ErrorCode, TritonError
from tritonactor.core.types import (
    OUTPUT_BUFFERS,
    OUTPUTS_IN_PLACE,
    InferenceRequest,
    InferenceResponse,
    RequestedOutput,
    Tensor,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "tritonactor" / "examples" / "models"
CPU = InstanceContext(name="m_0", kind="KIND_CPU", device_id=0, index=0)


@pytest.fixture
def backend() -> OnnxRuntimeBackend:
    return OnnxRuntimeBackend()


def version_dir(tmp_path: Path, name: str = "m") -> Path:
    return tmp_path / name / "1"


def context(config: ModelConfig, vdir: Path, version: int = 1) -> ModelContext:
    return ModelContext(
        name=config.name,
        version=version,
        config=config,
        model_dir=vdir.parent,
        version_dir=vdir,
        model_path=vdir / (config.default_model_filename or "model.onnx"),
    )


def load(
    backend: OnnxRuntimeBackend,
    config: ModelConfig,
    vdir: Path,
    instance: InstanceContext = CPU,
) -> OnnxRuntimeInstance:
    return backend.load_model(context(config, vdir)).create_instance(instance)


def load_error(backend: OnnxRuntimeBackend, config: ModelConfig, vdir: Path) -> TritonError:
    with pytest.raises(TritonError) as caught:
        backend.load_model(context(config, vdir))
    return caught.value


def tensor(name: str, data: np.ndarray, datatype: str | None = None) -> Tensor:
    if datatype is None:
        datatype = "BYTES" if data.dtype == np.object_ else _wire(data.dtype)
    return Tensor(name=name, datatype=datatype, shape=tuple(data.shape), data=data)


def _wire(dtype: np.dtype) -> str:
    from tritonactor.core.datatypes import from_numpy_dtype

    return from_numpy_dtype(dtype)


def request(*inputs: Tensor, outputs: tuple[str, ...] = (), id: str = "") -> InferenceRequest:
    return InferenceRequest(
        model_name="m",
        id=id,
        inputs=list(inputs),
        outputs=[RequestedOutput(name) for name in outputs],
    )


def response(result: object) -> InferenceResponse:
    assert isinstance(result, InferenceResponse), result
    return result


def outputs_by_name(result: object) -> dict[str, Tensor]:
    return {t.name: t for t in response(result).outputs}


def bytes_array(items: list[bytes], shape: tuple[int, ...]) -> np.ndarray:
    array = np.empty(len(items), dtype=np.object_)
    array[:] = items
    return array.reshape(shape)


def add_sub_config(max_batch_size: int = 8, dims: list[int] | None = None) -> ModelConfig:
    dims = [16] if dims is None else dims
    return ModelConfig(
        name="m",
        max_batch_size=max_batch_size,
        input=[
            ModelInput(name=n, data_type=DataType.TYPE_INT32, dims=dims)
            for n in ("INPUT0", "INPUT1")
        ],
        output=[
            ModelOutput(name=n, data_type=DataType.TYPE_INT32, dims=dims)
            for n in ("OUTPUT0", "OUTPUT1")
        ],
    )


# ---------------------------------------------------------------------------------------------
# auto-complete


def test_auto_complete_batching_model_sets_default_max_batch_size(
    backend: OnnxRuntimeBackend, tmp_path: Path
) -> None:
    vdir = version_dir(tmp_path)
    add_sub_model(vdir / "model.onnx")
    config = ModelConfig(name="m")

    completed = backend.auto_complete_config(config, vdir)

    assert completed.max_batch_size == 4
    assert [(t.name, t.data_type, t.dims) for t in completed.input] == [
        ("INPUT0", DataType.TYPE_INT32, [16]),
        ("INPUT1", DataType.TYPE_INT32, [16]),
    ]
    assert [(t.name, t.data_type, t.dims) for t in completed.output] == [
        ("OUTPUT0", DataType.TYPE_INT32, [16]),
        ("OUTPUT1", DataType.TYPE_INT32, [16]),
    ]
    assert completed.backend == "onnxruntime"
    assert completed.platform == "onnxruntime_onnx"
    assert completed.dynamic_batching is not None
    assert config == ModelConfig(name="m"), "the caller's config must not change"
    # The completed config loads.
    load(backend, completed, vdir)


def test_auto_complete_default_max_batch_size_is_configurable(tmp_path: Path) -> None:
    vdir = version_dir(tmp_path)
    add_sub_model(vdir / "model.onnx")
    assert (
        OnnxRuntimeBackend(default_max_batch_size=16)
        .auto_complete_config(ModelConfig(name="m"), vdir)
        .max_batch_size
        == 16
    )
    completed = OnnxRuntimeBackend(default_max_batch_size=0).auto_complete_config(
        ModelConfig(name="m"), vdir
    )
    assert completed.max_batch_size == 0
    assert completed.input[0].dims == [-1, 16]


def test_auto_complete_non_batching_model_keeps_full_dims(
    backend: OnnxRuntimeBackend, tmp_path: Path
) -> None:
    vdir = version_dir(tmp_path)
    add_sub_model(vdir / "model.onnx", "FP32", (2, 3), batch=False)

    completed = backend.auto_complete_config(ModelConfig(name="m"), vdir)

    assert completed.max_batch_size == 0
    assert completed.dynamic_batching is None
    assert [(t.data_type, t.dims) for t in completed.input] == [(DataType.TYPE_FP32, [2, 3])] * 2
    assert [t.dims for t in completed.output] == [[2, 3], [2, 3]]
    load(backend, completed, vdir)


def test_auto_complete_symbolic_and_unknown_dims_become_minus_one(
    backend: OnnxRuntimeBackend, tmp_path: Path
) -> None:
    vdir = version_dir(tmp_path)
    identity_model(vdir / "model.onnx", "FP16", ["batch", "n", None, 5])

    completed = backend.auto_complete_config(ModelConfig(name="m"), vdir)

    assert completed.max_batch_size == 4
    assert completed.input[0].dims == [-1, -1, 5]
    assert completed.output[0].data_type == DataType.TYPE_FP16


def test_auto_complete_with_explicit_max_batch_size_strips_batch_dim(
    backend: OnnxRuntimeBackend, tmp_path: Path
) -> None:
    vdir = version_dir(tmp_path)
    string_identity_model(vdir / "model.onnx")

    completed = backend.auto_complete_config(ModelConfig(name="m", max_batch_size=8), vdir)

    assert completed.max_batch_size == 8
    assert (completed.input[0].data_type, completed.input[0].dims) == (DataType.TYPE_STRING, [-1])
    # Triton turns the dynamic batcher on only for a batch size it chose itself.
    assert completed.dynamic_batching is None


def test_auto_complete_keeps_listed_tensors_and_max_batch_size_zero(
    backend: OnnxRuntimeBackend, tmp_path: Path
) -> None:
    vdir = version_dir(tmp_path)
    add_sub_model(vdir / "model.onnx")
    config = ModelConfig(
        name="m",
        platform="onnxruntime_onnx",
        input=[ModelInput(name="INPUT0", data_type=DataType.TYPE_INT32), ModelInput(name="INPUT1")],
        output=[ModelOutput(name="OUTPUT1", dims=[-1, 16])],
    )

    completed = backend.auto_complete_config(config, vdir)

    # The config owns the shape when it lists tensors: no batching is invented.
    assert completed.max_batch_size == 0
    assert [(t.name, t.data_type, t.dims) for t in completed.input] == [
        ("INPUT0", DataType.TYPE_INT32, [-1, 16]),
        ("INPUT1", DataType.TYPE_INT32, [-1, 16]),
    ]
    # Listed outputs are a subset that auto-complete does not extend; given dims stay.
    assert [(t.name, t.data_type, t.dims) for t in completed.output] == [
        ("OUTPUT1", DataType.TYPE_INT32, [-1, 16])
    ]
    assert completed.backend == "onnxruntime"
    load(backend, completed, vdir)


def test_auto_complete_fills_only_dims(backend: OnnxRuntimeBackend, tmp_path: Path) -> None:
    vdir = version_dir(tmp_path)
    add_sub_model(vdir / "model.onnx")
    config = add_sub_config(max_batch_size=8, dims=[])

    completed = backend.auto_complete_config(config, vdir)

    assert completed.max_batch_size == 8
    assert all(t.dims == [16] for t in [*completed.input, *completed.output])
    assert all(t.data_type == DataType.TYPE_INT32 for t in [*completed.input, *completed.output])


def test_auto_complete_keeps_existing_scheduler_and_platform(
    backend: OnnxRuntimeBackend, tmp_path: Path
) -> None:
    vdir = version_dir(tmp_path)
    add_sub_model(vdir / "model.onnx")
    config = ModelConfig(
        name="m",
        backend="onnxruntime",
        dynamic_batching=ModelDynamicBatching(max_queue_delay_microseconds=100),
    )
    completed = backend.auto_complete_config(config, vdir)
    assert completed.dynamic_batching == ModelDynamicBatching(max_queue_delay_microseconds=100)
    assert completed.platform == "onnxruntime_onnx"


def test_auto_complete_scalar_per_item_uses_reshape(
    backend: OnnxRuntimeBackend, tmp_path: Path
) -> None:
    vdir = version_dir(tmp_path)
    identity_model(vdir / "model.onnx", "FP32", ["batch"])

    completed = backend.auto_complete_config(ModelConfig(name="m"), vdir)

    assert completed.max_batch_size == 4
    assert completed.input[0].dims == [1]
    assert completed.input[0].reshape is not None and completed.input[0].reshape.shape == []
    instance = load(backend, completed, vdir)
    data = np.array([[1.5], [2.5], [3.5]], dtype=np.float32)
    out = outputs_by_name(instance.execute([request(tensor("INPUT0", data))])[0])["OUTPUT0"]
    assert out.shape == (3, 1)
    np.testing.assert_array_equal(out.data, data)


def test_a_scalar_of_a_model_that_does_not_batch_is_dims_1(
    backend: OnnxRuntimeBackend, tmp_path: Path
) -> None:
    """As Triton's onnxruntime backend completes and serves it: dims [1], no reshape (Triton
    refuses an empty reshape where the model does not batch), read against the rank-0 tensor."""
    vdir = version_dir(tmp_path)
    identity_model(vdir / "model.onnx", "FP32", [])
    completed = backend.auto_complete_config(ModelConfig(name="m"), vdir)
    assert completed.max_batch_size == 0
    assert (completed.input[0].dims, completed.input[0].reshape) == ([1], None)
    assert (completed.output[0].dims, completed.output[0].reshape) == ([1], None)
    validate_config(fill_defaults(completed, gpus=0))
    instance = load(backend, completed, vdir)
    data = np.array([2.5], dtype=np.float32)
    out = outputs_by_name(instance.execute([request(tensor("INPUT0", data))])[0])["OUTPUT0"]
    assert out.shape == (1,)
    np.testing.assert_array_equal(out.data, data)


def test_auto_complete_without_model_file_fails(
    backend: OnnxRuntimeBackend, tmp_path: Path
) -> None:
    vdir = version_dir(tmp_path)
    vdir.mkdir(parents=True)
    with pytest.raises(TritonError) as caught:
        backend.auto_complete_config(ModelConfig(name="m"), vdir)
    assert "model.onnx" in caught.value.message


def test_auto_complete_is_idempotent_on_example_configs(backend: OnnxRuntimeBackend) -> None:
    for name in ("simple", "mlp_classifier"):
        config = read_pbtxt(EXAMPLES / name / "config.pbtxt")
        completed = backend.auto_complete_config(config, EXAMPLES / name / "1")
        assert completed.input == config.input
        assert completed.output == config.output
        assert completed.max_batch_size == config.max_batch_size


# ---------------------------------------------------------------------------------------------
# load-time validation


def test_load_rejects_unknown_input_and_lists_model_inputs(
    backend: OnnxRuntimeBackend, tmp_path: Path
) -> None:
    vdir = version_dir(tmp_path)
    add_sub_model(vdir / "model.onnx")
    config = add_sub_config()
    config.input[1].name = "INPUT9"

    error = load_error(backend, config, vdir)

    assert error.code is ErrorCode.INVALID_ARG
    assert "'m'" in error.message and "'INPUT9'" in error.message
    assert "['INPUT0', 'INPUT1']" in error.message


def test_load_rejects_unknown_output(backend: OnnxRuntimeBackend, tmp_path: Path) -> None:
    vdir = version_dir(tmp_path)
    add_sub_model(vdir / "model.onnx")
    config = add_sub_config()
    config.output[0].name = "SUM"
    error = load_error(backend, config, vdir)
    assert "'SUM'" in error.message and "['OUTPUT0', 'OUTPUT1']" in error.message


def test_load_rejects_config_missing_a_model_input(
    backend: OnnxRuntimeBackend, tmp_path: Path
) -> None:
    vdir = version_dir(tmp_path)
    add_sub_model(vdir / "model.onnx")
    config = add_sub_config()
    del config.input[1]
    error = load_error(backend, config, vdir)
    assert error.code is ErrorCode.INVALID_ARG and "INPUT1" in error.message


def test_load_rejects_datatype_mismatch(backend: OnnxRuntimeBackend, tmp_path: Path) -> None:
    vdir = version_dir(tmp_path)
    add_sub_model(vdir / "model.onnx")
    config = add_sub_config()
    config.input[0].data_type = DataType.TYPE_FP32

    error = load_error(backend, config, vdir)

    assert error.code is ErrorCode.INVALID_ARG
    assert "'INPUT0'" in error.message
    assert "TYPE_FP32" in error.message and "TYPE_INT32" in error.message


def test_load_rejects_fixed_first_dim_with_max_batch_size(
    backend: OnnxRuntimeBackend, tmp_path: Path
) -> None:
    vdir = version_dir(tmp_path)
    identity_model(vdir / "model.onnx", "FP32", [1, 16], input_name="x", output_name="y")
    config = ModelConfig(
        name="m",
        max_batch_size=8,
        input=[ModelInput(name="x", data_type=DataType.TYPE_FP32, dims=[16])],
        output=[ModelOutput(name="y", data_type=DataType.TYPE_FP32, dims=[16])],
    )

    error = load_error(backend, config, vdir)

    assert error.code is ErrorCode.INVALID_ARG
    assert (
        "model 'm' has max_batch_size 8 but the ONNX model's input 'x' has a fixed first "
        "dimension 1; set max_batch_size 0"
    ) in error.message


def test_explicit_max_batch_size_on_unbatchable_model_fails_at_load(
    backend: OnnxRuntimeBackend, tmp_path: Path
) -> None:
    vdir = version_dir(tmp_path)
    identity_model(vdir / "model.onnx", "FP32", [1, 16], input_name="x", output_name="y")
    completed = backend.auto_complete_config(ModelConfig(name="m", max_batch_size=8), vdir)
    error = load_error(backend, completed, vdir)
    assert "fixed first dimension 1" in error.message


def test_load_rejects_dims_mismatch(backend: OnnxRuntimeBackend, tmp_path: Path) -> None:
    vdir = version_dir(tmp_path)
    add_sub_model(vdir / "model.onnx")
    config = add_sub_config(dims=[16])
    config.output[1].dims = [15]

    error = load_error(backend, config, vdir)

    assert error.code is ErrorCode.INVALID_ARG
    assert "'OUTPUT1'" in error.message and "[15]" in error.message
    assert "[-1, 16]" in error.message


def test_load_rejects_rank_mismatch(backend: OnnxRuntimeBackend, tmp_path: Path) -> None:
    vdir = version_dir(tmp_path)
    add_sub_model(vdir / "model.onnx")
    # max_batch_size 0 with the batch dim left out: the config is one rank short.
    error = load_error(backend, add_sub_config(max_batch_size=0, dims=[16]), vdir)
    assert "rank 1 vs 2" in error.message


def test_load_accepts_variable_config_dims_and_output_subset(
    backend: OnnxRuntimeBackend, tmp_path: Path
) -> None:
    vdir = version_dir(tmp_path)
    add_sub_model(vdir / "model.onnx")
    config = add_sub_config(dims=[-1])
    del config.output[0]
    instance = load(backend, config, vdir)
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    out = outputs_by_name(instance.execute([request(tensor("INPUT0", a), tensor("INPUT1", a))])[0])
    assert list(out) == ["OUTPUT1"]


def test_load_rejects_unknown_accelerator_and_bad_parameters(
    backend: OnnxRuntimeBackend, tmp_path: Path
) -> None:
    vdir = version_dir(tmp_path)
    add_sub_model(vdir / "model.onnx")
    base = add_sub_config()
    gpu = "optimization { execution_accelerators { gpu_execution_accelerator [%s] } }"
    cpu = "optimization { execution_accelerators { cpu_execution_accelerator [%s] } }"
    bad = [
        gpu % '{ name: "fastpath" }',
        cpu % '{ name: "fastpath" }',
        gpu % '{ name: "tensorrt" parameters { key: "precision_mode" value: "FP8" } }',
        gpu % '{ name: "tensorrt" parameters { key: "warp_speed" value: "9" } }',
        'parameters { key: "intra_op_thread_count" value { string_value: "many" } }',
        'parameters { key: "execution_mode" value { string_value: "2" } }',
    ]
    for extra in bad:
        tuned = parse_pbtxt(extra)
        config = ModelConfig.parse(bytes(base))
        config.parameters = tuned.parameters
        config.optimization = tuned.optimization
        error = load_error(backend, config, vdir)
        assert error.code is ErrorCode.INVALID_ARG, extra


def test_load_model_folder_with_external_data(backend: OnnxRuntimeBackend, tmp_path: Path) -> None:
    vdir = version_dir(tmp_path)
    add_constant_model(vdir / "model.onnx" / "model.onnx", [1.0, 2.0, 3.0], external_data=True)
    assert (vdir / "model.onnx" / "weights.bin").is_file()

    completed = backend.auto_complete_config(ModelConfig(name="m"), vdir)
    instance = load(backend, completed, vdir)

    data = np.zeros((2, 3), dtype=np.float32)
    out = outputs_by_name(instance.execute([request(tensor("INPUT0", data))])[0])["OUTPUT0"]
    np.testing.assert_array_equal(out.data, [[1, 2, 3], [1, 2, 3]])


# ---------------------------------------------------------------------------------------------
# instances and session options


def test_session_options_follow_config(backend: OnnxRuntimeBackend, tmp_path: Path) -> None:
    vdir = version_dir(tmp_path)
    add_sub_model(vdir / "model.onnx")
    config = add_sub_config()
    instance = load(backend, config, vdir)
    assert instance.session is not None
    options = instance.session.get_session_options()
    assert options.intra_op_num_threads == 0  # onnxruntime's own default, as Triton
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL

    text = (
        'parameters { key: "intra_op_thread_count" value { string_value: "2" } } '
        'parameters { key: "inter_op_thread_count" value { string_value: "1" } } '
        "optimization { graph { level: 1 } }"
    )
    tuned = parse_pbtxt(text)
    config.parameters = tuned.parameters
    config.optimization = tuned.optimization
    session = load(backend, config, vdir).session
    assert session is not None
    options = session.get_session_options()
    assert (options.intra_op_num_threads, options.inter_op_num_threads) == (2, 1)
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED


@pytest.mark.skipif(
    "CUDAExecutionProvider" in ort.get_available_providers(),
    reason="this onnxruntime has the CUDA provider",
)
def test_kind_gpu_without_cuda_is_a_clear_error(
    backend: OnnxRuntimeBackend, tmp_path: Path
) -> None:
    vdir = version_dir(tmp_path)
    add_sub_model(vdir / "model.onnx")
    model = backend.load_model(context(add_sub_config(), vdir))
    gpu = InstanceContext(name="m_0", kind="KIND_GPU", device_id=0, index=0)

    with pytest.raises(TritonError) as caught:
        model.create_instance(gpu)

    assert caught.value.code is ErrorCode.UNAVAILABLE
    assert "instance group KIND_GPU needs the CUDA execution provider" in caught.value.message
    assert "CPUExecutionProvider" in caught.value.message


@pytest.mark.skipif(
    "CUDAExecutionProvider" in ort.get_available_providers(),
    reason="this onnxruntime has the CUDA provider",
)
@pytest.mark.parametrize("kind", ["KIND_AUTO", "KIND_MODEL"])
def test_auto_and_model_kinds_run_on_cpu_without_cuda(
    backend: OnnxRuntimeBackend, tmp_path: Path, kind: str
) -> None:
    vdir = version_dir(tmp_path)
    add_sub_model(vdir / "model.onnx")
    instance = load(
        backend,
        add_sub_config(),
        vdir,
        InstanceContext(name="m_0", kind=kind, device_id=0, index=0),
    )
    assert instance.session is not None
    assert instance.session.get_providers() == ["CPUExecutionProvider"]


@pytest.mark.skipif(
    "OpenVINOExecutionProvider" in ort.get_available_providers(),
    reason="this onnxruntime has the OpenVINO provider",
)
def test_openvino_without_provider_is_a_clear_error(
    backend: OnnxRuntimeBackend, tmp_path: Path
) -> None:
    vdir = version_dir(tmp_path)
    add_sub_model(vdir / "model.onnx")
    config = add_sub_config()
    openvino = '{ execution_accelerators { cpu_execution_accelerator [{ name: "openvino" }] } }'
    config.optimization = parse_pbtxt(f"optimization {openvino}").optimization
    model = backend.load_model(context(config, vdir))
    with pytest.raises(TritonError) as caught:
        model.create_instance(CPU)
    assert "OpenVINO" in caught.value.message


# ---------------------------------------------------------------------------------------------
# execute


def add_sub(
    backend: OnnxRuntimeBackend, tmp_path: Path
) -> tuple[OnnxRuntimeInstance, np.ndarray, np.ndarray, tuple[Tensor, Tensor]]:
    """An add_sub instance, its two [2, 16] INT32 inputs, and those as the request's tensors."""
    vdir = version_dir(tmp_path)
    add_sub_model(vdir / "model.onnx")
    instance = load(backend, add_sub_config(), vdir)
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    b = np.full((2, 16), 3, dtype=np.int32)
    return instance, a, b, (tensor("INPUT0", a), tensor("INPUT1", b))


def test_execute_add_sub_with_requested_outputs(
    backend: OnnxRuntimeBackend, tmp_path: Path
) -> None:
    instance, a, b, inputs = add_sub(backend, tmp_path)

    results = instance.execute(
        [
            request(*inputs, id="all"),
            request(*inputs, outputs=("OUTPUT1",), id="difference"),
        ]
    )

    first = response(results[0])
    assert (first.model_name, first.model_version, first.id) == ("m", "1", "all")
    outputs = outputs_by_name(first)
    assert list(outputs) == ["OUTPUT0", "OUTPUT1"]
    assert outputs["OUTPUT0"].datatype == "INT32"
    assert outputs["OUTPUT0"].shape == (2, 16)
    np.testing.assert_array_equal(outputs["OUTPUT0"].data, a + b)
    np.testing.assert_array_equal(outputs["OUTPUT1"].data, a - b)

    second = response(results[1])
    assert second.id == "difference"
    assert [t.name for t in second.outputs] == ["OUTPUT1"]
    np.testing.assert_array_equal(second.outputs[0].data, a - b)


@pytest.mark.parametrize(
    "datatype",
    [
        *("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64"),
        *("FP16", "FP32", "FP64", "BF16"),
    ],
)
def test_execute_identity_for_each_datatype(
    backend: OnnxRuntimeBackend, tmp_path: Path, datatype: str
) -> None:
    vdir = version_dir(tmp_path)
    identity_model(vdir / "model.onnx", datatype, ["batch", 3])
    config = backend.auto_complete_config(ModelConfig(name="m"), vdir)
    assert config.input[0].data_type == DataType[f"TYPE_{datatype}"]
    instance = load(backend, config, vdir)
    data = np.arange(6).reshape(2, 3) % 2 if datatype == "BOOL" else np.arange(6).reshape(2, 3)
    data = data.astype(to_numpy_dtype(datatype))

    out = outputs_by_name(instance.execute([request(tensor("INPUT0", data, datatype))])[0])

    result = out["OUTPUT0"]
    assert result.datatype == datatype
    assert result.data.dtype == to_numpy_dtype(datatype)
    assert result.shape == (2, 3)
    np.testing.assert_array_equal(result.data, data)


def test_bf16_values_survive_the_round_trip(backend: OnnxRuntimeBackend, tmp_path: Path) -> None:
    vdir = version_dir(tmp_path)
    identity_model(vdir / "model.onnx", "BF16", ["batch", 4])
    instance = load(backend, backend.auto_complete_config(ModelConfig(name="m"), vdir), vdir)
    data = np.array([[0.5, -1.25, 3.0e10, 1.0e-20]], dtype=ml_dtypes.bfloat16)
    out = outputs_by_name(instance.execute([request(tensor("INPUT0", data, "BF16"))])[0])
    assert out["OUTPUT0"].data.tobytes() == data.tobytes()


def test_execute_strings_with_empty_and_non_ascii(
    backend: OnnxRuntimeBackend, tmp_path: Path
) -> None:
    vdir = version_dir(tmp_path)
    string_identity_model(vdir / "model.onnx")
    instance = load(backend, backend.auto_complete_config(ModelConfig(name="m"), vdir), vdir)
    items = [b"", "héllo wörld".encode(), "日本語".encode(), "🙂".encode(), b"plain", b""]
    data = bytes_array(items, (2, 3))

    out = outputs_by_name(instance.execute([request(tensor("INPUT0", data, "BYTES"))])[0])

    result = out["OUTPUT0"]
    assert result.datatype == "BYTES"
    assert result.shape == (2, 3)
    assert result.data.dtype == np.object_
    assert result.data.reshape(-1).tolist() == items
    assert all(type(item) is bytes for item in result.data.reshape(-1))


def test_non_utf8_string_fails_only_its_request(
    backend: OnnxRuntimeBackend, tmp_path: Path
) -> None:
    vdir = version_dir(tmp_path)
    string_identity_model(vdir / "model.onnx")
    instance = load(backend, backend.auto_complete_config(ModelConfig(name="m"), vdir), vdir)
    good = bytes_array([b"ok"], (1, 1))
    bad = bytes_array([b"\xff\xfe"], (1, 1))

    results = instance.execute(
        [request(tensor("INPUT0", bad, "BYTES")), request(tensor("INPUT0", good, "BYTES"))]
    )

    assert isinstance(results[0], TritonError) and results[0].code is ErrorCode.INVALID_ARG
    assert "UTF-8" in results[0].message
    assert outputs_by_name(results[1])["OUTPUT0"].data.tolist() == [[b"ok"]]


def test_runtime_error_fails_only_its_request(backend: OnnxRuntimeBackend, tmp_path: Path) -> None:
    vdir = version_dir(tmp_path)
    # Each input is [-1] on its own, so a request with lengths 3 and 2 passes the config check
    # and fails inside onnxruntime (the shapes cannot broadcast).
    add_sub_model(vdir / "model.onnx", "FP32", (None,), batch=False)
    config = add_sub_config(max_batch_size=0, dims=[-1])
    for t in [*config.input, *config.output]:
        t.data_type = DataType.TYPE_FP32
    instance = load(backend, config, vdir)
    ok = np.array([1.0, 2.0], dtype=np.float32)
    long = np.array([1.0, 2.0, 3.0], dtype=np.float32)

    results = instance.execute(
        [
            request(tensor("INPUT0", ok), tensor("INPUT1", ok), id="before"),
            request(tensor("INPUT0", long), tensor("INPUT1", ok), id="broken"),
            request(tensor("INPUT0", ok), tensor("INPUT1", ok * 2), id="after"),
        ]
    )

    assert response(results[0]).id == "before"
    error = results[1]
    assert isinstance(error, TritonError)
    assert error.code is ErrorCode.INTERNAL
    assert error.message.startswith("onnx runtime error")
    np.testing.assert_array_equal(outputs_by_name(results[2])["OUTPUT1"].data, [-1.0, -2.0])


def test_finalized_instance_answers_unavailable(
    backend: OnnxRuntimeBackend, tmp_path: Path
) -> None:
    vdir = version_dir(tmp_path)
    add_sub_model(vdir / "model.onnx")
    instance = load(backend, add_sub_config(), vdir)
    instance.finalize()
    a = np.zeros((1, 16), dtype=np.int32)
    result = instance.execute([request(tensor("INPUT0", a), tensor("INPUT1", a))])[0]
    assert isinstance(result, TritonError) and result.code is ErrorCode.UNAVAILABLE


# ---------------------------------------------------------------------------------------------
# the bundled example repository


def load_example(backend: OnnxRuntimeBackend, name: str) -> OnnxRuntimeInstance:
    config = read_pbtxt(EXAMPLES / name / "config.pbtxt")
    return load(backend, config, EXAMPLES / name / "1")


def test_example_simple_adds_and_subtracts(backend: OnnxRuntimeBackend) -> None:
    instance = load_example(backend, "simple")
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.ones((1, 16), dtype=np.int32)
    outputs = outputs_by_name(
        instance.execute([request(tensor("INPUT0", a), tensor("INPUT1", b))])[0]
    )
    np.testing.assert_array_equal(outputs["OUTPUT0"].data, a + b)
    np.testing.assert_array_equal(outputs["OUTPUT1"].data, a - b)
    assert (
        response(
            instance.execute([request(tensor("INPUT0", a), tensor("INPUT1", b))])[0]
        ).model_name
        == "simple"
    )


def test_example_mlp_classifier_gives_probabilities(backend: OnnxRuntimeBackend) -> None:
    instance = load_example(backend, "mlp_classifier")
    features = np.random.default_rng(1).standard_normal((5, 64)).astype(np.float32)

    out = outputs_by_name(instance.execute([request(tensor("features", features))])[0])

    probabilities = out["probabilities"]
    assert probabilities.datatype == "FP32"
    assert probabilities.shape == (5, 10)
    assert np.all(probabilities.data >= 0)
    np.testing.assert_allclose(probabilities.data.sum(axis=1), 1.0, rtol=1e-5)
    # Not a degenerate model: different items are classified differently.
    assert len({tuple(np.round(row, 4)) for row in probabilities.data}) == 5


def test_example_mlp_matches_numpy_reference(backend: OnnxRuntimeBackend) -> None:
    from tritonactor.examples.build import mlp_weights

    instance = load_example(backend, "mlp_classifier")
    features = np.random.default_rng(2).standard_normal((3, 64)).astype(np.float32)
    out = outputs_by_name(instance.execute([request(tensor("features", features))])[0])

    x = features.astype(np.float64)
    layers = mlp_weights()
    for index, (weight, bias) in enumerate(layers):
        x = x @ weight + bias
        if index < len(layers) - 1:
            x = np.maximum(x, 0)
    expected = np.exp(x - x.max(axis=1, keepdims=True))
    expected /= expected.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(out["probabilities"].data, expected, rtol=1e-4, atol=1e-6)


def test_shipped_example_repository_is_what_the_builder_writes(tmp_path: Path) -> None:
    from tritonactor.examples.build import build

    build(tmp_path)
    built = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    for relative in built:
        assert (EXAMPLES / relative).read_bytes() == (tmp_path / relative).read_bytes(), relative


# ---------------------------------------------------------------------------------------------
# outputs written where they are due (a client's shared memory: OUTPUT_BUFFERS)


def page(size: int = 4096) -> memoryview:
    """Page-aligned writable memory, as a mapped region is."""
    return memoryview(mmap.mmap(-1, size))


def due_in(
    buffers: dict[str, memoryview], *inputs: Tensor, outputs: tuple[str, ...] = ()
) -> InferenceRequest:
    made = request(*inputs, outputs=outputs)
    made.context[OUTPUT_BUFFERS] = lambda asked: buffers if asked is made else {}
    return made


def in_buffer(data: np.ndarray, buffer: memoryview) -> bool:
    return np.may_share_memory(data, np.frombuffer(buffer, np.uint8))


def identity_fp32(backend: OnnxRuntimeBackend, tmp_path: Path) -> OnnxRuntimeInstance:
    vdir = version_dir(tmp_path)
    identity_model(vdir / "model.onnx", "FP32", ["batch", "n"])
    return load(backend, backend.auto_complete_config(ModelConfig(name="m"), vdir), vdir)


def test_an_output_due_in_shared_memory_is_written_there_by_onnxruntime(
    backend: OnnxRuntimeBackend, tmp_path: Path
) -> None:
    instance = identity_fp32(backend, tmp_path)
    data = np.arange(12, dtype=np.float32).reshape(2, 6)
    buffer = page()
    out = outputs_by_name(
        instance.execute([due_in({"OUTPUT0": buffer}, tensor("INPUT0", data))])[0]
    )
    result = out["OUTPUT0"].data
    assert in_buffer(result, buffer) and out["OUTPUT0"].shape == (2, 6)
    np.testing.assert_array_equal(result, data)
    np.testing.assert_array_equal(np.frombuffer(buffer, np.float32, 12), data.reshape(-1))


@pytest.mark.parametrize(
    "case", ["too small", "not aligned", "overlaps the input", "no buffer for it"]
)
def test_an_output_that_cannot_be_written_where_it_is_due_runs_as_usual(
    backend: OnnxRuntimeBackend, tmp_path: Path, case: str
) -> None:
    instance = identity_fp32(backend, tmp_path)
    buffer = page(8192)
    data = np.arange(12, dtype=np.float32).reshape(2, 6)
    buffers = {"OUTPUT0": buffer}
    if case == "too small":
        buffers = {"OUTPUT0": buffer[: data.nbytes - 1]}
    elif case == "not aligned":
        buffers = {"OUTPUT0": buffer[8:]}
    elif case == "overlaps the input":
        data = np.arange(64, dtype=np.float32).reshape(2, 32)  # 256 bytes
        np.frombuffer(buffer, np.float32, 64)[...] = data.reshape(-1)
        data = np.frombuffer(buffer, np.float32, 64).reshape(2, 32)
        buffers = {"OUTPUT0": buffer[64:]}  # aligned, but it would overwrite what it reads
    else:
        buffers = {"OTHER": buffer}
    expected = data.copy()
    out = outputs_by_name(instance.execute([due_in(buffers, tensor("INPUT0", data))])[0])
    np.testing.assert_array_equal(out["OUTPUT0"].data, expected)
    assert not in_buffer(out["OUTPUT0"].data, buffer)


def test_outputs_are_written_in_place_only_when_every_requested_one_can_be(
    backend: OnnxRuntimeBackend, tmp_path: Path
) -> None:
    instance, a, b, inputs = add_sub(backend, tmp_path)
    sum_buffer, difference_buffer = page(), page()
    one = outputs_by_name(instance.execute([due_in({"OUTPUT0": sum_buffer}, *inputs)])[0])
    assert not in_buffer(one["OUTPUT0"].data, sum_buffer)  # OUTPUT1 has nowhere to go
    np.testing.assert_array_equal(one["OUTPUT0"].data, a + b)
    only = due_in({"OUTPUT0": sum_buffer}, *inputs, outputs=("OUTPUT0",))
    assert in_buffer(outputs_by_name(instance.execute([only])[0])["OUTPUT0"].data, sum_buffer)
    both = due_in({"OUTPUT0": sum_buffer, "OUTPUT1": difference_buffer}, *inputs)
    out = outputs_by_name(instance.execute([both])[0])
    assert in_buffer(out["OUTPUT0"].data, sum_buffer)
    assert in_buffer(out["OUTPUT1"].data, difference_buffer)
    np.testing.assert_array_equal(out["OUTPUT0"].data, a + b)
    np.testing.assert_array_equal(out["OUTPUT1"].data, a - b)


def test_strings_are_never_written_in_place(backend: OnnxRuntimeBackend, tmp_path: Path) -> None:
    vdir = version_dir(tmp_path)
    string_identity_model(vdir / "model.onnx")
    instance = load(backend, backend.auto_complete_config(ModelConfig(name="m"), vdir), vdir)
    words = bytes_array([b"a", b"bc"], (1, 2))
    buffer = page()
    out = outputs_by_name(
        instance.execute([due_in({"OUTPUT0": buffer}, tensor("INPUT0", words))])[0]
    )
    assert out["OUTPUT0"].data.tolist() == [[b"a", b"bc"]]
    assert not any(bytes(buffer))  # nothing was bound there: the buffer is as it was


def reshaping_model(path: Path) -> None:
    """OUTPUT0 = INPUT0 reshaped to SHAPE, declared (wrongly, for a transposed SHAPE) as the
    input's own ["batch", "n"]."""
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["INPUT0", "SHAPE"], ["OUTPUT0"])],
        "reshaping",
        [
            helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", "n"]),
            helper.make_tensor_value_info("SHAPE", TensorProto.INT64, [2]),
        ],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", "n"])],
    )
    save_model(graph, path)


def test_a_model_whose_outputs_are_not_the_shapes_it_declares_is_answered_right(
    backend: OnnxRuntimeBackend, tmp_path: Path
) -> None:
    vdir = version_dir(tmp_path)
    reshaping_model(vdir / "model.onnx")
    config = ModelConfig(
        name="m",
        input=[
            ModelInput(name="INPUT0", data_type=DataType.TYPE_FP32, dims=[-1, -1]),
            ModelInput(name="SHAPE", data_type=DataType.TYPE_INT64, dims=[2]),
        ],
        output=[ModelOutput(name="OUTPUT0", data_type=DataType.TYPE_FP32, dims=[-1, -1])],
    )
    instance = load(backend, config, vdir)
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    buffer = page()

    def run(shape: list[int]) -> object:
        inputs = (tensor("INPUT0", data), tensor("SHAPE", np.array(shape, np.int64)))
        return instance.execute([due_in({"OUTPUT0": buffer}, *inputs)])[0]

    # A request the model fails either way fails as it would have: in place stays on.
    failed = run([4, 4])
    assert isinstance(failed, TritonError) and failed.code == ErrorCode.INTERNAL
    fits = outputs_by_name(run([2, 3]))["OUTPUT0"].data
    assert in_buffer(fits, buffer)
    np.testing.assert_array_equal(fits, data)
    # Its output is not the shape it declares: the answer is still right, and this model's
    # outputs are no longer written in place, even those that would fit.
    transposed = outputs_by_name(run([3, 2]))["OUTPUT0"]
    assert transposed.shape == (3, 2) and not in_buffer(transposed.data, buffer)
    np.testing.assert_array_equal(transposed.data, data.reshape(3, 2))
    assert not in_buffer(outputs_by_name(run([2, 3]))["OUTPUT0"].data, buffer)


def test_an_output_onnxruntime_answers_from_other_memory_is_not_taken_from_the_buffer(
    backend: OnnxRuntimeBackend, tmp_path: Path
) -> None:
    # A graph output that is a graph input: onnxruntime hands back the input's memory and
    # leaves the buffer bound to it as it was.
    vdir = version_dir(tmp_path)
    graph = helper.make_graph(
        [helper.make_node("Neg", ["INPUT0"], ["OUTPUT0"])],
        "through",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", 3])],
        [
            helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", 3]),
            helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", 3]),
        ],
    )
    save_model(graph, vdir / "model.onnx")
    config = ModelConfig(
        name="m",
        input=[ModelInput(name="INPUT0", data_type=DataType.TYPE_FP32, dims=[-1, 3])],
        output=[
            ModelOutput(name="INPUT0", data_type=DataType.TYPE_FP32, dims=[-1, 3]),
            ModelOutput(name="OUTPUT0", data_type=DataType.TYPE_FP32, dims=[-1, 3]),
        ],
    )
    instance = load(backend, config, vdir)
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    through, negated = page(), page()
    np.frombuffer(through, np.float32)[...] = -7  # what a stale buffer would give back
    made = due_in({"INPUT0": through, "OUTPUT0": negated}, tensor("INPUT0", data))
    out = outputs_by_name(instance.execute([made])[0])
    np.testing.assert_array_equal(out["INPUT0"].data, data)
    assert not in_buffer(out["INPUT0"].data, through)
    assert not np.may_share_memory(out["INPUT0"].data, data)  # its own copy: outlives the input
    np.testing.assert_array_equal(out["OUTPUT0"].data, -data)
    assert in_buffer(out["OUTPUT0"].data, negated)
    assert made.context[OUTPUTS_IN_PLACE] == data.nbytes  # only OUTPUT0 was written in place


def test_a_request_whose_places_cannot_be_told_runs_as_usual(
    backend: OnnxRuntimeBackend, tmp_path: Path
) -> None:
    instance = identity_fp32(backend, tmp_path)
    data = np.arange(6, dtype=np.float32).reshape(1, 6)
    made = request(tensor("INPUT0", data))

    def offer(_: InferenceRequest) -> dict[str, memoryview]:
        raise RuntimeError("the region went away")

    made.context[OUTPUT_BUFFERS] = offer
    np.testing.assert_array_equal(
        outputs_by_name(instance.execute([made])[0])["OUTPUT0"].data, data
    )


def test_a_reshape_with_several_variable_dimensions(
    backend: OnnxRuntimeBackend, tmp_path: Path
) -> None:
    """Each -1 of a reshape takes, in order, the size of the tensor's own variable dimensions,
    as Triton's does: a [2, 2, 3] request to dims [-1, -1] reshaped [-1, 1, -1] reaches the
    model as [2, 2, 1, 3], and its output goes back to [2, 2, 3] (numpy takes one -1 only)."""
    vdir = version_dir(tmp_path)
    identity_model(vdir / "model.onnx", "FP32", ["batch", "a", 1, "b"])
    shape = ModelTensorReshape(shape=[-1, 1, -1])
    config = ModelConfig(
        name="m",
        backend="onnxruntime",
        max_batch_size=4,
        input=[
            ModelInput(name="INPUT0", data_type=DataType.TYPE_FP32, dims=[-1, -1], reshape=shape)
        ],
        output=[
            ModelOutput(name="OUTPUT0", data_type=DataType.TYPE_FP32, dims=[-1, -1], reshape=shape)
        ],
    )
    instance = load(backend, config, vdir)
    data = np.arange(12, dtype=np.float32).reshape(2, 2, 3)
    out = outputs_by_name(instance.execute([request(tensor("INPUT0", data))])[0])["OUTPUT0"]
    assert out.shape == (2, 2, 3)
    np.testing.assert_array_equal(out.data, data)
