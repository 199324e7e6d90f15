"""Model warmup (`model_warmup` in the config): sample requests that each instance executes before
its version is ready, as Triton runs them. A sample that cannot be built, or that fails, fails the
load with its reason."""

from __future__ import annotations

import inspect
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import anyio
import betterproto2
import numpy as np

from tritonactor._proto.inference import ModelConfig, ModelWarmup, ModelWarmupInput
from tritonactor.actors import Reply
from tritonactor.backends.base import BackendInstance, Deferred, ModelContext, Result
from tritonactor.config.model_config import ConfigError
from tritonactor.core.datatypes import (
    config_to_wire,
    deserialize_bytes,
    is_datatype,
    num_elements,
    to_numpy_dtype,
)
from tritonactor.core.errors import TritonError, invalid_arg
from tritonactor.core.paths import inside
from tritonactor.core.types import InferenceRequest, InferenceResponse, ResponseSender, Tensor
from tritonactor.scheduling.messages import Infer
from tritonactor.scheduling.statistics import ExecutionTimes, VersionStatistics

log = logging.getLogger(__name__)

# Where `input_data_file` names are looked up: <model>/warmup/, as in Triton.
WARMUP_FOLDER = "warmup"


@dataclass(frozen=True, slots=True)
class WarmupSample:
    """One `model_warmup` entry, built: `batch_size` requests executed together, `count` times.
    `inputs` are one request's tensors (with a batch dimension of 1 when the model batches)."""

    name: str
    inputs: tuple[Tensor, ...]
    batch_size: int
    count: int

    def requests(self, model: str, version: int) -> list[InferenceRequest]:
        # Fresh requests for every execute (a backend may note things on a request); the
        # arrays are shared, as Triton shares one buffer between a sample's requests.
        return [
            InferenceRequest(
                model,
                str(version),
                inputs=[Tensor(t.name, t.datatype, t.shape, t.data) for t in self.inputs],
                resolved_version=version,
            )
            for _ in range(self.batch_size)
        ]


def warmup_samples(context: ModelContext) -> list[WarmupSample]:
    """The config's warmup samples, with their data (read from `<model>/warmup/` for
    `input_data_file`). Raises ConfigError naming the sample for one that cannot be built. A
    sample of batch_size 0 is skipped, as Triton skips it."""
    config = context.config
    expected = _expected_inputs(config)
    folder = context.model_dir / WARMUP_FOLDER
    batching = config.max_batch_size > 0
    rng = np.random.default_rng()
    samples: list[WarmupSample] = []
    for warmup in config.model_warmup:
        where = f"warmup '{warmup.name}' of model '{context.name}'"
        if warmup.batch_size == 0:
            log.warning("%s has batch_size 0: it is skipped", where)
            continue
        _check_batch_size(where, warmup.batch_size, config.max_batch_size)
        inputs = tuple(
            _tensor(where, name, warmup.inputs[name], expected, batching, folder, rng)
            for name in _ordered(where, warmup, expected)
        )
        missing = [t.name for t in config.input if not t.optional and t.name not in warmup.inputs]
        if missing:  # Triton's warmup request then fails as any request would
            raise ConfigError(
                f"{where}: missing required input(s) {missing}; a warmup sample gives every "
                "input the model requires"
            )
        samples.append(WarmupSample(warmup.name, inputs, warmup.batch_size, max(warmup.count, 1)))
    return samples


async def warm_up(
    instance: BackendInstance,
    context: ModelContext,
    instance_name: str,
    statistics: VersionStatistics | None = None,
) -> None:
    """Run every warmup sample of the model on `instance` (its count times, one after another);
    raise INVALID_ARG `warmup '<name>' of model '<model>' failed: <reason>` at the first failure,
    or ConfigError for a sample that cannot be built. Each execute counts in `statistics`, as
    Triton 2.51 counts its warmup's."""
    if not context.config.model_warmup:
        return
    samples = await anyio.to_thread.run_sync(warmup_samples, context)
    for sample in samples:
        await run_sample(instance, sample, context, statistics)
        log.info(
            "model '%s' instance '%s' ran warmup '%s' %d time(s)",
            context.name,
            instance_name,
            sample.name,
            sample.count,
        )


