"""How messages cross between a front-end process and the engine: frames of pickle protocol 5.

A frame is a 20-byte header (the pickle's length, the number of out-of-band buffers, the total
bytes of those buffers), the pickle, then each buffer preceded by its 8-byte length. A tensor of
numbers crosses as its raw bytes (numpy's own pickling costs several times more); one of at
least `OUT_OF_BAND` bytes as an out-of-band buffer, written to the socket from the tensor's own
memory. The receiver copies each such buffer once out of what it read (so that the tensor
outlives the read buffer) and the array is a read-only view of that copy.

What a request carries that only makes sense in its own process is left behind when it is
pickled: its `context` (a front end's shared-memory lease), its response sender (the engine
gives it a sender of its own, which streams back), and its trace (it crosses as its W3C
carrier, which the engine continues)."""

from __future__ import annotations

import copyreg
import dataclasses
import hashlib
import io
import operator
import pickle
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tritonactor import __version__
from tritonactor.core.datatypes import to_numpy_dtype
from tritonactor.core.errors import ErrorCode, TritonError
from tritonactor.core.types import InferenceRequest, InferenceResponse, RequestedOutput, Tensor
from tritonactor.engine import messages
from tritonactor.scheduling.statistics import FirstResponseHistogram

# The version of the messages and frames: tritonactor's, and a digest of the modules that
# define them. A front end and an engine that differ (an upgrade while a server runs) refuse
# each other at once instead of failing on the first frame that does not decode.
PROTOCOL = (
    f"{__version__}+"
    + hashlib.sha256(
        b"".join(
            Path(module).read_bytes()
            for module in (__file__, str(Path(__file__).with_name("messages.py")))
        )
    ).hexdigest()[:12]
)

# Smaller tensors are cheaper inside the pickle than as a buffer of their own.
OUT_OF_BAND = 64 * 1024

HEADER = struct.Struct("<QIQ")
LENGTH = struct.Struct("<Q")


def _rebuild_error(code: int, message: str) -> TritonError:
    return TritonError(ErrorCode(code), message)


def _reduce_error(error: TritonError) -> tuple[Callable[..., TritonError], tuple[Any, ...]]:
    return _rebuild_error, (error.code.value, error.message)


def _rebuild_request(fields: tuple[Any, ...], carrier: dict[str, str] | None) -> InferenceRequest:
    request = InferenceRequest(*fields)
    if carrier is not None:
        request.context[TRACE_CARRIER] = carrier
    return request


# Where an engine finds the trace context a request crossed with (see `_reduce_request`).
TRACE_CARRIER = "engine.trace_carrier"


def _reduce_request(
    request: InferenceRequest,
) -> tuple[Callable[..., InferenceRequest], tuple[Any, ...]]:
    fields = (
        request.model_name,
        request.model_version,
        request.id,
        request.inputs,
        request.outputs,
        request.parameters,
        request.resolved_version,
        {},
        None,
        request.cancelled,
        request.headers,
    )
    trace = request.trace
    return _rebuild_request, (fields, trace.carrier() if trace is not None else None)


def _rebuild_histogram(
    bounds: tuple[float, ...], counts: list[int], sum_ms: float
) -> FirstResponseHistogram:
    histogram = FirstResponseHistogram(bounds)
    histogram._counts = counts
    histogram._sum_ms = sum_ms
    return histogram


def _reduce_histogram(
    histogram: FirstResponseHistogram,
) -> tuple[Callable[..., FirstResponseHistogram], tuple[Any, ...]]:
    with histogram._lock:
        return _rebuild_histogram, (
            histogram.bounds_ms,
            list(histogram._counts),
            histogram._sum_ms,
        )


def _rebuild_tensor(
    name: str,
    datatype: str,
    shape: tuple[int, ...],
    parameters: dict[str, Any],
    data_shape: tuple[int, ...],
    payload: Any,
) -> Tensor:
    data = np.frombuffer(payload, dtype=to_numpy_dtype(datatype)).reshape(data_shape)
    return Tensor(name, datatype, shape, data, parameters)


