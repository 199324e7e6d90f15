"""Reading frames (engine/wire.py) back into messages: `FrameReader`, through which each side of
an engine connection reads its stream.

wire.py writes the frames and defines what they hold (the header, each out-of-band buffer on
the socket, in a lane slot or in a client's shared-memory region) and the plain-values form of
a `Submit` or an `Answer`, which `_unflat` undoes; this module holds only the reading: the
reused buffer of small frames, and the buffer of its own that a frame with out-of-band buffers
is read into. How frames are read is part of the protocol, so this file is in the digest of
`wire.PROTOCOL` (read by path there, as this module imports wire)."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np

from tritonactor.core.errors import TritonError, internal
from tritonactor.engine import messages
from tritonactor.engine.lanes import LaneReader
from tritonactor.engine.wire import (
    _LANE_FLAG,
    _REGION_FLAG,
    HEADER,
    IN_LANE,
    IN_REGION,
    LENGTH,
    _unflat,
)
from tritonactor.memory.registry import SharedMemoryRegistry


class FrameReader:
    """Turns the bytes of a stream into messages, however the stream splits them. It is read
    into directly (`asyncio.BufferedProtocol`: `get_buffer`, then `buffer_updated`): small
    frames into one reused buffer; a frame carrying out-of-band buffers into a buffer of its
    own, exactly its size, which its tensors then view, read-only. So a large tensor is copied
    once on its way in, by the kernel, instead of three times (into a chunk, appended to a
    buffer, copied out of it)."""

    __slots__ = ("_buffer", "_end", "_filled", "_frame", "_lanes", "_layout", "_regions", "_start")

    def __init__(
        self, lanes: LaneReader | None = None, regions: SharedMemoryRegistry | None = None
    ) -> None:
        # Where tensors sent through the other side's lane are read from, and tensors that
        # lie in clients' shared-memory regions.
        self._lanes = lanes
        self._regions = regions
        self._buffer = bytearray(_SMALL)
        self._start = 0  # the first byte not decoded yet
        self._end = 0  # the end of what was read
        # The frame being read into its own buffer (what follows its header), how much of it
        # has arrived, and its (pickle length, buffer count).
        self._frame: np.ndarray | None = None
        self._filled = 0
        self._layout = (0, 0)

    def get_buffer(self, sizehint: int = -1) -> memoryview:
        """Where the next bytes read go."""
        if self._frame is not None:
            return memoryview(self._frame)[self._filled :]
        if len(self._buffer) - self._end < _ROOM:
            self._make_room()
        return memoryview(self._buffer)[self._end :]

    def buffer_updated(self, nbytes: int) -> list[object]:
        """The messages completed by the `nbytes` just read into `get_buffer`'s memory."""
        frame = self._frame
        if frame is not None:
            self._filled += nbytes
            if self._filled < len(frame):
                return []
            self._frame = None
            return [self._decode_own(frame, *self._layout)]
        self._end += nbytes
        buffer, start, end = self._buffer, self._start, self._end
        messages: list[object] = []
        while end - start >= HEADER.size:
            length, count, extra = HEADER.unpack_from(buffer, start)
            begin = start + HEADER.size
            size = length + extra
            if count:  # out-of-band buffers: the frame gets memory of its own
                have = min(end - begin, size)
                own = np.empty(size, np.uint8)  # not zeroed first, as a bytearray would be
                own[:have] = np.frombuffer(buffer, np.uint8, have, begin)
                start = begin + have
                if have == size:
                    messages.append(self._decode_own(own, length, count))
                    continue
                self._frame, self._filled, self._layout = own, have, (length, count)
                break
            if end - begin < size:
                break
            with memoryview(buffer) as view, view[begin : begin + length] as body:
                message = pickle.loads(body)
            messages.append(_unflat(message) if type(message) is tuple else message)
            start = begin + size
        if start == end:
            start = end = 0
            if len(buffer) > _SMALL * 4:  # after a rare large frame
                self._buffer = bytearray(_SMALL)
        self._start, self._end = start, end
        return messages

    def feed(self, data: bytes | memoryview) -> list[object]:
        """The messages completed by `data` (for a reader that is handed chunks)."""
        messages: list[object] = []
        view = memoryview(data).cast("B")
        while view:
            with self.get_buffer(len(view)) as target:
                taken = min(len(target), len(view))
                target[:taken] = view[:taken]
            messages += self.buffer_updated(taken)
            view = view[taken:]
        return messages

    def _decode_own(self, frame: np.ndarray, length: int, count: int) -> object:
        """A frame read into memory of its own: the pickle, then each buffer after its
        length (or the lane slot it is in); the buffers are read-only views of that memory,
        which lives as long as they do."""
        view = memoryview(frame).toreadonly()
        buffers: list[Any] = []
        position = length
        gone: TritonError | None = None
        for _ in range(count):
            (size,) = LENGTH.unpack_from(frame, position)
            if size & _REGION_FLAG:
                size, region_offset, offset, name_length, key_length = IN_REGION.unpack_from(
                    frame, position
                )
                position += IN_REGION.size
                name = bytes(view[position : position + name_length])
                position += name_length
                key = bytes(view[position : position + key_length])
                position += key_length
                size &= ~_REGION_FLAG
                place = (
                    name.decode("utf-8", "surrogatepass"),
                    key.decode("utf-8", "surrogatepass"),
                    region_offset,
                    offset,
                    size,
                )
                try:
                    if self._regions is None:
                        raise internal("a tensor in a region, on a connection without regions")
                    buffers.append(self._regions.view(place))
                except TritonError as error:
                    gone = error
                    buffers.append(bytes(size))  # to finish reading the message
                continue
            if size & _LANE_FLAG:
                size, name_length = IN_LANE.unpack_from(frame, position)
                position += IN_LANE.size
                name = bytes(view[position : position + name_length]).decode()
                if self._lanes is None:
                    raise ValueError("a tensor in a lane, on a connection without lanes")
                buffers.append(self._lanes.take(name, size & ~_LANE_FLAG))
                position += name_length
                continue
            position += LENGTH.size
            buffers.append(view[position : position + size])
            position += size
        message = pickle.loads(view[:length], buffers=buffers)
        if gone is None:
            return message
        # A request, answer or part whose tensor this side cannot see: it fails (a part ends
        # its stream), and the connection goes on.
        kind = type(message)
        if kind is messages.Submit or kind is messages.Answer:
            return messages.Failed(message.id, gone)  # type: ignore[attr-defined]
        if kind is messages.Part:
            return messages.Part(message.id, None, gone, True)  # type: ignore[attr-defined]
        raise gone

    def _make_room(self) -> None:
        start, end = self._start, self._end
        pending = end - start
        if len(self._buffer) - pending >= _ROOM:
            self._buffer[:pending] = self._buffer[start:end]
        else:  # a frame larger than the buffer: a bigger one
            grown = bytearray(max(2 * len(self._buffer), pending + _ROOM))
            grown[:pending] = memoryview(self._buffer)[start:end]
            self._buffer = grown
        self._start, self._end = 0, pending


# The reused buffer of small frames, and the least room it offers a read.
_SMALL = 256 * 1024
_ROOM = 64 * 1024
