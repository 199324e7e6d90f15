"""Model warmup: building the samples from `model_warmup` (zero, random and file data, batch
sizes, validation) and running them on an instance, alone and inside the model-version actor."""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import numpy as np
import pytest

from tritonactor.actors import ActorSystem
from tritonactor.backends.base import (
    Backend,
    BackendInstance,
    BackendModel,
    Deferred,
    InstanceContext,
    InstanceDied,
    ModelContext,
    Result,
)
from tritonactor.config.model_config import ConfigError, parse_pbtxt
from tritonactor.config.normalize import fill_defaults
from tritonactor.core.datatypes import serialize_bytes
from tritonactor.core.errors import ErrorCode, TritonError, invalid_arg
from tritonactor.core.types import InferenceRequest, InferenceResponse, Tensor
from tritonactor.scheduling.model import ModelVersionActor
from tritonactor.scheduling.router import ModelHandle, Router
from tritonactor.scheduling.signature import ModelSignature
from tritonactor.scheduling.statistics import VersionStatistics
from tritonactor.scheduling.warmup import WarmupSample, run_sample, warm_up, warmup_samples

pytestmark = pytest.mark.anyio

# Bounds a wait for an event that is bound to happen: reached only when something is broken.
WAIT = 30

# Inputs optional: each sample below gives some of them (one that leaves out a required input
# is refused: test_a_sample_without_a_required_input_is_refused).
BATCHING = """
name: "m"
max_batch_size: 4
input [
  { name: "F" data_type: TYPE_FP32 dims: [ 3 ] optional: true },
  { name: "I" data_type: TYPE_INT64 dims: [ 2, -1 ] optional: true },
  { name: "S" data_type: TYPE_STRING dims: [ 2 ] optional: true },
  { name: "B" data_type: TYPE_BOOL dims: [ 1 ] optional: true }
]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

NON_BATCHING = """
name: "m"
max_batch_size: 0
input [
  { name: "H" data_type: TYPE_FP16 dims: [ 2 ] optional: true },
  { name: "U" data_type: TYPE_UINT8 dims: [ 3 ] optional: true },
  { name: "S" data_type: TYPE_STRING dims: [ 2 ] optional: true }
]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""


def make_context(text: str, model_dir: Path) -> ModelContext:
    config = fill_defaults(parse_pbtxt(text), gpus=0)
    return ModelContext(config.name, 1, config, model_dir, model_dir / "1", model_dir / "1" / "m")


def by_name(sample: WarmupSample) -> dict[str, Tensor]:
    return {tensor.name: tensor for tensor in sample.inputs}


# -- building ---------------------------------------------------------------------------------


def test_zero_data_of_every_kind_with_a_batch_dimension(tmp_path: Path) -> None:
    warmup = """
    model_warmup [ {
      name: "zeros" batch_size: 3 count: 2
      inputs { key: "S" value: { data_type: TYPE_STRING dims: [ 2 ] zero_data: true } }
      inputs { key: "F" value: { data_type: TYPE_FP32 dims: [ 3 ] zero_data: true } }
      inputs { key: "I" value: { data_type: TYPE_INT64 dims: [ 2, 5 ] zero_data: false } }
      inputs { key: "B" value: { data_type: TYPE_BOOL dims: [ 1 ] zero_data: true } }
    } ]
    """
    [sample] = warmup_samples(make_context(BATCHING + warmup, tmp_path))
    assert (sample.name, sample.batch_size, sample.count) == ("zeros", 3, 2)
    # The config's order, whatever the map's; a batch dimension of 1 on each request's tensors.
    assert [t.name for t in sample.inputs] == ["F", "I", "S", "B"]
    tensors = by_name(sample)
    assert [(t.datatype, t.shape) for t in sample.inputs] == [
        ("FP32", (1, 3)),
        ("INT64", (1, 2, 5)),
        ("BYTES", (1, 2)),
        ("BOOL", (1, 1)),
    ]
    np.testing.assert_array_equal(tensors["F"].data, np.zeros((1, 3), np.float32))
    assert tensors["F"].data.dtype == np.float32
    assert tensors["I"].data.dtype == np.int64 and not tensors["I"].data.any()
    assert tensors["S"].data.dtype == np.object_
    assert tensors["S"].data.tolist() == [[b"", b""]]
    assert tensors["B"].data.tolist() == [[False]]


