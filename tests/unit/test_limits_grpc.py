"""How gRPC handlers receive their messages (tritonactor/frontends/grpc/limits.py), on grpclib's
own server and client through its in-memory channel: the length prefix is checked before the
message is read, and bytes that do not parse are INVALID_ARGUMENT."""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Callable
from typing import Any

import grpclib.const
import grpclib.server
import pytest
from grpclib import GRPCError
from grpclib.client import Channel
from grpclib.const import Cardinality, Status
from grpclib.testing import ChannelFor

from tritonactor._proto import inference as pb
from tritonactor._proto_c.grpc_service_pb2 import ModelInferResponse
from tritonactor.frontends.grpc.limits import _inflate, _strict_parser, bounded
from tritonactor.frontends.grpc.wire import InferRequestMessage
from tritonactor.observability.logging import settings_from_grpc

pytestmark = pytest.mark.anyio

LIMIT = 1000


class Raw:
    """Bytes sent as they are (the client's side)."""

    def __init__(self, data: bytes = b"") -> None:
        self.data = data

    def SerializeToString(self) -> bytes:
        return self.data

    @classmethod
    def FromString(cls, data: bytes) -> Raw:
        return cls(data)


class Echo:
    """Answers each request with its model name: unary (upb), a stream, and betterproto."""

    def __init__(self) -> None:
        self.received: list[str] = []

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        return bounded(
            {
                "/t.Echo/Unary": grpclib.const.Handler(
                    self.unary, Cardinality.UNARY_UNARY, InferRequestMessage, ModelInferResponse
                ),
                "/t.Echo/Stream": grpclib.const.Handler(
                    self.stream, Cardinality.STREAM_STREAM, InferRequestMessage, ModelInferResponse
                ),
                "/t.Echo/Betterproto": grpclib.const.Handler(
                    self.betterproto,
                    Cardinality.UNARY_UNARY,
                    pb.ModelMetadataRequest,
                    ModelInferResponse,
                ),
            },
            LIMIT,
        )

    async def unary(self, stream: grpclib.server.Stream[Any, Any]) -> None:
        message = await stream.recv_message()
        self.received.append(message.model_name)
        await stream.send_message(ModelInferResponse(model_name=message.model_name))

    async def stream(self, stream: grpclib.server.Stream[Any, Any]) -> None:
        async for message in stream:
            self.received.append(message.model_name)
            await stream.send_message(ModelInferResponse(model_name=message.model_name))

    async def betterproto(self, stream: grpclib.server.Stream[Any, Any]) -> None:
        message = await stream.recv_message()
        await stream.send_message(ModelInferResponse(model_name=message.name))


async def unary(channel: Channel, path: str, data: bytes) -> bytes:
    async with channel.request(path, Cardinality.UNARY_UNARY, Raw, Raw) as call:
        await call.send_message(Raw(data), end=True)
        reply = await call.recv_message()
        assert reply is not None
        return reply.data


def name(text: str) -> bytes:
    return b"\x0a" + bytes([len(text)]) + text.encode()


async def test_messages_within_the_limit_are_received() -> None:
    echo = Echo()
    async with ChannelFor([echo]) as channel:
        assert await unary(channel, "/t.Echo/Unary", name("m")) == name("m")
        padded = name("m") + b"\x1a" + bytes([120]) + b"x" * 120  # id, to fill it up
        assert await unary(channel, "/t.Echo/Unary", padded) == name("m")
        async with channel.request("/t.Echo/Stream", Cardinality.STREAM_STREAM, Raw, Raw) as call:
            for text in ("a", "b"):
                await call.send_message(Raw(name(text)))
                reply = await call.recv_message()
                assert reply is not None and reply.data == name(text)
            await call.end()
    assert echo.received == ["m", "m", "a", "b"]


async def test_a_message_past_the_limit_is_refused_from_its_length() -> None:
    echo = Echo()
    async with ChannelFor([echo]) as channel:
        big = name("m") + b"\x1a\xf0\x07" + b"x" * 1008  # 1015 bytes
        with pytest.raises(GRPCError) as raised:
            await unary(channel, "/t.Echo/Unary", big)
        assert raised.value.status is Status.RESOURCE_EXHAUSTED
        assert raised.value.message == (
            f"Received message larger than max ({len(big)} vs. {LIMIT}). Use "
            "--grpc-max-message-size to increase the limit."
        )
        assert await unary(channel, "/t.Echo/Unary", name("after")) == name("after")
    assert echo.received == ["after"]


@pytest.mark.parametrize(
    ("path", "data"),
    [
        ("/t.Echo/Unary", b"\x0a\x02\xff\xfe"),  # a model name that is not UTF-8
        ("/t.Echo/Unary", b"\xff\xff\xff"),
        ("/t.Echo/Unary", b"\x0a\x10ab"),  # cut short
        ("/t.Echo/Betterproto", b"\x0a\x02\xff\xfe"),
        # Cut short inside a field, at the message's end: betterproto2 alone would read "ab".
        ("/t.Echo/Betterproto", b"\x0a\x05ab"),
        ("/t.Echo/Betterproto", b"\x0a\x02\x0a"),  # ends inside the key's tag
    ],
)
async def test_bytes_that_do_not_parse_are_invalid_argument(path: str, data: bytes) -> None:
    echo = Echo()
    async with ChannelFor([echo]) as channel:
        with pytest.raises(GRPCError) as raised:
            await unary(channel, path, data)
        assert raised.value.status is Status.INVALID_ARGUMENT
        assert raised.value.message is not None
        assert raised.value.message.startswith("Unable to parse request: ")
    assert echo.received == []