async def run_sample(
    instance: BackendInstance,
    sample: WarmupSample,
    context: ModelContext,
    statistics: VersionStatistics | None = None,
) -> None:
    """Execute `sample` on `instance` `sample.count` times, each counted in `statistics`;
    any error fails it."""
    policy = context.config.model_transaction_policy
    decoupled = policy is not None and policy.decoupled
    for _ in range(sample.count):
        requests = sample.requests(context.name, context.version)
        answers: list[_Answers] = []
        if decoupled:
            answers = [_Answers() for _ in requests]
            for request, answer in zip(requests, answers, strict=True):
                request.sender = ResponseSender(answer.deliver)
        started = time.perf_counter_ns()
        try:
            results = await _execute(instance, requests)
        except Exception as error:
            raise _failed(sample, context, _describe(error)) from error
        finished = time.perf_counter_ns()
        reasons = _reasons(results, len(requests))
        for result, answer in zip(results, answers, strict=False):
            if result is None:  # the request answers through its sender
                await answer.finished()
                reasons.extend(answer.errors)
        if reasons:
            raise _failed(sample, context, "; ".join(dict.fromkeys(reasons)))
        if statistics is not None:
            batch = [Infer(request, Reply(), started) for request in requests]
            times = ExecutionTimes(started, started, finished, time.perf_counter_ns())
            # (A deferred answer, which the warmup does not wait for, counts as answered.)
            answered = [None if isinstance(r, Deferred) else r for r in results]
            statistics.record_execution(batch, answered, times)


# -- building ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Expected:
    """What the config says of a tensor a warmup may give: a model input's type and dims, or the
    name alone of a sequence control or state input (the sequence batcher shapes those)."""

    datatype: str | None
    dims: tuple[int, ...] | None


_UNCHECKED = _Expected(None, None)


def _expected_inputs(config: ModelConfig) -> dict[str, _Expected]:
    expected = {
        tensor.name: _Expected(config_to_wire(tensor.data_type.name), tuple(tensor.dims))
        for tensor in config.input
    }
    if config.sequence_batching is not None:
        for control in config.sequence_batching.control_input:
            expected.setdefault(control.name, _Expected(None, None))
        for state in config.sequence_batching.state:
            expected.setdefault(state.input_name, _Expected(None, None))
    return expected


def _ordered(where: str, warmup: ModelWarmup, expected: dict[str, _Expected]) -> list[str]:
    # The config's order, not the map's: backends and logs see the same order on every load.
    # An input the model does not have goes to it as given, after the others, as Triton's
    # warmup sends it (a backend that knows its inputs refuses it then, failing the warmup).
    unknown = sorted(name for name in warmup.inputs if name not in expected)
    for name in unknown:
        log.warning(
            "%s: input '%s' is not an input of the model (its inputs: %s); it is sent as given",
            where,
            name,
            ", ".join(repr(known) for known in expected) or "none",
        )
    return [name for name in expected if name in warmup.inputs] + unknown


def _check_batch_size(where: str, batch_size: int, max_batch_size: int) -> None:
    if max_batch_size == 0 and batch_size != 1:
        raise ConfigError(
            f"{where}: batch_size must be 1 for a model that does not batch "
            f"(max_batch_size 0), not {batch_size}"
        )
    if batch_size > max_batch_size > 0:
        raise ConfigError(
            f"{where}: batch_size {batch_size} exceeds the model's max_batch_size {max_batch_size}"
        )


def _tensor(
    where: str,
    name: str,
    spec: ModelWarmupInput,
    expected: dict[str, _Expected],
    batching: bool,
    folder: Path,
    rng: np.random.Generator,
) -> Tensor:
    where = f"{where}, input '{name}'"
    datatype = _datatype(where, spec)
    dims = tuple(spec.dims)
    if any(dim < 0 for dim in dims):
        raise ConfigError(
            f"{where}: dims {list(dims)} must all be >= 0 (a warmup input has a fixed shape)"
        )
    want = expected.get(name, _UNCHECKED)  # (an input the model lacks: as the sample gives it)
    if want.datatype is not None and datatype != want.datatype:
        raise ConfigError(
            f"{where}: data_type is {datatype}, but the model expects {want.datatype}"
        )
    if want.dims is not None and not _matches(dims, want.dims):
        raise ConfigError(
            f"{where}: dims {list(dims)} do not match the model's dims {list(want.dims)}"
        )
    count = num_elements(dims)
    source, _ = betterproto2.which_one_of(spec, "input_data_type")
    if source == "input_data_file":
        assert spec.input_data_file is not None
        data = _file_data(where, folder, spec.input_data_file, datatype, count)
    elif source == "random_data":
        data = _random_data(datatype, count, rng)
    elif source == "zero_data":
        data = _zero_data(datatype, count)
    else:
        raise ConfigError(f"{where}: set one of zero_data, random_data or input_data_file")
    shape = (1, *dims) if batching else dims
    return Tensor(name, datatype, shape, data.reshape(shape))


