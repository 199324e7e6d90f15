"""An actor's mailbox: a bounded queue with one reader, on the asyncio event loop.

It keeps the contract of the anyio memory stream it replaces (`put_nowait` raises
`anyio.WouldBlock` when full, `put` waits for room, a closed mailbox refuses new messages but
its reader still gets what was queued, a mailbox whose reader is gone fails waiting writers)
without its per-message costs: a message that finds the reader waiting wakes it with one
future, and a reader that finds a message queued takes it without a trip through the loop.
A mailbox serves one event loop: its reader keeps the loop it first waited on (an actor's
mailbox is closed when its run ends, so a later run never waits on it).
"""

from __future__ import annotations

import asyncio
import sys
from collections import deque
from typing import Generic, TypeVar

import anyio

M = TypeVar("M")

# A reader that finds messages queued takes this many in a row, then lets other tasks run.
_BURST = 64


class MailboxClosed(Exception):
    """The mailbox takes no more messages (closed by a writer, or its reader is gone)."""


class Mailbox(Generic[M]):
    __slots__ = (
        "_burst",
        "_closed",
        "_gone",
        "_loop",
        "_most",
        "_reader",
        "_size",
        "_writers",
        "messages",
    )

    def __init__(self, size: int, burst: int = _BURST) -> None:
        """`size`: the most messages it holds; `burst`: how many queued messages the reader
        takes in a row before it lets other tasks run (1: before each after the first, as a
        stream's reader must, to see its client leave or its task cancelled between two)."""
        self._size = size
        self._most = burst
        self.messages: deque[M] = deque()
        self._closed = False  # no more messages: the reader drains what is queued
        self._gone = False  # the reader left: nothing queued will ever be read
        self._reader: asyncio.Future[None] | None = None
        self._writers: deque[tuple[asyncio.Future[None], M]] = deque()
        self._burst = 0
        # The reader's loop, once it has waited: one task reads a mailbox, always on one loop
        # (asking asyncio for the running loop costs a system call, getpid, every time).
        self._loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def for_stream(cls) -> Mailbox[M]:
        """A stream's answers on their way to whoever sends them on: as many as come (a
        decoupled model sends any number), taken one at a time with the loop let run between
        two queued, so that a client gone, a call cancelled or a run failed is seen there."""
        return cls(sys.maxsize, burst=1)

    def __len__(self) -> int:
        return len(self.messages)

    def waiting(self) -> bool:
        """Whether the reader is waiting for a message: none is queued, the mailbox is open."""
        reader = self._reader
        return reader is not None and not reader.done()

    def put_failure(self, message: M) -> None:
        """Put `message` first, past the size limit, and even when closed: a failure the
        reader must see before anything queued after what failed (it is still reading unless
        it is gone)."""
        if not self._gone:
            self.messages.appendleft(message)
            self._wake_reader()

    def put_nowait(self, message: M) -> None:
        if self._closed or self._gone:
            raise MailboxClosed
        if len(self.messages) >= self._size:
            raise anyio.WouldBlock
        self.messages.append(message)
        self._wake_reader()

    async def put(self, message: M) -> None:
        """Queue `message`, waiting while the mailbox is full."""
        try:
            self.put_nowait(message)
            return
        except anyio.WouldBlock:
            pass
        waiter = asyncio.get_running_loop().create_future()
        entry = (waiter, message)
        self._writers.append(entry)
        try:
            await waiter
        except BaseException:
            # Cancelled while waiting: the message is not queued (unless it just was, as
            # with anyio's streams; the cancellation goes on either way).
            if entry in self._writers:
                self._writers.remove(entry)
            raise

    def close(self) -> None:
        """Take no more messages; the reader still gets those queued."""
        if not self._closed:
            self._closed = True
            self._wake_reader()

    def get_nowait(self) -> M:
        """The next message; `anyio.WouldBlock` when none is queued, `anyio.EndOfStream` when
        none is queued and the mailbox is closed."""
        self._admit_writer()
        if self.messages:
            return self.messages.popleft()
        if self._closed:
            raise anyio.EndOfStream
        raise anyio.WouldBlock

    async def get(self) -> M:
        """The next message, waiting for one; `anyio.EndOfStream` once closed and drained."""
        if self.messages and self._burst < self._most:
            self._burst += 1
            self._admit_writer()
            return self.messages.popleft()
        self._burst = 0
        if self.messages:
            await asyncio.sleep(0)  # a long run of queued messages lets others run
            self._burst = 1  # the message taken now starts the next run
        messages = self.messages
        while True:
            # get_nowait's steps, without raising WouldBlock each time the reader waits.
            if self._writers:
                self._admit_writer()
            if messages:
                return messages.popleft()
            if self._closed:
                raise anyio.EndOfStream
            loop = self._loop
            if loop is None:
                loop = self._loop = asyncio.get_running_loop()
            reader = self._reader = loop.create_future()
            try:
                await reader
            finally:
                self._reader = None

    def leave(self) -> None:
        """The reader is gone: writers waiting for room, and later ones, fail."""
        self._gone = True
        self._closed = True
        writers, self._writers = self._writers, deque()
        for waiter, _ in writers:
            if not waiter.done():
                waiter.set_exception(MailboxClosed())

    def __aiter__(self) -> Mailbox[M]:
        return self

    async def __anext__(self) -> M:
        try:
            return await self.get()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    def _wake_reader(self) -> None:
        reader = self._reader
        if reader is not None and not reader.done():
            reader.set_result(None)

    def _admit_writer(self) -> None:
        # A writer waiting for room puts its message in as the reader takes one out.
        while self._writers and len(self.messages) <= self._size:
            waiter, message = self._writers.popleft()
            if not waiter.done():
                self.messages.append(message)
                waiter.set_result(None)
