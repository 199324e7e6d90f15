"""The reader of a python instance's socket: everything its stub sends, handed on in order.

The server makes each instance on a worker thread of its event loop; the loop itself then reads
the socket (`loop.add_reader`), so the stub's answer wakes the loop directly rather than a
thread that then wakes the loop. A message whose handing on may wait (`holds_up`: a response
for an ensemble step with `max_inflight_requests`, which waits for room; one for a decoupled
BLS call, written to the calling model's process) is handed on from a thread, and reading
stops until it has gone, so that the model's further sends wait and the loop never does. An
instance made elsewhere than on a worker thread of the loop (the unit tests make theirs on
the loop's own thread) reads with a thread of its own.

At the end of the channel (the process is gone) `ended` runs on a thread of its own: it waits
for the process's exit status.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
from collections.abc import Callable
from typing import Any

from tritonactor.backends.python import ipc

Message = dict[str, Any]


class ChannelReader:
    """Reads one instance's channel and hands each message to `handle`, in order; a message
    for which `holds_up` is true is handed on from a thread while reading waits (on the loop);
    `ended` runs once the channel has ended."""

    def __init__(
        self,
        channel: ipc.Channel,
        name: str,
        loop: asyncio.AbstractEventLoop | None,
        handle: Callable[[Message], None],
        holds_up: Callable[[Message], bool],
        ended: Callable[[], None],
    ) -> None:
        self._channel = channel
        self._name = name
        self._loop = loop
        self._handle = handle
        self._holds_up = holds_up
        self._ended = ended
        self.done = threading.Event()  # the end of the channel was read, and `ended` ran
        # On the loop: what was read and not yet handled (None: the end of the channel), and
        # whether reading waits for a message being handed on from a thread.
        self._unhandled: collections.deque[Message | None] = collections.deque()
        self.paused = False
        self._at_end = False
        self._stopped = False  # finished: never read again (the socket is about to close)

    def start(self) -> None:
        """From any thread, once: start reading."""
        if self._loop is None:
            threading.Thread(
                target=self._read_forever, name=f"{self._name}-reader", daemon=True
            ).start()
        else:
            self._loop.call_soon_threadsafe(self._read_on_loop)

    def finish(self, timeout: float) -> None:
        """From any thread, once the process has exited: wait (up to `timeout`) until what it
        sent last was handed on, then stop reading, so that the socket may be closed."""
        loop = self._loop
        if loop is not None and _running_loop() is loop and not self.paused:
            # Called on the loop itself, which cannot read while this waits: read here. (Not
            # while a message is being handed on from a thread: what follows it would overtake
            # it; it is left unread, as if the process had not sent it.)
            self._stop()
            while self._unhandled:
                if (message := self._unhandled.popleft()) is not None:
                    self._handle(message)
            if not self._at_end:
                self._channel.sock.settimeout(timeout)
                self._read_forever()
        reading = loop is None or (loop.is_running() and _running_loop() is not loop)
        if not (reading and self.done.wait(timeout)):
            # Something else holds the socket open (a process the model started inherited it),
            # or the loop has stopped: it stops reading the socket before the socket is closed
            # and its number reused.
            self._stop_from_any_thread(timeout)

    # -- on the loop ----------------------------------------------------------------------------

    def _read_on_loop(self) -> None:
        assert self._loop is not None
        fd = self._channel.sock.fileno()
        if self._stopped or fd == -1:  # finished before this ran
            return
        self._loop.add_reader(fd, self._readable)
        self._readable()  # what the stub's start-up wait read beyond "ready", at once

    def _readable(self) -> None:
        messages = self._channel.received()
        if messages is None:
            self._unhandled.append(None)
        else:
            self._unhandled.extend(messages)
        self._hand_on()

    def _hand_on(self) -> None:
        while self._unhandled and not self.paused and not self._stopped:
            message = self._unhandled.popleft()
            if message is None:
                self._at_end = True
                self._stop_reading()
                threading.Thread(target=self._end, name=f"{self._name}-exit", daemon=True).start()
            elif self._holds_up(message):
                self._stop_reading()
                self.paused = True
                # A daemon thread, one message at a time (reading waits): one that never
                # returns holds up this instance, not the process's exit.
                threading.Thread(
                    target=self._hand_on_from_thread,
                    args=(message,),
                    name=f"{self._name}-send",
                    daemon=True,
                ).start()
            else:
                self._handle(message)

    def _hand_on_from_thread(self, message: Message) -> None:
        assert self._loop is not None
        try:
            self._handle(message)
        finally:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nothing reads
                self._loop.call_soon_threadsafe(self._resume)

    def _resume(self) -> None:
        assert self._loop is not None
        self.paused = False
        self._hand_on()
        fd = self._channel.sock.fileno()
        if not (self.paused or self._at_end or self._stopped or fd == -1):
            self._loop.add_reader(fd, self._readable)

    def _stop_reading(self) -> None:
        assert self._loop is not None
        fd = self._channel.sock.fileno()
        if fd != -1:
            self._loop.remove_reader(fd)

    def _stop(self) -> None:
        """Never read again: the socket is about to be closed, and its number reused."""
        self._stopped = True
        self._stop_reading()

    def _stop_from_any_thread(self, timeout: float) -> None:
        loop = self._loop
        if loop is None:
            return
        if loop.is_closed() or not loop.is_running() or _running_loop() is loop:
            self._stopped = True
            if not loop.is_closed():
                self._stop_reading()
            return
        stopped = threading.Event()

        def stop() -> None:
            try:
                self._stop()
            finally:
                stopped.set()

        with contextlib.suppress(RuntimeError):  # closed meanwhile: nothing reads
            loop.call_soon_threadsafe(stop)
            stopped.wait(timeout)

    # -- on a thread ----------------------------------------------------------------------------

    def _read_forever(self) -> None:
        while (message := self._channel.recv()) is not None:
            self._handle(message)
        self._end()

    def _end(self) -> None:
        try:
            self._ended()
        finally:
            self.done.set()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