def test_batch_size_requests_count_defaults_and_batch_size_zero_is_skipped(
    tmp_path: Path,
) -> None:
    warmup = """
    model_warmup [
      { name: "skipped" batch_size: 0
        inputs { key: "F" value: { data_type: TYPE_FP32 dims: [ 3 ] zero_data: true } } },
      { name: "once" batch_size: 4
        inputs { key: "F" value: { data_type: TYPE_FP32 dims: [ 3 ] zero_data: true } } }
    ]
    """
    [sample] = warmup_samples(make_context(BATCHING + warmup, tmp_path))
    assert (sample.name, sample.count) == ("once", 1)  # count 0 means once
    requests = sample.requests("m", 1)
    assert len(requests) == 4
    assert {(r.model_name, r.model_version, r.resolved_version) for r in requests} == {
        ("m", "1", 1)
    }
    # Each request its own objects, sharing the sample's data.
    assert requests[0].inputs[0] is not requests[1].inputs[0]
    assert requests[0].inputs[0].data is requests[1].inputs[0].data


def test_random_data_has_the_type_and_shape_and_bytes_fall_back_to_zero(tmp_path: Path) -> None:
    config = """
    name: "r"
    max_batch_size: 0
    input [
      { name: "I8" data_type: TYPE_INT8 dims: [ 64 ] },
      { name: "U64" data_type: TYPE_UINT64 dims: [ 64 ] },
      { name: "H" data_type: TYPE_FP16 dims: [ 64 ] },
      { name: "D" data_type: TYPE_FP64 dims: [ 8, 8 ] },
      { name: "B" data_type: TYPE_BOOL dims: [ 64 ] },
      { name: "S" data_type: TYPE_STRING dims: [ 3 ] }
    ]
    output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
    model_warmup [ {
      name: "random" batch_size: 1
      inputs { key: "I8" value: { data_type: TYPE_INT8 dims: [ 64 ] random_data: true } }
      inputs { key: "U64" value: { data_type: TYPE_UINT64 dims: [ 64 ] random_data: true } }
      inputs { key: "H" value: { data_type: TYPE_FP16 dims: [ 64 ] random_data: true } }
      inputs { key: "D" value: { data_type: TYPE_FP64 dims: [ 8, 8 ] random_data: true } }
      inputs { key: "B" value: { data_type: TYPE_BOOL dims: [ 64 ] random_data: true } }
      inputs { key: "S" value: { data_type: TYPE_STRING dims: [ 3 ] random_data: true } }
    } ]
    """
    [sample] = warmup_samples(make_context(config, tmp_path))
    tensors = by_name(sample)
    expected = {
        "I8": (np.int8, (64,)),
        "U64": (np.uint64, (64,)),
        "H": (np.float16, (64,)),
        "D": (np.float64, (8, 8)),
        "B": (np.bool_, (64,)),
        "S": (np.object_, (3,)),
    }
    for name, (dtype, shape) in expected.items():
        assert tensors[name].data.dtype == dtype, name
        assert tensors[name].shape == shape == tensors[name].data.shape, name
    assert len(set(tensors["I8"].data.tolist())) > 1  # random, not constant
    assert len(set(tensors["U64"].data.tolist())) > 1
    for name in ("H", "D"):
        data = tensors[name].data.astype(np.float64)
        assert np.isfinite(data).all() and (data >= 0).all() and (data < 1).all()
    assert tensors["S"].data.tolist() == [b"", b"", b""]