async def test_a_stream_ends_invalid_argument_at_its_first_bad_message() -> None:
    echo = Echo()
    async with ChannelFor([echo]) as channel:
        call = channel.request("/t.Echo/Stream", Cardinality.STREAM_STREAM, Raw, Raw)
        with pytest.raises(GRPCError) as raised:
            async with call:
                await call.send_message(Raw(name("ok")))
                reply = await call.recv_message()
                assert reply is not None
                await call.send_message(Raw(b"\x0a\x02\xff\xfe"))
                await call.recv_message()
    assert raised.value.status is Status.INVALID_ARGUMENT
    assert echo.received == ["ok"]


async def send_raw(channel: Channel, path: str, cardinality: Cardinality, data: bytes) -> None:
    """Send `data` as the whole request stream, framing and all, and read the answer."""
    async with channel.request(path, cardinality, Raw, Raw) as call:
        await call.send_request()
        await call._stream.send_data(data, end_stream=True)
        call._end_done = True
        await call.recv_message()


@pytest.mark.parametrize("prefix", [b"\x00", b"\x00\x00", b"\x00\x00\x00", b"\x00\x00\x00\x00"])
@pytest.mark.parametrize(
    ("path", "cardinality"),
    [
        ("/t.Echo/Unary", Cardinality.UNARY_UNARY),
        ("/t.Echo/Stream", Cardinality.STREAM_STREAM),
        ("/t.Echo/Betterproto", Cardinality.UNARY_UNARY),
    ],
)
async def test_a_prefix_cut_short_is_invalid_argument(
    prefix: bytes, path: str, cardinality: Cardinality
) -> None:
    # The stream ends inside the 5-byte length prefix: grpclib's reader asserts on it.
    echo = Echo()
    async with ChannelFor([echo]) as channel:
        with pytest.raises(GRPCError) as raised:
            await send_raw(channel, path, cardinality, prefix)
        assert raised.value.status is Status.INVALID_ARGUMENT
        assert raised.value.message == "Unable to parse request: truncated message"
        assert await unary(channel, "/t.Echo/Unary", name("after")) == name("after")
    assert echo.received == ["after"]


async def test_a_stream_cut_short_inside_its_second_prefix_answers_the_first() -> None:
    echo = Echo()
    replies: list[bytes] = []
    async with ChannelFor([echo]) as channel:
        first = name("ok")
        data = b"\x00" + len(first).to_bytes(4, "big") + first + b"\x00\x00"
        call = channel.request("/t.Echo/Stream", Cardinality.STREAM_STREAM, Raw, Raw)
        with pytest.raises(GRPCError) as raised:
            async with call:
                await call.send_request()
                await call._stream.send_data(data, end_stream=True)
                call._end_done = True
                async for reply in call:
                    replies.append(reply.data)
    assert raised.value.status is Status.INVALID_ARGUMENT
    assert replies == [first]
    assert echo.received == ["ok"]


@pytest.mark.parametrize(
    ("request_type", "answer"),
    [
        (pb.TraceSettingRequest, "trace_level"),
        (pb.LogSettingsRequest, "log_info"),
    ],
)
def test_a_map_entry_without_a_value_is_received(request_type: Any, answer: str) -> None:
    """Valid protobuf (the value is the empty message), which betterproto2 reads as None: the
    settings RPCs take it as the empty value (tests/e2e/test_bounded_input_e2e.py)."""
    entry = b"\x0a" + bytes([len(answer)]) + answer.encode()
    data = b"\x0a" + bytes([len(entry)]) + entry
    parse_strictly = _strict_parser(request_type)
    assert parse_strictly is not None
    parse_strictly(data)  # protobuf's own parser takes it
    assert request_type().parse(data).settings == {answer: None}


def test_settings_from_grpc_takes_an_entry_without_a_value_as_null() -> None:
    request = pb.LogSettingsRequest().parse(b"\x0a\x0a\x0a\x08log_info")
    assert settings_from_grpc(request) == {"log_info": None}


class Headers:
    """A call's stream as the server keeps it: its request headers (connection.py)."""

    def __init__(self, encoding: str | None) -> None:
        self.headers = [(":path", "/t.Echo/Unary")]
        if encoding is not None:
            self.headers.append(("grpc-encoding", encoding))


@pytest.mark.parametrize(
    ("encoding", "compress"),
    [("gzip", lambda b: gzip.compress(b)), ("deflate", lambda b: zlib.compress(b))],
)
async def test_a_compressed_message_is_inflated_as_its_call_says(
    encoding: str, compress: Callable[[bytes], bytes]
) -> None:
    message = name("m") * 100
    assert await _inflate(compress(message), Headers(encoding), LIMIT) == message  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("encoding", "data", "status", "words"),
    [
        (None, gzip.compress(b"x"), Status.UNIMPLEMENTED, "grpc-encoding 'identity'"),
        ("br", b"\x00", Status.UNIMPLEMENTED, "grpc-encoding 'br'"),
        ("gzip", b"not gzip", Status.INTERNAL, "Unable to decompress the message"),
        ("gzip", gzip.compress(b"x" * 100)[:-9], Status.INTERNAL, "it ends early"),
        ("gzip", gzip.compress(b"x" * (LIMIT + 1)), Status.RESOURCE_EXHAUSTED, "once inflated"),
    ],
)
async def test_a_compressed_message_that_cannot_be_read_is_refused(
    encoding: str | None, data: bytes, status: Status, words: str
) -> None:
    with pytest.raises(GRPCError) as raised:
        await _inflate(data, Headers(encoding), LIMIT)  # type: ignore[arg-type]
    assert raised.value.status is status
    assert words in (raised.value.message or "")
