"""The gRPC front end's HTTP/2 connections (frontends/grpc/connection.py): frames of up to
4 MiB, received DATA frames not formatted for h2's trace log, and the cached HPACK coders a
served connection gets (their own tests: test_hpack_cache.py)."""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncIterator
from typing import Any

import anyio
import grpclib.const
import h2.config
import h2.connection
import h2.events
import h2.settings
import hyperframe.frame
import pytest

from tritonactor.frontends.grpc.connection import FRAME, GrpcServer, quiet_data_frames

pytestmark = pytest.mark.anyio

METHOD = "/test.Echo/Echo"
MiB = 1024 * 1024


class Raw:
    def __init__(self, data: bytes) -> None:
        self.data = data

    @classmethod
    def FromString(cls, data: bytes) -> Raw:
        return cls(data)

    def SerializeToString(self) -> bytes:
        return self.data


class Echo:
    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        return {
            METHOD: grpclib.const.Handler(
                self.echo, grpclib.const.Cardinality.UNARY_UNARY, Raw, Raw
            )
        }

    async def echo(self, stream: Any) -> None:
        message = await stream.recv_message()
        await stream.send_message(Raw(message.data[::-1]))


PAYLOAD = b"<the payload>"


class Formatted(Exception):
    """Raised where h2 formats a frame's payload."""


def _client_data(payload: bytes) -> tuple[bytes, bytes]:
    """A client's preface and one request's HEADERS, and its DATA frame carrying `payload`."""
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    headers = [(":method", "POST"), (":scheme", "http"), (":path", "/x"), (":authority", "t")]
    client.send_headers(1, headers)
    opening = client.data_to_send()
    client.send_data(1, payload, end_stream=True)
    return opening, client.data_to_send()


def test_a_received_data_frame_is_not_formatted(monkeypatch: pytest.MonkeyPatch) -> None:
    original = hyperframe.frame._raw_data_repr

    def formatted(data: Any) -> str:
        if data and PAYLOAD in bytes(data):
            raise Formatted
        return original(data)

    monkeypatch.setattr(hyperframe.frame, "_raw_data_repr", formatted)
    opening, data = _client_data(PAYLOAD)

    # Why: h2 formats every frame it receives, the payload of a DATA frame included.
    plain = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    plain.initiate_connection()
    plain.receive_data(opening)
    with pytest.raises(Formatted):
        plain.receive_data(data)

    server = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    assert quiet_data_frames(server)
    server.initiate_connection()
    server.receive_data(opening)
    events = server.receive_data(data)
    received = [e for e in events if isinstance(e, h2.events.DataReceived)]
    assert [(e.stream_id, e.data) for e in received] == [(1, PAYLOAD)]
    assert received[0].stream_ended is not None


def test_h2_internals_not_as_expected_leave_the_connection_alone() -> None:
    server = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    server._frame_dispatch_table = {}  # type: ignore[attr-defined]
    assert not quiet_data_frames(server)
    assert type(server) is h2.connection.H2Connection


# A SETTINGS frame's acknowledgement: length 0, type 4, flag ACK, stream 0.
SETTINGS_ACK = b"\x00\x00\x00\x04\x01\x00\x00\x00\x00"
HEADERS = [
    (":method", "POST"),
    (":scheme", "http"),
    (":path", METHOD),
    (":authority", "test"),
    ("te", "trailers"),
    ("content-type", "application/grpc"),
]


@contextlib.asynccontextmanager
async def _connected(
    lanes: bool = True,
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter, h2.connection.H2Connection]]:
    """A served connection to an `Echo` server (with a lane or without), and an h2 client
    for it that has sent its preface."""
    server = GrpcServer([Echo()], lanes=lanes)
    await server.start("127.0.0.1", 0)
    assert server._server is not None
    port = server._server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        client.initiate_connection()
        yield reader, writer, client
    finally:
        writer.close()
        server.close()
        await server.wait_closed()