def test_file_data_from_the_warmup_folder_without_batching(tmp_path: Path) -> None:
    folder = tmp_path / "warmup"
    folder.mkdir()
    halves = np.array([1.5, -2.0], np.float16)
    (folder / "h.bin").write_bytes(halves.tobytes())
    # A longer file is read from its start.
    (folder / "u.bin").write_bytes(bytes([7, 8, 9, 10, 11]))
    strings = np.array([b"hello", "wörld".encode()], dtype=object)
    (folder / "nested").mkdir()
    (folder / "nested" / "s.bin").write_bytes(serialize_bytes(strings))
    warmup = """
    model_warmup [ {
      name: "files" batch_size: 1
      inputs { key: "H" value: { data_type: TYPE_FP16 dims: [ 2 ] input_data_file: "h.bin" } }
      inputs { key: "U" value: { data_type: TYPE_UINT8 dims: [ 3 ] input_data_file: "u.bin" } }
      inputs {
        key: "S" value: { data_type: TYPE_STRING dims: [ 2 ] input_data_file: "nested/s.bin" }
      }
    } ]
    """
    [sample] = warmup_samples(make_context(NON_BATCHING + warmup, tmp_path))
    tensors = by_name(sample)
    assert tensors["H"].shape == (2,)  # no batch dimension: the model does not batch
    np.testing.assert_array_equal(tensors["H"].data, halves)
    assert tensors["U"].data.tolist() == [7, 8, 9]
    assert tensors["U"].data.flags.writeable
    assert tensors["S"].datatype == "BYTES"
    assert tensors["S"].data.tolist() == [b"hello", "wörld".encode()]


def test_file_data_gets_the_batch_dimension_too(tmp_path: Path) -> None:
    (tmp_path / "warmup").mkdir()
    values = np.arange(6, dtype=np.int64)
    (tmp_path / "warmup" / "i.bin").write_bytes(values.tobytes())
    warmup = """
    model_warmup [ { name: "file" batch_size: 2
      inputs { key: "I" value: { data_type: TYPE_INT64 dims: [ 2, 3 ] input_data_file: "i.bin" } }
    } ]
    """
    [sample] = warmup_samples(make_context(BATCHING + warmup, tmp_path))
    np.testing.assert_array_equal(sample.inputs[0].data, values.reshape(1, 2, 3))


def test_sequence_control_inputs_may_be_given(tmp_path: Path) -> None:
    config = """
    name: "seq"
    max_batch_size: 2
    input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
    output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
    sequence_batching {
      control_input [ { name: "START" control [ { kind: CONTROL_SEQUENCE_START
                                                  int32_false_true: [ 0, 1 ] } ] } ]
    }
    model_warmup [ { name: "seq" batch_size: 1
      inputs { key: "X" value: { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true } }
      inputs { key: "START" value: { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true } }
    } ]
    """
    [sample] = warmup_samples(make_context(config, tmp_path))
    assert [(t.name, t.shape) for t in sample.inputs] == [("X", (1, 1)), ("START", (1, 1))]


