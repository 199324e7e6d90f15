"""The execute path of the ONNX Runtime backend: one instance's session run on a request, or
on a batch of requests of the same shapes merged into one run, with strings and bfloat16
converted on the way in and out.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
import onnxruntime as ort

from tritonactor._proto.inference import DataType
from tritonactor.backends import batching
from tritonactor.backends.base import (
    BackendInstance,
    ModelContext,
    Result,
    model_reshape,
    reshaped,
    undo_reshape,
)
from tritonactor.backends.onnxruntime.signature import (
    _CONFIG_TYPE_OF_ONNX,
    _sequence_tensors,
    _Signature,
)
from tritonactor.core.datatypes import config_to_wire, from_numpy_dtype, to_numpy_dtype
from tritonactor.core.errors import TritonError, internal, invalid_arg, unavailable
from tritonactor.core.types import (
    OUTPUT_BUFFERS,
    OUTPUTS_IN_PLACE,
    InferenceRequest,
    InferenceResponse,
    Tensor,
)

_BF16_ELEMENT_TYPE = 16  # onnx.TensorProto.BFLOAT16
# The outputs onnxruntime can write into memory given to it: numbers (not strings, and not
# bfloat16, which numpy cannot hand onnxruntime), by their ONNX type.
_NUMPY_OF_ONNX = {
    onnx: to_numpy_dtype(config_to_wire(config.name))
    for onnx, config in _CONFIG_TYPE_OF_ONNX.items()
    if config not in (DataType.TYPE_STRING, DataType.TYPE_BF16)
}
# An output is written in place only into memory this aligned (as onnxruntime's own buffers).
_ALIGNMENT = 64


@dataclass(frozen=True, slots=True)
class _InputPlan:
    name: str
    optional: bool
    is_string: bool
    is_bf16: bool
    # The per-item shape the model wants when the config reshapes this input, and the
    # input's own (the client's).
    reshape: tuple[int, ...] | None
    dims: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class _OutputPlan:
    name: str
    datatype: str
    # The per-item shape the client sees when the config reshapes this output, and the
    # model's.
    dims: tuple[int, ...] | None
    reshape: tuple[int, ...] = ()


class OnnxRuntimeInstance(BackendInstance):
    """One onnxruntime session. The caller runs one `execute` at a time on it."""

    may_run_on_loop = True  # a tiny graph runs in less than the thread hop costs

    def __init__(
        self, context: ModelContext, session: ort.InferenceSession, signature: _Signature
    ) -> None:
        config = context.config
        self.model_name = context.name
        self.model_version = str(context.version)
        self._session: ort.InferenceSession | None = session
        self._batching = config.max_batch_size > 0

        def rank(spec: Any) -> int:
            return len(spec.shape) if spec is not None else -1

        self._inputs = [
            _InputPlan(
                name=t.name,
                optional=t.optional,
                is_string=t.data_type == DataType.TYPE_STRING,
                is_bf16=t.data_type == DataType.TYPE_BF16,
                reshape=model_reshape(t, rank(signature.inputs.get(t.name)), self._batching),
                dims=tuple(t.dims),
            )
            for t in config.input
        ]
        # Control and state inputs, which the sequence batcher adds to each request.
        fed, _ = _sequence_tensors(config)
        self._inputs += [
            _InputPlan(
                name=spec.name,
                optional=True,
                is_string=spec.onnx_type == "tensor(string)",
                is_bf16=spec.onnx_type == "tensor(bfloat16)",
                reshape=None,
            )
            for spec in signature.inputs.values()
            if spec.name in fed
        ]
        self._outputs = {}
        for t in config.output:
            wanted = model_reshape(t, rank(signature.outputs.get(t.name)), self._batching)
            self._outputs[t.name] = _OutputPlan(
                name=t.name,
                datatype=config_to_wire(DataType(t.data_type).name),
                dims=tuple(t.dims) if wanted is not None else None,
                reshape=wanted if wanted is not None else (),
            )
        self._all_outputs = list(self._outputs)
        # What the model declares (a dimension: a number, a name shared with other dimensions,
        # or None): an output's shape worked out from its inputs' before it runs, to be written
        # where it is due (`_run_in_place`). Off for good once a bound run fails where a plain
        # one does not.
        self._input_dims = {meta.name: tuple(meta.shape) for meta in session.get_inputs()}
        self._output_specs = {
            meta.name: (tuple(meta.shape), _NUMPY_OF_ONNX.get(meta.type))
            for meta in session.get_outputs()
        }
        self._in_place = True
        # numpy has no bfloat16 onnxruntime understands: such models run through OrtValues.
        self._bf16 = any(p.is_bf16 for p in self._inputs) or any(
            signature.outputs[name].onnx_type == "tensor(bfloat16)" for name in self._outputs
        )

    @property
    def session(self) -> ort.InferenceSession | None:
        """The onnxruntime session (None once finalized); for inspection, not for running."""
        return self._session

    def execute(self, requests: list[InferenceRequest]) -> list[Result]:
        if not self._batching or len(requests) < 2:
            return [self._execute_one(request) for request in requests]
        results: list[Result] = [None] * len(requests)
        for group in batching.groups(requests):
            members = [requests[index] for index in group]
            answers = self._execute_merged(members) if len(members) > 1 else None
            if answers is None:
                answers = [self._execute_one(request) for request in members]
            for index, answer in zip(group, answers, strict=True):
                results[index] = answer
        return results

    def _execute_merged(self, requests: list[InferenceRequest]) -> list[Result] | None:
        """One session.run for requests of the same shapes; None when that run failed or its
        outputs cannot be split, so that each request runs alone and fails on its own."""
        merged, sizes = batching.merge(requests)
        response = self._execute_one(merged)
        if not isinstance(response, InferenceResponse):
            return None
        try:
            return list(batching.split(response, sizes, requests))
        except TritonError:
            return None

    def finalize(self) -> None:
        self._session = None

    def _execute_one(self, request: InferenceRequest) -> Result:
        session = self._session
        if session is None:
            return unavailable(f"model '{self.model_name}' instance is finalized")
        try:
            feeds = self._feeds(request)
        except TritonError as exc:
            return exc
        except ValueError as exc:  # a reshape the request's shape cannot take
            return invalid_arg(f"model '{self.model_name}': {exc}")
        names = request.requested_output_names or self._all_outputs
        buffers = self._offered(request)
        try:
            if buffers:
                arrays = self._run_in_place(session, names, feeds, buffers, request)
            else:
                arrays = self._run(session, names, feeds)
        except TritonError as exc:
            return exc
        except Exception as exc:
            return internal(
                f"onnx runtime error running model '{self.model_name}' "
                f"version {self.model_version}: {exc}"
            )
        try:
            outputs = [self._output(name, array) for name, array in zip(names, arrays, strict=True)]
        except TritonError as exc:
            return exc
        return InferenceResponse(
            model_name=self.model_name,
            model_version=self.model_version,
            id=request.id,
            outputs=outputs,
        )

    def _feeds(self, request: InferenceRequest) -> dict[str, np.ndarray]:
        feeds: dict[str, np.ndarray] = {}
        for plan in self._inputs:
            tensor = request.input(plan.name)
            if tensor is None:
                if plan.optional:
                    continue
                raise invalid_arg(
                    f"model '{self.model_name}' request is missing input '{plan.name}'"
                )
            data = tensor.data
            if plan.reshape is not None:
                data = reshaped(data, plan.dims, plan.reshape, self._batching)
            if plan.is_string:
                data = _to_onnx_strings(plan.name, data)
            feeds[plan.name] = data
        return feeds

    def _run(
        self, session: ort.InferenceSession, names: list[str], feeds: dict[str, np.ndarray]
    ) -> list[np.ndarray]:
        if not self._bf16:
            return session.run(names, feeds)
        values = {
            name: (
                ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
                    np.ascontiguousarray(data).view(np.uint16), _BF16_ELEMENT_TYPE
                )
                if data.dtype == ml_dtypes.bfloat16
                else ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(data))
            )
            for name, data in feeds.items()
        }
        return [_ortvalue_to_numpy(value) for value in session.run_with_ort_values(names, values)]

    def _offered(self, request: InferenceRequest) -> dict[str, memoryview] | None:
        """Where the request's outputs are due (`OUTPUT_BUFFERS`), when this instance may
        write them there; none when asking fails (the run goes on as usual)."""
        offer = request.context.get(OUTPUT_BUFFERS) if self._in_place and not self._bf16 else None
        if offer is None:
            return None
        try:
            buffers: dict[str, memoryview] = offer(request)
        except Exception:
            return None
        return buffers

    def _run_in_place(
        self,
        session: ort.InferenceSession,
        names: list[str],
        feeds: dict[str, np.ndarray],
        buffers: dict[str, memoryview],
        request: InferenceRequest,
    ) -> list[np.ndarray]:
        """The run, with every requested output written by onnxruntime straight into the
        buffer it is due in (a client's shared memory: nothing to copy there afterwards) when
        each has one that holds the shape the model declares, worked out from the inputs'
        shapes; as usual otherwise. The bytes so written go in `OUTPUTS_IN_PLACE`."""
        outputs = self._placed_outputs(names, feeds, buffers)
        if outputs is None:
            return session.run(names, feeds)
        binding = session.io_binding()
        try:
            for name, data in feeds.items():
                binding.bind_cpu_input(name, data)
            for name, array in zip(names, outputs, strict=True):
                binding.bind_output(name, "cpu", 0, array.dtype, array.shape, array.ctypes.data)
            session.run_with_iobinding(binding)
        except Exception:
            arrays: list[np.ndarray] = session.run(names, feeds)  # the model's own error, if any
            # It runs, but not into what its declared shapes promised: as usual from now on.
            self._in_place = False
            return arrays
        written = 0
        for index, value in enumerate(binding.get_outputs()):
            array = outputs[index]
            if value.data_ptr() == array.ctypes.data:
                written += array.nbytes
            else:  # onnxruntime answered with other memory (an output that is an input),
                outputs[index] = value.numpy().copy()  # which its array would not keep alive
        request.context[OUTPUTS_IN_PLACE] = written
        return outputs

    def _placed_outputs(
        self, names: list[str], feeds: dict[str, np.ndarray], buffers: dict[str, memoryview]
    ) -> list[np.ndarray] | None:
        """Each requested output as an array over the buffer it is due in, in the shape the
        model declares for it; None when one has no such array."""
        sizes: dict[Any, int] = {}
        for name, data in feeds.items():
            declared = self._input_dims.get(name)
            if (
                declared is None
                or len(declared) != data.ndim
                or data.dtype.kind == "O"
                or not data.flags.c_contiguous
            ):
                return None
            for dim, size in zip(declared, data.shape, strict=True):
                if isinstance(dim, str) and sizes.setdefault(dim, size) != size:
                    return None
        outputs = []
        for name in names:
            buffer = buffers.get(name)
            declared, dtype = self._output_specs.get(name, ((), None))
            if buffer is None or dtype is None:
                return None
            shape = []
            for dim in declared:
                size = dim if isinstance(dim, int) else sizes.get(dim)
                if size is None or size < 0:
                    return None
                shape.append(size)
            count = math.prod(shape)
            if count == 0 or count * dtype.itemsize > buffer.nbytes:
                return None
            array = np.frombuffer(buffer, dtype, count).reshape(shape)
            if array.ctypes.data % _ALIGNMENT or any(
                np.may_share_memory(array, data) for data in feeds.values()
            ):
                return None
            outputs.append(array)
        return outputs

    def _output(self, name: str, array: np.ndarray) -> Tensor:
        plan = self._outputs.get(name)
        if plan is None:
            datatype = from_numpy_dtype(array.dtype)
        else:
            datatype = plan.datatype
            array = undo_reshape(
                self.model_name, name, array, plan.dims, self._batching, plan.reshape
            )
        if datatype == "BYTES":
            array = _from_onnx_strings(array)
        return Tensor(name=name, datatype=datatype, shape=tuple(array.shape), data=array)


def _to_onnx_strings(name: str, data: np.ndarray) -> np.ndarray:
    # onnxruntime takes string tensors as `str` and would stringify `bytes` as "b'...'".
    flat = data.reshape(-1)
    text = np.empty(flat.shape, dtype=np.object_)
    try:
        for i, item in enumerate(flat):
            text[i] = item.decode("utf-8") if isinstance(item, bytes | bytearray) else str(item)
    except UnicodeDecodeError as exc:
        raise invalid_arg(
            f"input '{name}' element {i} is not UTF-8 ({exc.reason}); ONNX string tensors "
            "hold UTF-8 text"
        ) from None
    return text.reshape(data.shape)


def _from_onnx_strings(array: np.ndarray) -> np.ndarray:
    out = np.empty(array.size, dtype=np.object_)
    for i, item in enumerate(array.reshape(-1)):
        out[i] = item.encode("utf-8") if isinstance(item, str) else bytes(item)
    return out.reshape(array.shape)


def _ortvalue_to_numpy(value: ort.OrtValue) -> np.ndarray:
    if value.data_type() != "tensor(bfloat16)":
        return value.numpy()
    # onnxruntime cannot hand bfloat16 to numpy; copy the raw 16-bit words instead.
    if value.device_name().lower() != "cpu":
        raise internal("a bfloat16 output left on the GPU cannot be returned yet")
    shape = tuple(value.shape())
    count = int(np.prod(shape, dtype=np.int64))
    if count == 0:
        return np.empty(shape, dtype=ml_dtypes.bfloat16)
    words = (ctypes.c_uint16 * count).from_address(value.data_ptr())
    return np.ctypeslib.as_array(words).copy().view(ml_dtypes.bfloat16).reshape(shape)
