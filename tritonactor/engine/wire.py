"""How messages cross between a front-end process and the engine: frames of pickle protocol 5.

A frame is a 20-byte header (the pickle's length, the number of out-of-band buffers, the total
bytes of what describes them), the pickle, then each buffer preceded by its 8-byte length, or,
for a buffer in the sender's shared-memory lane (engine/lanes.py), that length with its top bit
set and the name of the slot holding it. A tensor of numbers crosses as its raw bytes
(numpy's own pickling costs several times more); one of at least `OUT_OF_BAND` bytes as an
out-of-band buffer: copied into a lane slot, or, when the lane has no room, written to the
socket from the tensor's own memory and read into memory of the frame's own. Either way the
received array is a read-only view of one copy that lives as long as it does. A tensor that is
the memory of a client's system shared-memory region (an input read from it, an output the
engine wrote into it), which both processes map, crosses as where it lies in that region
(length with the next bit set, the region's offset and the tensor's, the region's name and
key): the receiver views its own mapping of the region, and nothing is copied.

A request's `Submit` and its `Answer`, when plain (only small tensors of numbers),
cross as a tagged tuple of plain values instead (`_flat`): what pickle writes and reads fastest.

What a request carries that only makes sense in its own process is left behind when it is
pickled: its `context` (a front end's shared-memory lease), its response sender (the engine
gives it a sender of its own, which streams back), and its trace (it crosses as its span's
context in plain values, `RequestTrace.crossing`, which the engine continues).

Frames are read back into messages by `FrameReader` (engine/frame_reader.py)."""

from __future__ import annotations

import copyreg
import dataclasses
import hashlib
import io
import itertools
import operator
import pickle
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tritonactor import __version__
from tritonactor.core.datatypes import to_numpy_dtype
from tritonactor.core.errors import ErrorCode, TritonError, refused
from tritonactor.core.types import InferenceRequest, InferenceResponse, RequestedOutput, Tensor
from tritonactor.engine import messages
from tritonactor.engine.lanes import Lane, LaneReader
from tritonactor.memory.registry import Place, SharedMemoryRegistry
from tritonactor.scheduling.first_response import FirstResponseHistogram

# The version of the messages and frames: tritonactor's, and a digest of the modules that
# define them (this one, messages.py, and frame_reader.py, which reads frames: read by path, as
# it imports this one). A front end and an engine that differ (an upgrade while a server runs)
# refuse each other at once instead of failing on the first frame that does not decode.
PROTOCOL_MODULES = ("wire.py", "messages.py", "frame_reader.py")
PROTOCOL = (
    f"{__version__}+"
    + hashlib.sha256(
        b"".join(Path(__file__).with_name(module).read_bytes() for module in PROTOCOL_MODULES)
    ).hexdigest()[:12]
)

# Smaller tensors are cheaper inside the pickle than as a buffer of their own.
OUT_OF_BAND = 64 * 1024

HEADER = struct.Struct("<QIQ")
LENGTH = struct.Struct("<Q")
# A buffer in a lane slot: its length with the top bit set, then the slot's name (length, bytes).
IN_LANE = struct.Struct("<QH")
_LANE_FLAG = 1 << 63
# A buffer in a shared-memory region: its length with the next bit set, the region's offset as
# registered, the buffer's offset in the region, then the region's name and key (lengths, bytes).
IN_REGION = struct.Struct("<QQQHH")
_REGION_FLAG = 1 << 62


def _rebuild_error(code: int, message: str, was_refused: bool = False) -> TritonError:
    error = TritonError(ErrorCode(code), message)
    return refused(error) if was_refused else error


def _reduce_error(error: TritonError) -> tuple[Callable[..., TritonError], tuple[Any, ...]]:
    if error.refused:
        return _rebuild_error, (error.code.value, error.message, True)
    return _rebuild_error, (error.code.value, error.message)


def _rebuild_request(fields: tuple[Any, ...], crossed: tuple[Any, ...] | None) -> InferenceRequest:
    request = InferenceRequest(*fields)
    if crossed is not None:
        request.context[TRACE_CROSSING] = crossed
    return request


# Where an engine finds the trace context a request crossed with (see `_reduce_request`).
TRACE_CROSSING = "engine.trace_crossing"


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
    return _rebuild_request, (fields, trace.crossing() if trace is not None else None)


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
        shape = data.shape  # (ascontiguousarray makes a 0-d array 1-d)
        data = np.ascontiguousarray(data)
        payload: Any = (
            pickle.PickleBuffer(data.reshape(-1).view(np.uint8))
            if data.nbytes >= OUT_OF_BAND
            else data.tobytes()
        )
        fields = (tensor.name, tensor.datatype, tensor.shape, tensor.parameters, shape)
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
    messages.Released,
    messages.Dropped,
    messages.TraceUsed,
):
    _TABLE[_cls] = _by_fields(_cls)


def _in_band(buffer: pickle.PickleBuffer) -> bool:
    return buffer.raw().nbytes < OUT_OF_BAND


# Every request's two messages, a `Submit` and its `Answer`, in the usual case (only small
# tensors of numbers): a tuple of plain values, tagged, which pickle writes and reads
# without calling back into Python for each object as the reducers above make it do (~6 us a
# message in and out, ~2.5 flat). Any other message, or one of these that is not plain,
# crosses as itself.
_FLAT_SUBMIT = "tritonactor.submit"
_FLAT_ANSWER = "tritonactor.answer"
# A requested output as a submit carries it, (name, parameters): taken in C, and given back
# to `RequestedOutput` in C (`itertools.starmap`).
_OUTPUT_FIELDS = operator.attrgetter("name", "parameters")