def test_an_input_the_model_does_not_have_is_sent_as_given(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # As Triton 2.51's warmup does (it loads such a model): the backend may refuse it.
    extra = 'inputs { key: "NOPE" value: { data_type: TYPE_INT8 dims: [ 2 ] zero_data: true } }'
    config = BATCHING + (
        f'model_warmup [ {{ name: "extra" batch_size: 1 {ZERO_F} {extra} }}, '
        f'{{ name: "again" batch_size: 1 {ZERO_F} {extra} }} ]'
    )
    with caplog.at_level(logging.WARNING):
        samples = warmup_samples(make_context(config, tmp_path))
    for sample in samples:
        assert [(t.name, t.datatype, t.shape) for t in sample.inputs] == [
            ("F", "FP32", (1, 3)),
            ("NOPE", "INT8", (1, 2)),
        ]
    # Each sample says so (the model's inputs stay the model's for the next one).
    assert caplog.text.count("input 'NOPE' is not an input of the model (its inputs: 'F',") == 2


def invalid(tmp_path: Path, config: str, inputs: str, batch_size: int = 1) -> str:
    text = config + f'model_warmup [ {{ name: "bad" batch_size: {batch_size} {inputs} }} ]'
    with pytest.raises(ConfigError) as caught:
        warmup_samples(make_context(text, tmp_path))
    return str(caught.value)


ZERO_F = 'inputs { key: "F" value: { data_type: TYPE_FP32 dims: [ 3 ] zero_data: true } }'


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        (
            'inputs { key: "I" value: { data_type: TYPE_INT64 dims: [ 2, -1 ] zero_data: true } }',
            "warmup 'bad' of model 'm', input 'I': dims [2, -1] must all be >= 0",
        ),
        (
            'inputs { key: "F" value: { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } }',
            "warmup 'bad' of model 'm', input 'F': dims [4] do not match the model's dims [3]",
        ),
        (
            'inputs { key: "F" value: { data_type: TYPE_FP64 dims: [ 3 ] zero_data: true } }',
            "warmup 'bad' of model 'm', input 'F': data_type is FP64, but the model expects FP32",
        ),
        (
            'inputs { key: "F" value: { dims: [ 3 ] zero_data: true } }',
            "warmup 'bad' of model 'm', input 'F': data_type TYPE_INVALID cannot be used",
        ),
        (
            'inputs { key: "F" value: { data_type: TYPE_FP32 dims: [ 3 ] } }',
            "warmup 'bad' of model 'm', input 'F': set one of zero_data, random_data or "
            "input_data_file",
        ),
        (
            'inputs { key: "F" value: { data_type: TYPE_FP32 dims: [ 3 ] '
            'input_data_file: "missing.bin" } }',
            "warmup 'bad' of model 'm', input 'F': input_data_file 'missing.bin' not found in ",
        ),
        (
            'inputs { key: "F" value: { data_type: TYPE_FP32 dims: [ 3 ] '
            'input_data_file: "short.bin" } }',
            "warmup 'bad' of model 'm', input 'F': input_data_file 'short.bin' holds 8 bytes, "
            "but 3 FP32 element(s) need 12",
        ),
        (
            'inputs { key: "S" value: { data_type: TYPE_STRING dims: [ 2 ] '
            'input_data_file: "three.bin" } }',
            "warmup 'bad' of model 'm', input 'S': input_data_file 'three.bin': BYTES data "
            "holds more than 2 elements, expected 2",
        ),
        (
            'inputs { key: "S" value: { data_type: TYPE_STRING dims: [ 2 ] '
            'input_data_file: "short.bin" } }',
            "warmup 'bad' of model 'm', input 'S': input_data_file 'short.bin': BYTES element "
            "of 1065353216 bytes runs past the end of the data",
        ),
        (
            'inputs { key: "F" value: { data_type: TYPE_FP32 dims: [ 3 ] '
            'input_data_file: "../config.pbtxt" } }',
            "warmup 'bad' of model 'm', input 'F': input_data_file '../config.pbtxt' is outside "
            "the model's warmup folder",
        ),
    ],
)
def test_a_sample_that_cannot_be_built_names_itself_and_the_reason(
    tmp_path: Path, inputs: str, message: str
) -> None:
    (tmp_path / "warmup").mkdir()
    (tmp_path / "warmup" / "short.bin").write_bytes(np.ones(2, np.float32).tobytes())
    three = np.array([b"a", b"b", b"c"], dtype=object)
    (tmp_path / "warmup" / "three.bin").write_bytes(serialize_bytes(three))
    (tmp_path / "config.pbtxt").write_text("name: 'm'")
    assert message in invalid(tmp_path, BATCHING, inputs)


def test_a_sample_without_a_required_input_is_refused(tmp_path: Path) -> None:
    """Triton runs a warmup sample as a request, which fails without a required input."""
    required = BATCHING.replace("dims: [ 3 ] optional: true", "dims: [ 3 ]")
    zero_s = 'inputs { key: "S" value: { data_type: TYPE_STRING dims: [ 2 ] zero_data: true } }'
    assert invalid(tmp_path, required, zero_s) == (
        "warmup 'bad' of model 'm': missing required input(s) ['F']; a warmup sample gives "
        "every input the model requires"
    )
    assert warmup_samples(make_context(required + WARMUP_F, tmp_path))


