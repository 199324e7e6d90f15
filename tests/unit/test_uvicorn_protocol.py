"""`tritonactor serve`'s uvicorn protocol: what one turn of the event loop writes leaves in one
write, in order, and nothing is written once the transport closes."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from uvicorn.importer import import_from_string
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from tritonactor import cli
from tritonactor.frontends.http.uvicorn_protocol import GatheredWrites, HttpToolsOneWrite

pytestmark = pytest.mark.anyio


class Recording:
    """A transport that keeps every write it is given, each `writelines` as one."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closing = False
        self.aborted = False

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))

    def writelines(self, pieces: list[bytes]) -> None:
        self.writes.append(b"".join(pieces))

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = self.aborted = True

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 8000) if name == "sockname" else default


async def next_turn() -> None:
    """Until the loop has run what the current turn scheduled."""
    await asyncio.sleep(0)
    await asyncio.sleep(0)


def gathered() -> tuple[GatheredWrites, Recording]:
    transport = Recording()
    return GatheredWrites(transport, asyncio.get_running_loop()), transport  # type: ignore[arg-type]


def test_serve_runs_uvicorn_with_this_protocol() -> None:
    assert import_from_string(cli.UVICORN_PROTOCOL) is HttpToolsOneWrite
    assert issubclass(HttpToolsOneWrite, HttpToolsProtocol)


async def test_the_writes_of_one_turn_leave_in_one_write_at_its_end() -> None:
    writes, transport = gathered()
    writes.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
    writes.write(b"{}")
    assert transport.writes == []  # not before the turn ends
    await next_turn()
    assert transport.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"]
    writes.writelines([b"a", b"b"])
    await next_turn()
    writes.write(b"c")
    await next_turn()
    assert transport.writes[1:] == [b"ab", b"c"]


async def test_a_buffer_that_may_change_goes_out_at_once_after_what_was_gathered() -> None:
    writes, transport = gathered()
    writes.write(b"head ")
    buffer = bytearray(b"body")
    writes.write(buffer)  # type: ignore[arg-type]
    assert transport.writes == [b"head ", b"body"]
    buffer[:] = b"XXXX"
    await next_turn()
    assert transport.writes == [b"head ", b"body"]


async def test_close_sends_what_was_gathered_first_and_abort_drops_it() -> None:
    writes, transport = gathered()
    writes.write(b"last answer")
    writes.close()
    assert transport.writes == [b"last answer"] and transport.closing
    await next_turn()
    assert transport.writes == [b"last answer"]

    writes, transport = gathered()
    writes.write(b"never sent")
    writes.abort()
    await next_turn()
    assert transport.writes == [] and transport.aborted


async def test_nothing_is_written_once_the_transport_is_closing() -> None:
    writes, transport = gathered()
    writes.write(b"too late")
    transport.closing = True  # the peer went away meanwhile
    await next_turn()
    assert transport.writes == []


async def test_what_uvicorn_asks_of_the_transport_reaches_it() -> None:
    writes, _ = gathered()
    writes.write(b"12345")
    assert writes.get_write_buffer_size() == 5
    assert writes.get_extra_info("sockname") == ("127.0.0.1", 8000)
    assert not writes.is_closing()
