"""Unary answers in one write (frontends/grpc/unary.py): the same frames and header fields as
grpclib's own answer, written once; what is not the common case goes out as grpclib sends it.

Each test serves one call on a server protocol fed by an h2 client in process, for a server
whose handlers answer through `unary_answers` and for a plain grpclib server, and compares
what the client receives."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import grpclib.const
import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
import pytest
from grpclib import GRPCError
from grpclib.const import Status
from grpclib.server import Stream

from tritonactor.frontends.grpc.connection import GrpcServer
from tritonactor.frontends.grpc.unary import UnaryStream, unary_answers

pytestmark = pytest.mark.anyio

METHOD = "/test.Echo/Echo"
STREAMING = "/test.Echo/Chat"


class Raw:
    def __init__(self, data: bytes) -> None:
        self.data = data

    @classmethod
    def FromString(cls, data: bytes) -> Raw:
        return cls(data)

    def SerializeToString(self) -> bytes:
        return self.data


Answer = Callable[[Stream[Raw, Raw]], Any]


async def reversed_echo(stream: Stream[Raw, Raw]) -> None:
    message = await stream.recv_message()
    await stream.send_message(Raw(message.data[::-1]))


class Service:
    def __init__(self, answer: Answer, one_write: bool) -> None:
        self.answer = answer
        self.one_write = one_write
        self.classes: list[type] = []

    async def handle(self, stream: Stream[Raw, Raw]) -> None:
        self.classes.append(type(stream))
        await self.answer(stream)

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        mapping = {
            METHOD: grpclib.const.Handler(
                self.handle, grpclib.const.Cardinality.UNARY_UNARY, Raw, Raw
            )
        }
        return unary_answers(mapping) if self.one_write else mapping


class Transport:
    """Records the server's writes."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def is_closing(self) -> bool:
        return False


async def call(
    answer: Answer, one_write: bool, payload: bytes = b"abc", window: int | None = None
) -> tuple[list[tuple[str, Any]], int, Service]:
    """One unary call of METHOD carrying `payload`: what the client received (its events,
    the answer's DATA joined), how many writes the answer took, and the service."""
    service = Service(answer, one_write)
    protocol = GrpcServer([service])._protocol_factory()
    transport = Transport()
    protocol.connection_made(transport)  # type: ignore[arg-type]
    client = h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
    )
    if window is not None:
        client.local_settings = h2.settings.Settings(
            client=True, initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window}
        )
    client.initiate_connection()
    received: list[tuple[str, Any]] = []
    data = bytearray()
    ended = False

    def exchange() -> None:
        nonlocal ended
        while transport.writes or client.data_to_send(0):
            pending, transport.writes[:] = b"".join(transport.writes), []
            for event in client.receive_data(pending):
                if isinstance(event, h2.events.ResponseReceived):
                    received.append(("headers", event.headers))
                elif isinstance(event, h2.events.DataReceived):
                    data.extend(event.data)
                    # a window given back as the client reads, as a client does
                    client.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                    with contextlib.suppress(h2.exceptions.StreamClosedError):  # answered
                        client.increment_flow_control_window(event.flow_controlled_length, 1)
                elif isinstance(event, h2.events.TrailersReceived):
                    received.append(("trailers", event.headers))
                elif isinstance(event, h2.events.StreamEnded):
                    ended = True
                elif isinstance(event, h2.events.StreamReset):
                    received.append(("reset", event.error_code))
            out = client.data_to_send()
            if out:
                protocol.data_received(out)

    exchange()
    client.send_headers(
        1,
        [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", METHOD),
            (":authority", "test"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ],
    )
    client.send_data(1, b"\0" + len(payload).to_bytes(4, "big") + payload, end_stream=True)
    protocol.data_received(client.data_to_send())
    writes = 0
    for _ in range(1000):  # loop iterations, not time: the handler needs a few
        await asyncio.sleep(0)
        writes += len(transport.writes)
        exchange()
        if ended:
            break
    assert ended, received
    received.append(("data", bytes(data)))
    return received, writes, service


def grpc_message(payload: bytes) -> bytes:
    return b"\0" + len(payload).to_bytes(4, "big") + payload


async def test_a_unary_answer_is_one_write_of_grpclibs_frames() -> None:
    ours, our_writes, service = await call(reversed_echo, one_write=True)
    theirs, their_writes, plain = await call(reversed_echo, one_write=False)
    assert ours == theirs
    assert ours[-1] == ("data", grpc_message(b"cba"))
    assert [kind for kind, _ in ours] == ["headers", "trailers", "data"]
    assert (our_writes, their_writes) == (1, 3)
    assert service.classes == [UnaryStream] and plain.classes == [Stream]


async def test_an_error_is_grpclibs_trailers_only_answer() -> None:
    async def refuse(stream: Stream[Raw, Raw]) -> None:
        await stream.recv_message()
        raise GRPCError(Status.INVALID_ARGUMENT, "no, and 100% sure")

    ours, _, _ = await call(refuse, one_write=True)
    theirs, _, _ = await call(refuse, one_write=False)
    assert ours == theirs
    (kind, headers), *_ = ours
    assert kind == "headers" and ("grpc-status", "3") in headers


async def test_a_status_after_the_message_follows_it_as_grpclib_sends_it() -> None:
    async def answer_then_fail(stream: Stream[Raw, Raw]) -> None:
        await stream.recv_message()
        await stream.send_message(Raw(b"partial"))
        await stream.send_trailing_metadata(status=Status.ABORTED, status_message="stopped")

    ours, _, _ = await call(answer_then_fail, one_write=True)
    theirs, _, _ = await call(answer_then_fail, one_write=False)
    assert ours == theirs
    assert ("grpc-status", str(Status.ABORTED.value)) in dict(ours)["trailers"]


async def test_initial_metadata_from_the_handler_goes_out_as_grpclib_sends_it() -> None:
    async def with_metadata(stream: Stream[Raw, Raw]) -> None:
        message = await stream.recv_message()
        await stream.send_initial_metadata(metadata={"x-answer": "yes"})
        await stream.send_message(Raw(message.data))

    ours, our_writes, _ = await call(with_metadata, one_write=True)
    theirs, their_writes, _ = await call(with_metadata, one_write=False)
    assert ours == theirs
    assert ("x-answer", "yes") in dict(ours)["headers"]
    assert our_writes == their_writes


async def test_an_answer_larger_than_the_window_goes_out_as_the_window_allows() -> None:
    payload = bytes(range(256)) * 8  # 2 KiB, the client's window 100 bytes
    ours, our_writes, _ = await call(reversed_echo, one_write=True, payload=payload, window=100)
    theirs, _, _ = await call(reversed_echo, one_write=False, payload=payload, window=100)
    assert ours == theirs
    assert ours[-1] == ("data", grpc_message(payload[::-1]))
    assert our_writes > 3  # in pieces, each as the client gave the window back


async def test_only_unary_handlers_answer_in_one_write() -> None:
    async def chat(stream: Stream[Raw, Raw]) -> None:
        pass

    streaming = grpclib.const.Handler(chat, grpclib.const.Cardinality.STREAM_STREAM, Raw, Raw)
    unary = grpclib.const.Handler(chat, grpclib.const.Cardinality.UNARY_UNARY, Raw, Raw)
    wrapped = unary_answers({STREAMING: streaming, METHOD: unary})
    assert wrapped[STREAMING] is streaming
    assert wrapped[METHOD].func is not chat