WARMUP_F = f'model_warmup [ {{ name: "ok" batch_size: 1 {ZERO_F} }} ]'


def test_batch_size_must_fit_the_model(tmp_path: Path) -> None:
    assert invalid(tmp_path, BATCHING, ZERO_F, batch_size=5) == (
        "warmup 'bad' of model 'm': batch_size 5 exceeds the model's max_batch_size 4"
    )
    zero_u = 'inputs { key: "U" value: { data_type: TYPE_UINT8 dims: [ 3 ] zero_data: true } }'
    assert invalid(tmp_path, NON_BATCHING, zero_u, batch_size=2) == (
        "warmup 'bad' of model 'm': batch_size must be 1 for a model that does not batch "
        "(max_batch_size 0), not 2"
    )


# -- running on one instance ------------------------------------------------------------------


class Recorder(BackendInstance):
    """Records each execute's requests; a request whose first input holds `fail_on` fails."""

    def __init__(self, fail_on: float | None = None) -> None:
        self.batches: list[list[InferenceRequest]] = []
        self.fail_on = fail_on

    def execute(self, requests: list[InferenceRequest]) -> list[Result]:
        self.batches.append(requests)
        results: list[Result] = []
        for request in requests:
            if request.inputs and request.inputs[0].data.flat[0] == self.fail_on:
                results.append(invalid_arg("this value is refused"))
            else:
                results.append(InferenceResponse(request.model_name, request.model_version))
        return results


class AsyncRecorder(Recorder):
    async def execute(self, requests: list[InferenceRequest]) -> list[Result]:  # type: ignore[override]
        await anyio.sleep(0)
        return Recorder.execute(self, requests)


WARMUPS = """
model_warmup [
  { name: "twice" batch_size: 2 count: 2
    inputs { key: "F" value: { data_type: TYPE_FP32 dims: [ 3 ] zero_data: true } } },
  { name: "once" batch_size: 1
    inputs { key: "S" value: { data_type: TYPE_STRING dims: [ 2 ] zero_data: true } } }
]
"""


@pytest.mark.parametrize("instance_class", [Recorder, AsyncRecorder])
async def test_every_sample_runs_count_times_in_order(
    tmp_path: Path, instance_class: type[Recorder]
) -> None:
    instance = instance_class()
    await warm_up(instance, make_context(BATCHING + WARMUPS, tmp_path), "m_0_0")
    assert [len(batch) for batch in instance.batches] == [2, 2, 1]
    assert [[t.name for t in batch[0].inputs] for batch in instance.batches] == [
        ["F"],
        ["F"],
        ["S"],
    ]
    assert instance.batches[0][0] is not instance.batches[1][0]  # fresh requests each time


async def test_a_model_without_warmup_is_not_executed(tmp_path: Path) -> None:
    instance = Recorder()
    await warm_up(instance, make_context(BATCHING, tmp_path), "m_0_0")
    assert instance.batches == []


async def test_an_error_response_fails_the_warmup_with_its_reason(tmp_path: Path) -> None:
    instance = Recorder(fail_on=0.0)
    with pytest.raises(TritonError) as caught:
        await warm_up(instance, make_context(BATCHING + WARMUPS, tmp_path), "m_0_0")
    assert caught.value.code is ErrorCode.INVALID_ARG
    # Both requests of the batch failed alike: the reason is given once.
    assert caught.value.message == "warmup 'twice' of model 'm' failed: this value is refused"
    assert len(instance.batches) == 1  # the first failure ends the warmup