async def test_a_large_frame_may_follow_the_settings_acknowledgement_at_once() -> None:
    """A client uses the server's frame size as soon as it has read it (RFC 9113, 6.5.3): its
    acknowledgement and a DATA frame over h2's default size arrive in one write, and in one
    read of the server's (a frame still arriving is checked once whole, after the
    acknowledgement was read)."""
    async with _connected() as (reader, writer, client):
        client.increment_flow_control_window(64 * MiB)
        client.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 64 * MiB})
        writer.write(client.data_to_send())

        async def read() -> list[Any]:
            data = await asyncio.wait_for(reader.read(1 << 20), 30)
            assert data, "the server closed the connection"
            return client.receive_data(data)

        while client.max_outbound_frame_size != FRAME:  # (acknowledged, not written yet)
            await read()
        payload = bytes(range(256)) * 160  # 40 KiB
        message = b"\0" + struct.pack(">I", len(payload)) + payload
        client.send_headers(1, HEADERS)
        assert client.local_flow_control_window(1) >= len(message)  # grpclib's windows
        client.send_data(1, message, end_stream=True)
        sent = client.data_to_send()
        # One DATA frame (its 9-byte header, then the message), after the acknowledgement.
        frame = struct.pack(">I", len(message))[1:] + b"\x00\x01" + struct.pack(">I", 1)
        assert SETTINGS_ACK in sent and sent.index(SETTINGS_ACK) < sent.index(frame + message)
        writer.write(sent)
        events: list[Any] = []
        while not any(isinstance(e, h2.events.StreamEnded) for e in events):
            events += await read()
            writer.write(client.data_to_send())
        answer = b"".join(e.data for e in events if isinstance(e, h2.events.DataReceived))
        assert answer == b"\0" + struct.pack(">I", len(payload)) + payload[::-1]
        trailers = [e for e in events if isinstance(e, h2.events.TrailersReceived)]
        assert (b"grpc-status", b"0") in trailers[0].headers


async def test_grpc_clients_first_calls_on_fresh_channels() -> None:
    """gRPC's own client (grpcio's C core, as tritonclient's), a fresh channel for each call, its
    first message just over h2's default frame size and larger."""
    import grpc

    server = GrpcServer([Echo()])
    await server.start("127.0.0.1", 0)
    assert server._server is not None
    port = server._server.sockets[0].getsockname()[1]

    def call(size: int) -> bytes:
        payload = bytes(range(256)) * (size // 256)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            answer = channel.unary_unary(METHOD)(payload, timeout=30)
        assert answer == payload[::-1]
        return answer

    try:
        for size in [20 * 1024, 60 * 1024, 1024 * 1024] * 8:
            await anyio.to_thread.run_sync(call, size)
    finally:
        server.close()
        await server.wait_closed()


class _Transport:
    def write(self, data: bytes) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def is_closing(self) -> bool:
        return False


async def test_a_served_connection_is_tuned() -> None:
    from tritonactor.frontends.grpc.connection import _QuietConnection
    from tritonactor.frontends.grpc.hpack_cache import _CachedDecoder, _CachedEncoder

    protocol = GrpcServer([Echo()])._protocol_factory()
    protocol.connection_made(_Transport())  # type: ignore[arg-type]
    connection = protocol.connection._connection
    assert type(connection) is _QuietConnection
    assert type(connection.decoder) is _CachedDecoder
    assert type(connection.encoder) is _CachedEncoder
    assert connection.max_inbound_frame_size == FRAME


@pytest.mark.parametrize("lanes", [True, False])
async def test_a_frame_of_a_type_http2_does_not_define_is_ignored(lanes: bool) -> None:
    """RFC 9113 (4.1): frames of unknown types (an extension's) are ignored, with a lane or
    without one (h2 reports them as an event grpclib has no handler for: it raised, and the
    connection ended)."""
    async with _connected(lanes) as (reader, writer, client):
        preface = client.data_to_send()
        client.send_headers(1, HEADERS)
        client.send_data(1, b"\0" + struct.pack(">I", 3) + b"abc", end_stream=True)
        # frames of types no one defines: on the connection, on the call's stream before it
        # opens, and on it once open (the lane's stream)
        unknown = b"\x00\x00\x03\xfa\x00\x00\x00\x00\x00xyz"
        unknown += b"\x00\x00\x00\xfb\x00\x00\x00\x00\x01"
        call = client.data_to_send()
        opening = 9 + int.from_bytes(call[:3], "big")  # the HEADERS frame
        mid_call = b"\x00\x00\x02\xfc\x00\x00\x00\x00\x01ab"  # on the call's open stream
        sent = preface + unknown + call[:opening] + mid_call + call[opening:]
        writer.write(sent[: len(sent) // 2])  # in two writes, cut at its middle
        await writer.drain()
        await asyncio.sleep(0)
        writer.write(sent[len(sent) // 2 :])
        events: list[Any] = []
        while not any(isinstance(e, h2.events.StreamEnded) for e in events):
            data = await asyncio.wait_for(reader.read(1 << 16), 30)
            assert data, "the server closed the connection"
            events += client.receive_data(data)
        answer = b"".join(e.data for e in events if isinstance(e, h2.events.DataReceived))
        assert answer == b"\0" + struct.pack(">I", 3) + b"cba"
