"""What a lane stream received and its call has not read yet: grpclib's `Buffer`, made lighter.

grpclib's `Buffer` keeps the received chunks in an `asyncio.Queue` of named tuples and joins
what a read takes, even a whole chunk: ~4 µs for a message read as its length prefix and its
body, and ~1.4 µs to make one per call (a `Queue` and its futures' deques). `LaneBuffer` does
the same in plain deques, waits on a future only when it has nothing, and hands a whole chunk
over as it came (~1.6 µs a message in a loop of nothing else). What it gives and when it gives
the window back are grpclib's, step for step: a chunk's window goes back (`ack_callback`) when
a read first reaches it; a chunk of no flow-controlled size (an empty DATA frame, or the end)
ends the read that reaches it; a read past the end raises grpclib's AssertionError;
`unacked_size()` empties what no read reached; a chunk wakes the oldest read waiting. tests/
unit/test_lane_buffer.py runs random sequences through both and compares every result, error
and window given back.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable


class LaneBuffer:
    """A stream's received chunks, read as grpclib's `Buffer` reads them."""

    __slots__ = ("_ack", "_acked", "_acked_size", "_eof", "_unacked", "_waiters")

    def __init__(self, ack_callback: Callable[[int], None]) -> None:
        self._ack = ack_callback
        self._eof = False
        self._unacked: deque[tuple[bytes | bytearray, int]] = deque()  # (data, window size)
        self._acked: deque[bytes | bytearray | memoryview] = deque()  # reached, not all read
        self._acked_size = 0
        # reads waiting for a chunk, oldest first: a chunk wakes one, as grpclib's queue does
        self._waiters: deque[asyncio.Future[None]] = deque()

    def add(self, data: bytes | bytearray, ack_size: int) -> None:
        self._unacked.append((data, ack_size))
        if self._waiters:
            self._wake_next()

    def _wake_next(self) -> None:
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def eof(self) -> None:
        self.add(b"", 0)
        self._eof = True

    async def read(self, size: int, copy: bool = True) -> bytes | memoryview:
        """grpclib's read of `size` bytes; with `copy` false, a part of one chunk comes as a
        read-only view of it rather than `bytes` (the chunks are views of what the socket read,
        or copies of it, which nothing writes again: lane.py)."""
        assert size >= 0, "Size can not be negative"
        if size == 0:
            return b""
        unacked = self._unacked
        if not self._eof or unacked:
            while self._acked_size < size:
                if not unacked:
                    waiter = asyncio.get_running_loop().create_future()
                    self._waiters.append(waiter)
                    try:
                        await waiter
                    except BaseException:
                        # cancelled: a wake-up it had already been given goes to the next
                        # read waiting (as grpclib's queue passes it on)
                        woken = not waiter.cancel()
                        with contextlib.suppress(ValueError):
                            self._waiters.remove(waiter)
                        if woken and unacked:
                            self._wake_next()
                        raise
                    continue
                data, ack_size = unacked.popleft()
                if not ack_size:
                    break
                self._acked.append(data)
                self._acked_size += len(data)
                self._ack(ack_size)
        if self._eof and self._acked_size == 0:
            return b""
        if self._acked_size < size:
            raise AssertionError("Received less data than expected")
        self._acked_size -= size
        acked = self._acked
        first = acked[0]
        length = len(first)
        if length == size:  # a whole chunk (a message in a DATA frame of its own)
            acked.popleft()
            if type(first) is bytes:
                return first
            if copy:
                return bytes(first)
            return first if type(first) is memoryview else memoryview(first).toreadonly()
        if length > size:
            view = first if type(first) is memoryview else memoryview(first)
            acked[0] = view[size:]
            return bytes(view[:size]) if copy else view.toreadonly()[:size]
        chunks: list[bytes | bytearray | memoryview] = []
        taken = 0
        while taken < size:
            chunk = acked[0]
            if taken + len(chunk) <= size:
                chunks.append(chunk)
                taken += len(chunk)
                acked.popleft()
            else:
                view = chunk if type(chunk) is memoryview else memoryview(chunk)
                offset = size - taken
                chunks.append(view[:offset])
                acked[0] = view[offset:]
                taken = size
        return b"".join(chunks)

    def unacked_size(self) -> int:
        """The window of the chunks no read reached; they are let go (as grpclib's)."""
        size = sum(ack_size for _, ack_size in self._unacked)
        self._unacked.clear()
        return size


__all__ = ["LaneBuffer"]
