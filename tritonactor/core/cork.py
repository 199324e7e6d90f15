"""The one way a loop turn's writes to a connection are gathered: what the work now queued on
the event loop writes to a `CorkedTransport` goes out in one system call at its end.

Why: a gRPC front end's connection carries many calls at once. The engine's answers to several
of them arrive in one read, wake their calls' tasks for the loop's next turn, and each task
writes its answer; written as each comes, that is a `send` each, and the client wakes and
reads each one on its own. Gathered, a turn's answers to one connection go in one `writev`,
as Triton's gRPC core sends them, and the client reads them together; the front end's
requests to the engine, made by the tasks of calls that arrived in one read, go the same way
(docs/benchmarks.md, "A loop turn's writes in one"). HTTP/1.1 connections carry one request at
a time, so nothing of theirs is gathered.

`cork().hold()` (the running loop's, on its thread): from now until the work queued on the loop
at this moment has run, writes to this loop's `CorkedTransport`s are kept, in order, and
written at the end (`release`, queued behind that work; a later `hold` moves it behind what was
queued since). A write made while no hold is on goes at once, as it would without the wrapper.
A kept write waits for the rest of that queued work, never past the loop's next poll: the
release is queued before a hold begins. So a slow callback in the same turn (a large request
decoded) delays the turn's answers, as it would delay their tasks; and the transport's own
back-pressure (`pause_writing`) comes at the turn's end, once what was kept is written (a gRPC
peer's HTTP/2 windows bound what a turn may write). Closing a transport through the wrapper
writes what it kept first; aborting drops it, as an abort drops what the transport itself had
not yet sent; a transport already closing when the turn ends (its connection lost) drops it.
Writes come from the loop's thread only, as a transport's must.

`cork().gather()` ... `end_gather()`: the writes of a synchronous section, kept while it runs
and written as it ends, at once (an instance answering a batch: the engine's answers to one
front end in one write, scheduling/instance.py); inside a hold, the hold writes them."""

from __future__ import annotations

import asyncio
import logging
import weakref
from typing import Any

log = logging.getLogger(__name__)

_CORKS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Cork] = weakref.WeakKeyDictionary()


class Cork:
    """One event loop's hold on its `CorkedTransport`s' writes (`cork()` gives it)."""

    __slots__ = ("__weakref__", "_handle", "held", "on")

    def __init__(self) -> None:
        # (no reference to its loop: the loop is the key that `_CORKS` holds weakly)
        self.on = False
        # The transports keeping writes, each once, in the order of their first write.
        self.held: list[CorkedTransport] = []
        self._handle: asyncio.Handle | None = None

    def hold(self) -> None:
        """Keep writes until the work queued on the loop now has run (on the loop's thread)."""
        handle = asyncio.get_running_loop().call_soon(self.release)
        if self._handle is not None:
            self._handle.cancel()
        self._handle = handle
        self.on = True  # (once the release is queued: a hold that failed keeps nothing)

    def gather(self) -> bool:
        """Keep writes from now until `end_gather`, unless they are kept already (a hold, or
        a gathering this is inside): True where this call began keeping them, and its caller
        must then end it (in a `finally`). For a section that answers many requests at once
        (a batch): their answers to one connection go in one write, at once."""
        if self.on:
            return False
        self.on = True
        return True

    def end_gather(self) -> None:
        """The end of a `gather` that began keeping writes: what was kept, written now."""
        self.release()

    def release(self) -> None:
        """Write what each transport kept, one system call each; writes go at once again."""
        self.on = False
        handle, self._handle = self._handle, None
        if handle is not None:  # (a hold's, when a gathering ends it first: not to end a later one)
            handle.cancel()
        held, self.held = self.held, []
        _flush(held)


def _flush(transports: list[CorkedTransport]) -> None:
    """Each transport's kept writes: one connection's failure is not another's, and an
    interruption (a BaseException) leaves none of the others' kept behind a later write."""
    for index, transport in enumerate(transports):
        try:
            transport.flush()
        except Exception:
            log.exception("a connection's gathered writes failed")
        except BaseException:
            _flush(transports[index + 1 :])
            raise


def cork() -> Cork:
    """The running loop's `Cork`."""
    loop = asyncio.get_running_loop()
    found = _CORKS.get(loop)
    if found is None:
        found = _CORKS[loop] = Cork()
    return found


class CorkedTransport:
    """A transport whose writes its loop's `Cork` may keep to the end of a turn; everything
    else is the transport's own. Made on the loop that runs the connection."""

    __slots__ = ("_parts", "_transport", "cork")

    def __init__(self, transport: Any) -> None:
        self._transport = transport
        self._parts: list[Any] = []
        self.cork = cork()

    def write(self, data: Any) -> None:
        if self.cork.on:
            self._keep((data,))
        else:
            self._transport.write(data)

    def writelines(self, pieces: Any) -> None:
        if self.cork.on:
            self._keep(pieces)
        else:
            self._transport.writelines(pieces)

    def _keep(self, pieces: Any) -> None:
        if not self._parts:
            self.cork.held.append(self)
        self._parts.extend(pieces)

    def flush(self) -> None:
        """What it kept, to the transport (dropped where the transport is already closing: its
        connection lost, or closed under it without the wrapper)."""
        parts, self._parts = self._parts, []
        if not parts or self._transport.is_closing():
            return
        if len(parts) == 1:
            self._transport.write(parts[0])
        else:
            self._transport.writelines(parts)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def get_write_buffer_size(self) -> int:
        kept = sum(memoryview(piece).nbytes for piece in self._parts)
        return int(self._transport.get_write_buffer_size()) + kept

    def abort(self) -> None:
        self._parts = []
        self._transport.abort()

    def is_closing(self) -> bool:
        return bool(self._transport.is_closing())

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def __getattr__(self, name: str) -> Any:
        # (the rest of a transport's methods; those called on every request are above: a
        # lookup that reaches here costs a failed one first)
        return getattr(self._transport, name)


__all__ = ["Cork", "CorkedTransport", "cork"]
