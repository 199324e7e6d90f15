"""The gRPC front end's HTTP/2 connections (frontends/grpc/connection.py): frames of up to
4 MiB, and received DATA frames not formatted for h2's trace log."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

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
    receive = server._receive_frame
    assert not quiet_data_frames(server)
    assert server._receive_frame == receive


async def test_a_client_may_send_a_large_message_in_one_frame() -> None:
    server = GrpcServer([Echo()])
    await server.start("127.0.0.1", 0)
    assert server._server is not None
    port = server._server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        client.initiate_connection()
        client.increment_flow_control_window(64 * MiB)
        client.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 64 * MiB})
        writer.write(client.data_to_send())

        async def until(done: Any) -> list[Any]:
            seen: list[Any] = []
            while not done(seen):
                data = await asyncio.wait_for(reader.read(1 << 20), 30)
                assert data, "the server closed the connection"
                seen += client.receive_data(data)
                writer.write(client.data_to_send())
            return seen

        settings = await until(
            lambda seen: any(
                isinstance(e, h2.events.RemoteSettingsChanged)
                and h2.settings.SettingCodes.MAX_FRAME_SIZE in e.changed_settings
                for e in seen
            )
        )
        assert client.max_outbound_frame_size == FRAME, settings
        payload = bytes(range(256)) * (4 * 1024)  # 1 MiB
        message = b"\0" + struct.pack(">I", len(payload)) + payload
        client.send_headers(
            1,
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", METHOD),
                (":authority", "test"),
                ("te", "trailers"),
                ("content-type", "application/grpc"),
            ],
        )
        # The server's window, as grpclib opens it, takes the message whole.
        await until(lambda seen: client.local_flow_control_window(1) >= len(message))
        client.send_data(1, message, end_stream=True)
        sent = client.data_to_send()
        # One DATA frame: its 9-byte header then the message (the HEADERS frame before it).
        frame = struct.pack(">I", len(message))[1:] + b"\x00\x01" + struct.pack(">I", 1)
        assert frame + message in sent
        writer.write(sent)
        events = await until(lambda seen: any(isinstance(e, h2.events.StreamEnded) for e in seen))
        answer = b"".join(e.data for e in events if isinstance(e, h2.events.DataReceived))
        assert answer == b"\0" + struct.pack(">I", len(payload)) + payload[::-1]
        trailers = [e for e in events if isinstance(e, h2.events.TrailersReceived)]
        assert (b"grpc-status", b"0") in trailers[0].headers
    finally:
        writer.close()
        server.close()
        await server.wait_closed()
