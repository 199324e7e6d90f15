"""uvicorn's httptools protocol, with what a turn of the event loop writes sent in one write.

uvicorn writes a response's status line and headers when the app sends `http.response.start`,
then its body when the app sends `http.response.body`: two `send` system calls, two TCP segments
and two wakes of the client for every answer, however small. `tritonactor serve` runs uvicorn
with this protocol (`--http tritonactor.frontends.http.uvicorn_protocol:HttpToolsOneWrite`): the
transport uvicorn is given gathers the `bytes` written during one turn of the event loop and
writes them at its end, in one `writelines` (one system call, no copy on uvloop). Measured in
docs/benchmarks.md ("A response in one write").

Order and flow control are the transport's own: anything that is not `bytes` (a buffer that may
change once `write` returns) sends what was gathered, then itself, at once; `close` sends what
was gathered first; nothing is written once the transport is closing, as uvicorn's own writes
to a closed transport would be dropped. hypercorn writes through its own streams and is not
affected.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class GatheredWrites:
    """A transport's stand-in whose `bytes` writes of one loop turn leave in one write."""

    __slots__ = ("_loop", "_pending", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []

    def write(self, data: bytes) -> None:
        if type(data) is not bytes:
            self.flush()
            self._transport.write(data)
            return
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(data)

    def writelines(self, pieces: Any) -> None:
        for piece in pieces:
            self.write(piece)

    def flush(self) -> None:
        """Write what was gathered (nothing once the transport is closing)."""
        pending = self._pending
        if not pending:
            return
        self._pending = []
        if self._transport.is_closing():
            return
        if len(pending) == 1:
            self._transport.write(pending[0])
        else:
            self._transport.writelines(pending)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._pending = []
        self._transport.abort()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(map(len, self._pending))

    # Called for every request: spelled out rather than found by `__getattr__`.
    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class HttpToolsOneWrite(HttpToolsProtocol):
    """uvicorn's httptools protocol writing through `GatheredWrites`."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        gathered = GatheredWrites(transport, self.loop)
        super().connection_made(gathered)  # type: ignore[arg-type]