def _datatype(where: str, spec: ModelWarmupInput) -> str:
    config_name = spec.data_type.name or "TYPE_INVALID"
    datatype = config_to_wire(config_name)
    if config_name == "TYPE_INVALID" or not is_datatype(datatype):
        raise ConfigError(f"{where}: data_type {config_name} cannot be used for warmup data")
    return datatype


def _matches(dims: tuple[int, ...], config_dims: tuple[int, ...]) -> bool:
    return len(dims) == len(config_dims) and all(
        want == -1 or want == got for got, want in zip(dims, config_dims, strict=True)
    )


def _zero_data(datatype: str, count: int) -> np.ndarray:
    if datatype == "BYTES":  # Triton's zeroed buffer reads as elements of length 0
        return np.full(count, b"", dtype=np.object_)
    return np.zeros(count, dtype=to_numpy_dtype(datatype))


def _random_data(datatype: str, count: int, rng: np.random.Generator) -> np.ndarray:
    if datatype == "BYTES":  # as in Triton: random BYTES fall back to zero data
        return _zero_data(datatype, count)
    dtype = to_numpy_dtype(datatype)
    if datatype == "BOOL":
        return rng.integers(0, 2, count).astype(dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, count, dtype=dtype, endpoint=True)
    # Floats in [0, 1): random bits would give NaNs and infinities, which can fail a model that
    # is fine, and warm nothing more.
    # Drawn in float64, a value just under 1 rounds up to 1 in a narrower type (FP16): keep it
    # below, so that the range holds for every type.
    values = rng.random(count).astype(dtype)
    return np.minimum(values, np.nextafter(np.array(1, dtype=dtype), np.array(0, dtype=dtype)))


def _file_data(where: str, folder: Path, file_name: str, datatype: str, count: int) -> np.ndarray:
    # The load checked a caller's config for links leaving the folder already.
    try:
        path = inside(
            folder,
            file_name,
            what=f"{where}: input_data_file '{file_name}'",
            where=f"the model's {WARMUP_FOLDER} folder",
            trust_links=True,
        )
    except TritonError as error:
        raise ConfigError(error.message) from None
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{where}: input_data_file '{file_name}' not found in {folder}") from None
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read input_data_file '{path}': {exc}") from None
    if datatype == "BYTES":
        try:
            return deserialize_bytes(raw, count)
        except ValueError as exc:
            raise ConfigError(f"{where}: input_data_file '{file_name}': {exc}") from None
    dtype = to_numpy_dtype(datatype)
    needed = count * dtype.itemsize
    if len(raw) < needed:
        raise ConfigError(
            f"{where}: input_data_file '{file_name}' holds {len(raw)} bytes, but {count} "
            f"{datatype} element(s) need {needed}"
        )
    # A longer file is read from its start, as Triton reads it. A copy: the bytes object is
    # read-only, and some backends hand arrays to libraries that want to own them.
    return np.frombuffer(raw, dtype=dtype, count=count).copy()


# -- running ----------------------------------------------------------------------------------


async def _execute(instance: BackendInstance, requests: list[InferenceRequest]) -> list[Result]:
    if inspect.iscoroutinefunction(instance.execute):
        return await instance.execute(requests)  # type: ignore[misc]
    return await anyio.to_thread.run_sync(instance.execute, requests)


def _reasons(results: list[Result], expected: int) -> list[str]:
    reasons = [result.message for result in results if isinstance(result, TritonError)]
    if len(results) != expected:
        reasons.append(f"the instance returned {len(results)} responses for {expected} requests")
    return reasons


class _Answers:
    """The answers of one decoupled warmup request, delivered from any thread."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self._done = threading.Event()

    def deliver(
        self, response: InferenceResponse | None, error: TritonError | None, final: bool
    ) -> None:
        if error is not None:
            self.errors.append(error.message)
        if final:
            self._done.set()

    async def finished(self) -> None:
        if not self._done.is_set():
            await anyio.to_thread.run_sync(self._done.wait, abandon_on_cancel=True)


def _failed(sample: WarmupSample, context: ModelContext, reason: str) -> TritonError:
    return invalid_arg(f"warmup '{sample.name}' of model '{context.name}' failed: {reason}")


def _describe(error: BaseException) -> str:
    if isinstance(error, TritonError):
        return error.message
    return str(error) or type(error).__name__