class Raising(BackendInstance):
    def __init__(self, error: Exception) -> None:
        self.error = error

    def execute(self, requests: list[InferenceRequest]) -> list[Result]:
        raise self.error


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (ValueError("the model is broken"), "the model is broken"),
        (InstanceDied("the process exited with 1"), "the process exited with 1"),
        (TritonError(ErrorCode.INTERNAL, "internal trouble"), "internal trouble"),
    ],
)
async def test_an_exception_fails_the_warmup_with_its_reason(
    tmp_path: Path, error: Exception, reason: str
) -> None:
    with pytest.raises(TritonError) as caught:
        await warm_up(Raising(error), make_context(BATCHING + WARMUPS, tmp_path), "m_0_0")
    assert caught.value.message == f"warmup 'twice' of model 'm' failed: {reason}"
    assert caught.value.__cause__ is error


class Short(BackendInstance):
    def execute(self, requests: list[InferenceRequest]) -> list[Result]:
        return []


async def test_too_few_results_fail_the_warmup(tmp_path: Path) -> None:
    with pytest.raises(TritonError, match="the instance returned 0 responses for 2 requests"):
        await warm_up(Short(), make_context(BATCHING + WARMUPS, tmp_path), "m_0_0")


class LateSender(BackendInstance):
    """A decoupled instance: answers every request from another thread, after execute returned;
    the answer is an error for `fail_on`."""

    def __init__(self, fail_on: float | None = None) -> None:
        self.fail_on = fail_on
        self.finals = 0

    def execute(self, requests: list[InferenceRequest]) -> list[Result]:
        def answer() -> None:
            for request in requests:
                assert request.sender is not None
                request.sender.send(InferenceResponse(request.model_name, "1"))
                error = None
                if request.inputs[0].data.flat[0] == self.fail_on:
                    error = invalid_arg("decoupled trouble")
                request.sender.send(error=error, final=True)
                self.finals += 1

        threading.Timer(0.05, answer).start()
        return [None] * len(requests)


DECOUPLED = BATCHING + "model_transaction_policy { decoupled: true }\n" + WARMUPS


async def test_a_decoupled_warmup_waits_for_the_final_answers(tmp_path: Path) -> None:
    instance = LateSender()
    with anyio.fail_after(WAIT):
        await warm_up(instance, make_context(DECOUPLED, tmp_path), "m_0_0")
    assert instance.finals == 5


async def test_a_decoupled_warmup_fails_on_an_error_answer(tmp_path: Path) -> None:
    with anyio.fail_after(WAIT), pytest.raises(TritonError) as caught:
        await warm_up(LateSender(fail_on=0.0), make_context(DECOUPLED, tmp_path), "m_0_0")
    assert caught.value.message == "warmup 'twice' of model 'm' failed: decoupled trouble"


class Deferring(Recorder):
    """Answers each request later (a python model's response sender after execute)."""

    def execute(self, requests: list[InferenceRequest]) -> list[Result]:
        self.batches.append(requests)
        return [Deferred() for _ in requests]


@pytest.mark.parametrize("instance_class", [Recorder, Deferring])
async def test_warmup_executes_count_in_the_statistics(
    tmp_path: Path, instance_class: type[Recorder]
) -> None:
    # As Triton 2.51 counts its warmup's: each execute an execution, each request an
    # inference and a success, by batch size (a deferred answer counts as answered).
    stats = VersionStatistics(batching=True)
    context = make_context(BATCHING + WARMUPS, tmp_path)
    await warm_up(instance_class(), context, "m_0_0", stats)
    assert (stats.execution_count, stats.inference_count) == (3, 5)
    assert (stats.success.count, stats.fail.count) == (5, 0)
    assert [(b.batch_size, b.compute_infer.count) for b in stats.batch_stats] == [(1, 1), (2, 2)]


async def test_run_sample_takes_a_built_sample(tmp_path: Path) -> None:
    context = make_context(BATCHING, tmp_path)
    data = np.ones((1, 3), np.float32)
    sample = WarmupSample("built", (Tensor("F", "FP32", (1, 3), data),), batch_size=3, count=2)
    instance = Recorder()
    await run_sample(instance, sample, context)
    assert [len(batch) for batch in instance.batches] == [3, 3]


# -- inside the model-version actor -----------------------------------------------------------


