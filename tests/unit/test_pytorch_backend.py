"""The pytorch backend, called directly: binding rules, load checks, devices, execute."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from tests import torch_models
from tritonactor._proto.inference import ModelConfig
from tritonactor.backends.base import InstanceContext, ModelContext
from tritonactor.backends.pytorch import PyTorchBackend, PyTorchInstance
from tritonactor.config.model_config import parse_pbtxt
from tritonactor.core.datatypes import from_numpy_dtype
from tritonactor.core.errors import ErrorCode, TritonError
from tritonactor.core.types import InferenceRequest, InferenceResponse, RequestedOutput, Tensor

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:torch.*")

CPU = InstanceContext(name="m_0", kind="KIND_CPU", device_id=0, index=0)

ADD_SUB = """
name: "m"
platform: "pytorch_libtorch"
max_batch_size: 8
input [
  {{ name: "{in0}" data_type: {dtype} dims: [ 4 ] }},
  {{ name: "{in1}" data_type: {dtype} dims: [ 4 ] }}
]
output [
  {{ name: "{out0}" data_type: {dtype} dims: [ 4 ] }},
  {{ name: "{out1}" data_type: {dtype} dims: [ 4 ] }}
]
{extra}
"""


def add_sub_config(
    in0: str = "INPUT__0",
    in1: str = "INPUT__1",
    out0: str = "OUTPUT__0",
    out1: str = "OUTPUT__1",
    dtype: str = "TYPE_INT32",
    extra: str = "",
) -> ModelConfig:
    text = ADD_SUB.format(in0=in0, in1=in1, out0=out0, out1=out1, dtype=dtype, extra=extra)
    return parse_pbtxt(text)


@pytest.fixture
def backend() -> PyTorchBackend:
    return PyTorchBackend()


def context(config: ModelConfig, path: Path) -> ModelContext:
    return ModelContext(
        name=config.name,
        version=1,
        config=config,
        model_dir=path.parent.parent,
        version_dir=path.parent,
        model_path=path,
    )


def load(
    backend: PyTorchBackend, config: ModelConfig, path: Path, instance: InstanceContext = CPU
) -> PyTorchInstance:
    return backend.load_model(context(config, path)).create_instance(instance)


def load_error(backend: PyTorchBackend, config: ModelConfig, path: Path) -> TritonError:
    with pytest.raises(TritonError) as caught:
        load(backend, config, path)
    return caught.value


def tensor(name: str, data: np.ndarray) -> Tensor:
    datatype = from_numpy_dtype(data.dtype)
    return Tensor(name=name, datatype=datatype, shape=tuple(data.shape), data=data)


def infer(
    instance: PyTorchInstance, inputs: dict[str, np.ndarray], outputs: list[str] | None = None
) -> InferenceResponse | TritonError:
    request = InferenceRequest(
        model_name="m",
        id="r1",
        inputs=[tensor(name, data) for name, data in inputs.items()],
        outputs=[RequestedOutput(name) for name in outputs or []],
    )
    [result] = instance.execute([request])
    assert result is not None
    return result


def arrays(result: InferenceResponse | TritonError) -> dict[str, np.ndarray]:
    assert isinstance(result, InferenceResponse), result
    return {out.name: out.data for out in result.outputs}


A = np.arange(8, dtype=np.int32).reshape(2, 4)
B = np.ones((2, 4), dtype=np.int32)


# ---------------------------------------------------------------------------------------------
# Binding


def test_named_index_inputs_and_outputs(backend: PyTorchBackend, tmp_path: Path) -> None:
    path = torch_models.add_sub_model(tmp_path / "m" / "1" / "model.pt")
    instance = load(backend, add_sub_config(), path)
    result = infer(instance, {"INPUT__0": A, "INPUT__1": B})
    assert isinstance(result, InferenceResponse)
    assert (result.model_name, result.model_version, result.id) == ("m", "1", "r1")
    out = arrays(result)
    np.testing.assert_array_equal(out["OUTPUT__0"], A + B)
    np.testing.assert_array_equal(out["OUTPUT__1"], A - B)
    assert out["OUTPUT__0"].dtype == np.int32
    assert [t.datatype for t in result.outputs] == ["INT32", "INT32"]
    assert result.outputs[0].shape == (2, 4)


def test_indices_not_config_order_decide(backend: PyTorchBackend, tmp_path: Path) -> None:
    # INPUT__1 listed first still feeds forward()'s second argument; outputs likewise.
    path = torch_models.add_sub_model(tmp_path / "m" / "1" / "model.pt")
    config = add_sub_config(in0="B__1", in1="A__0", out0="DIFF__1", out1="SUM__0")
    out = arrays(infer(load(backend, config, path), {"A__0": A, "B__1": B}))
    np.testing.assert_array_equal(out["SUM__0"], A + B)
    np.testing.assert_array_equal(out["DIFF__1"], A - B)


def test_requested_outputs_only(backend: PyTorchBackend, tmp_path: Path) -> None:
    path = torch_models.add_sub_model(tmp_path / "m" / "1" / "model.pt")
    instance = load(backend, add_sub_config(), path)
    out = arrays(infer(instance, {"INPUT__0": A, "INPUT__1": B}, outputs=["OUTPUT__1"]))
    assert list(out) == ["OUTPUT__1"]


def test_bind_by_forward_argument_names(backend: PyTorchBackend, tmp_path: Path) -> None:
    path = torch_models.named_add_sub_model(tmp_path / "m" / "1" / "model.pt")
    # Listed in the other order: names, not positions, decide.
    config = add_sub_config(in0="right", in1="left")
    out = arrays(infer(load(backend, config, path), {"left": A, "right": B}))
    np.testing.assert_array_equal(out["OUTPUT__0"], A + B)
    np.testing.assert_array_equal(out["OUTPUT__1"], A - B)


def test_config_order_when_no_convention_holds(backend: PyTorchBackend, tmp_path: Path) -> None:
    path = torch_models.add_sub_model(tmp_path / "m" / "1" / "model.pt")
    config = add_sub_config(in0="X", in1="Y", out0="TOTAL", out1="DELTA")
    out = arrays(infer(load(backend, config, path), {"X": A, "Y": B}))
    np.testing.assert_array_equal(out["TOTAL"], A + B)
    np.testing.assert_array_equal(out["DELTA"], A - B)


def test_traced_model(backend: PyTorchBackend, tmp_path: Path) -> None:
    example = torch.zeros(2, 4, dtype=torch.float32)
    path = torch_models.traced_add_sub_model(tmp_path / "m" / "1" / "model.pt", example)
    a = A.astype(np.float32)
    out = arrays(
        infer(
            load(backend, add_sub_config(dtype="TYPE_FP32"), path), {"INPUT__0": a, "INPUT__1": a}
        )
    )
    np.testing.assert_allclose(out["OUTPUT__0"], a + a)


def test_dict_outputs_bind_by_name(backend: PyTorchBackend, tmp_path: Path) -> None:
    path = torch_models.dict_output_model(tmp_path / "m" / "1" / "model.pt")
    config = add_sub_config(out0="DIFF", out1="SUM")
    out = arrays(infer(load(backend, config, path), {"INPUT__0": A, "INPUT__1": B}))
    np.testing.assert_array_equal(out["SUM"], A + B)
    np.testing.assert_array_equal(out["DIFF"], A - B)


def test_dict_output_missing_name_fails_the_request(
    backend: PyTorchBackend, tmp_path: Path
) -> None:
    path = torch_models.dict_output_model(tmp_path / "m" / "1" / "model.pt")
    config = add_sub_config(out0="SUM", out1="PRODUCT")
    result = infer(load(backend, config, path), {"INPUT__0": A, "INPUT__1": B})
    assert isinstance(result, TritonError)
    assert result.code == ErrorCode.INTERNAL
    assert "'PRODUCT'" in result.message and "'SUM'" in result.message


def test_dict_input(backend: PyTorchBackend, tmp_path: Path) -> None:
    path = torch_models.dict_input_model(tmp_path / "m" / "1" / "model.pt")
    config = parse_pbtxt(
        'name: "m" max_batch_size: 0\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 3 ] },'
        ' { name: "Y" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'
        'output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'
    )
    x = np.array([1, 2, 3], dtype=np.float32)
    out = arrays(infer(load(backend, config, path), {"X": x, "Y": x}))
    np.testing.assert_allclose(out["OUTPUT__0"], x * x)


def test_strings_as_list_of_str(backend: PyTorchBackend, tmp_path: Path) -> None:
    path = torch_models.string_upper_model(tmp_path / "m" / "1" / "model.pt")
    config = parse_pbtxt(
        'name: "m" max_batch_size: 4\n'
        'input [ { name: "INPUT__0" data_type: TYPE_STRING dims: [ 1 ] } ]\n'
        'output [ { name: "OUTPUT__0" data_type: TYPE_STRING dims: [ 1 ] } ]\n'
    )
    text = np.array([[b"ab"], [b"cd"]], dtype=np.object_)
    result = infer(load(backend, config, path), {"INPUT__0": text})
    assert isinstance(result, InferenceResponse)
    assert result.outputs[0].datatype == "BYTES"
    assert result.outputs[0].data.tolist() == [[b"AB"], [b"CD"]]


def test_bf16_and_readonly_inputs(backend: PyTorchBackend, tmp_path: Path) -> None:
    import ml_dtypes

    path = torch_models.add_sub_model(tmp_path / "m" / "1" / "model.pt")
    instance = load(backend, add_sub_config(dtype="TYPE_BF16"), path)
    a = np.array([[1, 2, 3, 4]], dtype=ml_dtypes.bfloat16)
    a.flags.writeable = False
    out = arrays(infer(instance, {"INPUT__0": a, "INPUT__1": a}))
    assert out["OUTPUT__0"].dtype == ml_dtypes.bfloat16
    assert out["OUTPUT__0"].astype(np.float32).tolist() == [[2, 4, 6, 8]]


def test_readonly_inputs_are_copied(
    backend: PyTorchBackend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # torch warns (once per process) when handed an array it cannot write to.
    path = torch_models.add_sub_model(tmp_path / "m" / "1" / "model.pt")
    instance = load(backend, add_sub_config(), path)
    seen: list[bool] = []
    from_numpy = torch.from_numpy

    def checked(array: np.ndarray) -> torch.Tensor:
        seen.append(array.flags.writeable)
        return from_numpy(array)

    monkeypatch.setattr(torch, "from_numpy", checked)
    a = np.frombuffer(A.tobytes(), dtype=np.int32).reshape(2, 4)
    assert not a.flags.writeable
    out = arrays(infer(instance, {"INPUT__0": a, "INPUT__1": a}))
    np.testing.assert_array_equal(out["OUTPUT__0"], A + A)
    assert seen == [True, True]


# ---------------------------------------------------------------------------------------------
# Per-request errors


def test_model_that_raises_fails_only_its_request(backend: PyTorchBackend, tmp_path: Path) -> None:
    path = torch_models.failing_model(tmp_path / "m" / "1" / "model.pt")
    config = parse_pbtxt(
        'name: "m" max_batch_size: 0\n'
        'input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
        'output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
    )
    instance = load(backend, config, path)
    good = np.array([1, 2], dtype=np.float32)
    bad = np.array([-1, 2], dtype=np.float32)
    requests = [
        InferenceRequest(model_name="m", inputs=[tensor("INPUT__0", data)])
        for data in (good, bad, good)
    ]
    first, second, third = instance.execute(requests)
    assert isinstance(first, InferenceResponse) and isinstance(third, InferenceResponse)
    assert isinstance(second, TritonError)
    assert second.code == ErrorCode.INTERNAL
    assert "PyTorch execute failure" in second.message
    assert "negative input" in second.message


def test_output_dtype_mismatch_names_both(backend: PyTorchBackend, tmp_path: Path) -> None:
    path = torch_models.wrong_dtype_model(tmp_path / "m" / "1" / "model.pt")
    config = parse_pbtxt(
        'name: "m" max_batch_size: 0\n'
        'input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
        'output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
    )
    result = infer(load(backend, config, path), {"INPUT__0": np.zeros(2, dtype=np.float32)})
    assert isinstance(result, TritonError)
    assert result.code == ErrorCode.INTERNAL
    assert "float64" in result.message and "TYPE_FP32" in result.message


# ---------------------------------------------------------------------------------------------
# Load checks


def test_missing_config_inputs_and_outputs(backend: PyTorchBackend, tmp_path: Path) -> None:
    path = torch_models.add_sub_model(tmp_path / "m" / "1" / "model.pt")
    error = load_error(backend, parse_pbtxt('name: "m"'), path)
    assert error.code == ErrorCode.INVALID_ARG
    assert "must list them" in error.message and "output" in error.message
    only_outputs = parse_pbtxt(
        'name: "m"\noutput [ { name: "OUTPUT__0" data_type: TYPE_INT32 dims: [ 4 ] } ]'
    )
    error = load_error(backend, only_outputs, path)
    assert "inputs" in error.message and "['a', 'b']" in error.message


def test_too_few_inputs(backend: PyTorchBackend, tmp_path: Path) -> None:
    path = torch_models.add_sub_model(tmp_path / "m" / "1" / "model.pt")
    config = parse_pbtxt(
        'name: "m"\ninput [ { name: "INPUT__0" data_type: TYPE_INT32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUTPUT__0" data_type: TYPE_INT32 dims: [ 4 ] } ]'
    )
    error = load_error(backend, config, path)
    assert error.code == ErrorCode.INVALID_ARG
    assert "['b']" in error.message


def test_index_out_of_range(backend: PyTorchBackend, tmp_path: Path) -> None:
    path = torch_models.add_sub_model(tmp_path / "m" / "1" / "model.pt")
    error = load_error(backend, add_sub_config(in1="INPUT__2"), path)
    assert "argument 2" in error.message
    error = load_error(backend, add_sub_config(out1="OUTPUT__5"), path)
    assert "returned value 5" in error.message and "2 value(s)" in error.message


def test_string_input_needs_list_of_str(backend: PyTorchBackend, tmp_path: Path) -> None:
    path = torch_models.add_sub_model(tmp_path / "m" / "1" / "model.pt")
    error = load_error(backend, add_sub_config(dtype="TYPE_STRING"), path)
    assert "List[str]" in error.message and "Tensor" in error.message


def test_not_a_torchscript_file(backend: PyTorchBackend, tmp_path: Path) -> None:
    path = tmp_path / "m" / "1" / "model.pt"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a model")
    error = load_error(backend, add_sub_config(), path)
    assert error.code == ErrorCode.INVALID_ARG
    assert "cannot load TorchScript model" in error.message


def test_bad_parameter_value(backend: PyTorchBackend, tmp_path: Path) -> None:
    path = torch_models.add_sub_model(tmp_path / "m" / "1" / "model.pt")
    extra = 'parameters { key: "INFERENCE_MODE" value: { string_value: "maybe" } }'
    error = load_error(backend, add_sub_config(extra=extra), path)
    assert "INFERENCE_MODE" in error.message


def test_kind_gpu_without_cuda(
    backend: PyTorchBackend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    path = torch_models.add_sub_model(tmp_path / "m" / "1" / "model.pt")
    model = backend.load_model(context(add_sub_config(), path))
    gpu = InstanceContext(name="m_0", kind="KIND_GPU", device_id=0, index=0)
    with pytest.raises(TritonError) as caught:
        model.create_instance(gpu)
    assert caught.value.code == ErrorCode.UNAVAILABLE
    assert "KIND_GPU needs CUDA" in caught.value.message


def test_torch_missing(
    backend: PyTorchBackend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    error = load_error(backend, add_sub_config(), tmp_path / "model.pt")
    assert error.code == ErrorCode.UNAVAILABLE
    assert "pip install 'tritonactor[cpu]'" in error.message


# ---------------------------------------------------------------------------------------------
# Parameters and instances


def test_parameters_and_modes(backend: PyTorchBackend, tmp_path: Path) -> None:
    path = torch_models.add_sub_model(tmp_path / "m" / "1" / "model.pt")
    extra = (
        'parameters [ { key: "INFERENCE_MODE" value: { string_value: "false" } },'
        ' { key: "DISABLE_OPTIMIZED_EXECUTION" value: { string_value: "true" } } ]'
    )
    instance = load(backend, add_sub_config(extra=extra), path)
    out = arrays(infer(instance, {"INPUT__0": A, "INPUT__1": B}))
    np.testing.assert_array_equal(out["OUTPUT__0"], A + B)
    # The switch is scoped to the call: this thread's setting is back.
    assert torch._C._get_graph_executor_optimize()


def test_thread_counts_apply_once(
    backend: PyTorchBackend,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    path = torch_models.add_sub_model(tmp_path / "m" / "1" / "model.pt")
    for count in ("2", "3"):
        extra = (
            f'parameters {{ key: "INTRA_OP_THREAD_COUNT" value: {{ string_value: "{count}" }} }}'
        )
        with caplog.at_level(logging.WARNING):
            backend.load_model(context(add_sub_config(extra=extra), path))
    assert calls == [2]
    assert "process-wide" in caplog.text


def test_instances_hold_their_own_module(backend: PyTorchBackend, tmp_path: Path) -> None:
    path = torch_models.add_sub_model(tmp_path / "m" / "1" / "model.pt")
    model = backend.load_model(context(add_sub_config(), path))
    first = model.create_instance(CPU)
    second = model.create_instance(
        InstanceContext(name="m_1", kind="KIND_CPU", device_id=0, index=1)
    )
    assert first.module is not second.module
    first.finalize()
    assert first.module is None
    result = infer(first, {"INPUT__0": A, "INPUT__1": B})
    assert isinstance(result, TritonError) and result.code == ErrorCode.UNAVAILABLE
    shared = backend.load_model(
        context(
            add_sub_config(
                extra='parameters { key: "ENABLE_WEIGHT_SHARING" value: { string_value: "true" } }'
            ),
            path,
        )
    )
    assert shared.create_instance(CPU).module is shared.create_instance(CPU).module


def test_platform_auto_completes(backend: PyTorchBackend, tmp_path: Path) -> None:
    completed = backend.auto_complete_config(parse_pbtxt('name: "m"'), tmp_path)
    assert completed.platform == "pytorch_libtorch"