def _reduce_tensor(tensor: Tensor) -> tuple[Callable[..., Tensor], tuple[Any, ...]]:
    """A tensor of numbers crosses as its raw bytes (out of band when large): numpy's own
    pickling costs several times more. Anything else (BYTES) as numpy pickles it."""
    data = tensor.data
    if data.dtype.kind != "O" and data.dtype == to_numpy_dtype(tensor.datatype):
        data = np.ascontiguousarray(data)
        payload: Any = (
            pickle.PickleBuffer(data.reshape(-1).view(np.uint8))
            if data.nbytes >= OUT_OF_BAND
            else data.tobytes()
        )
        fields = (tensor.name, tensor.datatype, tensor.shape, tensor.parameters, data.shape)
        return _rebuild_tensor, (*fields, payload)
    return Tensor, (tensor.name, tensor.datatype, tensor.shape, data, tensor.parameters)


def _by_fields(cls: type) -> Callable[[Any], tuple[type, tuple[Any, ...]]]:
    """A dataclass rebuilt by calling it with its fields: what pickle does for it by default
    goes through Python-level `__getstate__`."""
    names = [field.name for field in dataclasses.fields(cls)]
    get = operator.attrgetter(*names)
    if len(names) == 1:
        return lambda obj: (cls, (get(obj),))
    return lambda obj: (cls, get(obj))


_TABLE = dict(copyreg.dispatch_table)
_TABLE[TritonError] = _reduce_error
_TABLE[InferenceRequest] = _reduce_request
_TABLE[FirstResponseHistogram] = _reduce_histogram
_TABLE[Tensor] = _reduce_tensor
for _cls in (
    InferenceResponse,
    RequestedOutput,
    messages.Submit,
    messages.Answer,
    messages.Failed,
    messages.Part,
    messages.Call,
    messages.Cancel,
):
    _TABLE[_cls] = _by_fields(_cls)


def _in_band(buffer: pickle.PickleBuffer) -> bool:
    return buffer.raw().nbytes < OUT_OF_BAND


def encode(message: object) -> list[bytes | memoryview]:
    """The frame of `message`, as the pieces to write one after another."""
    out = io.BytesIO()
    buffers: list[pickle.PickleBuffer] = []

    def keep(buffer: pickle.PickleBuffer) -> bool:
        if _in_band(buffer):
            return True
        buffers.append(buffer)
        return False

    pickler = pickle.Pickler(out, protocol=5, buffer_callback=keep)
    pickler.dispatch_table = _TABLE
    pickler.dump(message)
    body = out.getbuffer()
    if not buffers:
        return [HEADER.pack(len(body), 0, 0) + body]
    raws = [buffer.raw() for buffer in buffers]
    total = sum(raw.nbytes + LENGTH.size for raw in raws)
    pieces: list[bytes | memoryview] = [HEADER.pack(len(body), len(raws), total), body]
    for raw in raws:
        pieces.append(LENGTH.pack(raw.nbytes))
        pieces.append(raw)
    return pieces


class FrameReader:
    """Turns the bytes read from a stream into messages, however the stream splits them."""

    __slots__ = ("_buffer",)

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[object]:
        """The messages completed by `data`, in order."""
        buffer = self._buffer
        buffer += data
        messages = []
        start = 0
        end = len(buffer)
        while end - start >= HEADER.size:
            length, count, extra = HEADER.unpack_from(buffer, start)
            frame_end = start + HEADER.size + length + extra
            if frame_end > end:
                break
            body_start = start + HEADER.size
            view = memoryview(buffer)
            body = view[body_start : body_start + length]
            buffers = []
            position = body_start + length
            for _ in range(count):
                (size,) = LENGTH.unpack_from(buffer, position)
                position += LENGTH.size
                # A copy of its own, so that the tensor outlives this reader's buffer.
                buffers.append(bytes(view[position : position + size]))
                position += size
            messages.append(pickle.loads(body, buffers=buffers))
            body.release()
            view.release()
            start = frame_end
        if start:
            del buffer[:start]
        return messages