class Warmable(BackendInstance):
    def __init__(self, backend: WarmableBackend, name: str) -> None:
        self.backend = backend
        self.name = name

    def execute(self, requests: list[InferenceRequest]) -> list[Result]:
        value = float(requests[0].inputs[0].data.flat[0])
        self.backend.executed.append((self.name, value))
        if value < 0:
            raise InstanceDied(f"instance '{self.name}' was asked to die")
        if value == self.backend.fail_on:
            return [invalid_arg("warmup value refused")] * len(requests)
        return [InferenceResponse(r.model_name, r.model_version) for r in requests]

    def finalize(self) -> None:
        self.backend.finalized.append(self.name)


class WarmableModel(BackendModel):
    def __init__(self, backend: WarmableBackend) -> None:
        self.backend = backend

    def create_instance(self, context: InstanceContext) -> BackendInstance:
        self.backend.created.append(context.name)
        return Warmable(self.backend, context.name)

    def finalize(self) -> None:
        self.backend.finalized.append("model")


class WarmableBackend(Backend):
    name = "warmable"

    def __init__(self, fail_on: float | None = None) -> None:
        self.fail_on = fail_on
        self.created: list[str] = []
        self.executed: list[tuple[str, float]] = []
        self.finalized: list[str] = []

    def load_model(self, context: ModelContext) -> BackendModel:
        return WarmableModel(self)


ACTOR_CONFIG = """
name: "w"
max_batch_size: 2
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
model_warmup [ { name: "zeros" batch_size: 1 count: 3
  inputs { key: "X" value: { data_type: TYPE_FP32 dims: [ 1 ] zero_data: true } } } ]
"""


@pytest.fixture
async def system() -> AsyncIterator[ActorSystem]:
    async with ActorSystem() as actors:
        yield actors


async def test_every_instance_is_warmed_up_before_the_version_is_ready(
    system: ActorSystem, tmp_path: Path
) -> None:
    backend = WarmableBackend()
    await system.spawn(ModelVersionActor(backend, make_context(ACTOR_CONFIG, tmp_path)))
    assert backend.executed == [("w_0_0", 0.0)] * 3 + [("w_0_1", 0.0)] * 3


async def test_a_failing_warmup_fails_the_load_and_releases_everything(
    system: ActorSystem, tmp_path: Path
) -> None:
    backend = WarmableBackend(fail_on=0.0)
    with pytest.raises(TritonError) as caught:
        await system.spawn(ModelVersionActor(backend, make_context(ACTOR_CONFIG, tmp_path)))
    assert caught.value.message == "warmup 'zeros' of model 'w' failed: warmup value refused"
    assert backend.created == ["w_0_0"]
    assert backend.finalized == ["w_0_0", "model"]


async def test_an_instance_restarted_after_a_crash_is_warmed_up_again(
    system: ActorSystem, tmp_path: Path
) -> None:
    backend = WarmableBackend()
    context = make_context(ACTOR_CONFIG.replace("count: 2", "count: 1"), tmp_path)
    actor = ModelVersionActor(backend, context)
    await system.spawn(actor)
    assert actor.scheduler is not None
    router = Router()
    router.known.add("w")
    signature = ModelSignature.from_config(context.config)
    router.add(ModelHandle("w", 1, context.config, signature, actor.scheduler))

    def request(value: float) -> InferenceRequest:
        data = np.full((1, 1), value, np.float32)
        return InferenceRequest("w", inputs=[Tensor("X", "FP32", (1, 1), data)])

    with pytest.raises(TritonError, match="was asked to die"):
        await router.infer(request(-1.0))
    with anyio.fail_after(WAIT):
        await router.infer(request(5.0))  # waits in the queue for the replacement
    assert backend.created == ["w_0_0", "w_0_0"]
    assert backend.executed == (
        [("w_0_0", 0.0)] * 3 + [("w_0_0", -1.0)] + [("w_0_0", 0.0)] * 3 + [("w_0_0", 5.0)]
    )