def _flat_tensors(tensors: list[Tensor]) -> tuple[tuple[Any, ...], ...] | None:
    flat = []
    for tensor in tensors:
        data = tensor.data
        if (
            type(data) is not np.ndarray
            or data.dtype.kind == "O"
            or data.nbytes >= OUT_OF_BAND
            or data.dtype != to_numpy_dtype(tensor.datatype)
        ):
            return None
        flat.append(
            (
                tensor.name,
                tensor.datatype,
                tensor.shape,
                tensor.parameters,
                data.shape,
                data.tobytes(),
            )
        )
    return tuple(flat)


def _flat(message: object) -> tuple[Any, ...] | None:
    """`message` as a tagged tuple of plain values, or None when it must cross as itself."""
    kind = type(message)
    if kind is messages.Submit:
        if message.targets:  # type: ignore[attr-defined]
            return None
        request = message.request  # type: ignore[attr-defined]
        inputs = _flat_tensors(request.inputs)
        if inputs is None:
            return None
        return (
            _FLAT_SUBMIT,
            message.id,  # type: ignore[attr-defined]
            message.streamed,  # type: ignore[attr-defined]
            request.model_name,
            request.model_version,
            request.id,
            inputs,
            tuple(map(_OUTPUT_FIELDS, request.outputs)),
            request.parameters,
            request.resolved_version,
            request.cancelled,
            request.headers,
            request.trace.crossing() if request.trace is not None else None,
        )
    if kind is messages.Answer:
        response = message.value  # type: ignore[attr-defined]
        if type(response) is not InferenceResponse:
            return None
        outputs = _flat_tensors(response.outputs)
        if outputs is None:
            return None
        return (
            _FLAT_ANSWER,
            message.id,  # type: ignore[attr-defined]
            message.links,  # type: ignore[attr-defined]
            response.model_name,
            response.model_version,
            response.id,
            outputs,
            response.parameters,
        )
    return None


def _tensors(flat: tuple[tuple[Any, ...], ...]) -> list[Tensor]:
    return [
        Tensor(
            name,
            datatype,
            shape,
            np.frombuffer(payload, dtype=to_numpy_dtype(datatype)).reshape(data_shape),
            parameters,
        )
        for name, datatype, shape, parameters, data_shape, payload in flat
    ]


def _unflat(flat: tuple[Any, ...]) -> object:
    """The message a tagged tuple stands for (any other tuple as it is)."""
    tag = flat[0] if flat else None
    if tag == _FLAT_SUBMIT:
        _, id, streamed, name, version, request_id, inputs, outputs, parameters = flat[:9]
        resolved, cancelled, headers, crossed = flat[9:]
        request = InferenceRequest(
            name,
            version,
            request_id,
            _tensors(inputs),
            list(itertools.starmap(RequestedOutput, outputs)),
            parameters,
            resolved,
            cancelled=cancelled,
            headers=headers,
        )
        if crossed is not None:
            request.context[TRACE_CROSSING] = crossed
        return messages.Submit(id, request, streamed)
    if tag == _FLAT_ANSWER:
        _, id, links, name, version, response_id, outputs, parameters = flat
        response = InferenceResponse(name, version, response_id, _tensors(outputs), parameters)
        return messages.Answer(id, response, links)
    return flat


def encode(
    message: object, lane: Lane | None = None, regions: SharedMemoryRegistry | None = None
) -> list[bytes | memoryview]:
    """The frame of `message`, as the pieces to write one after another; its large tensors
    as where they lie when they are the memory of one of `regions`, else in `lane`'s shared
    memory when it has room (see engine/lanes.py)."""
    flat = _flat(message)
    if flat is not None:
        body = pickle.dumps(flat, protocol=5)
        return [HEADER.pack(len(body), 0, 0) + body]
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
    pieces: list[bytes | memoryview] = [b"", body]
    total = 0
    for buffer in buffers:
        raw = buffer.raw()
        place = regions.locate(raw) if regions is not None else None
        if place is not None:
            reference = _region_reference(place)
            pieces.append(reference)
            total += len(reference)
            continue
        name = lane.put(raw) if lane is not None else None
        if name is None:
            pieces += (LENGTH.pack(raw.nbytes), raw)
            total += LENGTH.size + raw.nbytes
        else:
            reference = name.encode()
            pieces.append(IN_LANE.pack(raw.nbytes | _LANE_FLAG, len(reference)) + reference)
            total += IN_LANE.size + len(reference)
    pieces[0] = HEADER.pack(len(body), len(buffers), total)
    return pieces


def write(transport: Any, pieces: list[bytes | memoryview], lane: Lane, taken: LaneReader) -> None:
    """Write a message's frame (`pieces`, from `encode`) on a connection's transport, with a
    `Released` for the other side's slots `taken` is done with since its last message before
    it, and a `Dropped` for the slots `lane` gave up in encoding it after it (engine/lanes.py):
    each side of an engine connection sends this way."""
    if taken.returned or taken.taken:
        pieces = [*encode(messages.Released(taken.pop_taken())), *pieces]
    if len(pieces) == 1:
        transport.write(pieces[0])
    else:
        transport.writelines(pieces)
    if lane.dropped:
        transport.write(encode(messages.Dropped(lane.pop_dropped()))[0])


def _region_reference(place: Place) -> bytes:
    region, key, region_offset, offset, byte_size = place
    name, key_bytes = region.encode("utf-8", "surrogatepass"), key.encode("utf-8", "surrogatepass")
    header = IN_REGION.pack(
        byte_size | _REGION_FLAG, region_offset, offset, len(name), len(key_bytes)
    )
    return header + name + key_bytes
