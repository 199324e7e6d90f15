"""How a gRPC method receives its request messages: the size each message declares (its
length prefix) is checked before a byte of it is read, and a message that does not parse is
the client's error, never a traceback.

grpclib (0.4.9) has no limit on a message's size: its `Stream.recv_message` reads whatever
length the prefix announces, acknowledging each piece as it comes, so a client could make it
buffer up to 4 GiB. `bounded` gives every handler a stream whose `recv_message` is `receive`
here: the same steps as grpclib's, with the check in between.

- A message longer than the limit: RESOURCE_EXHAUSTED, "Received message larger than max
  (N vs. M)" (gRPC's own words for it), and the stream ends without reading it.
- Bytes that are not the method's message (protobuf's DecodeError, a string that is not
  UTF-8, a message or its prefix cut short): INVALID_ARGUMENT, "Unable to parse request: ..."
  (Triton answers INTERNAL with those words). betterproto2's parser takes a field cut short at
  the message's end for the message's end, so the methods it serves have their bytes parsed by
  protobuf's own parser (upb, from the same descriptor) too, as strictly as Triton's.
- A compressed message (its prefix's flag set) is inflated as the call's `grpc-encoding`
  header says, gzip or deflate (gRPC's zlib stream), as Triton's gRPC core does: the limit
  holds for its length as sent and as inflated (RESOURCE_EXHAUSTED); another encoding is
  UNIMPLEMENTED, and bytes that do not inflate INTERNAL, as gRPC answers them.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

import betterproto2
import grpclib.const
import grpclib.protocol
import grpclib.server
from google.protobuf import message_factory
from grpclib import GRPCError
from grpclib.const import Status

from tritonactor.core.inflate import GZIP, ZLIB, Inflated, TooLarge, Truncated, inflate

Handler = Callable[[grpclib.server.Stream[Any, Any]], Awaitable[None]]


def bounded(
    mapping: dict[str, grpclib.const.Handler], max_size: int
) -> dict[str, grpclib.const.Handler]:
    """`mapping` with each handler receiving its messages through `receive`, at most
    `max_size` bytes each."""
    return {
        method: handler._replace(
            func=_bounded(
                handler.func,
                max_size,
                _strict_parser(handler.request_type),
                required=not handler.cardinality.client_streaming,
            )
        )
        for method, handler in mapping.items()
    }


def _strict_parser(request_type: Any) -> Callable[[bytes], object] | None:
    """protobuf's parser of a betterproto2 message type (None for another type: the upb
    messages of the infer methods are parsed strictly already)."""
    if isinstance(request_type, type) and issubclass(request_type, betterproto2.Message):
        return message_factory.GetMessageClass(request_type.DESCRIPTOR).FromString
    return None


def _bounded(
    func: Handler, max_size: int, strict: Callable[[bytes], object] | None, required: bool
) -> Handler:
    async def call(stream: grpclib.server.Stream[Any, Any]) -> None:
        # An instance attribute: `recv_message()` and `async for message in stream` use it.
        stream.recv_message = functools.partial(receive, stream, max_size, strict, required)  # type: ignore[method-assign]
        await func(stream)

    return call


async def receive(
    stream: grpclib.server.Stream[Any, Any],
    max_size: int,
    strict: Callable[[bytes], object] | None = None,
    required: bool = False,
) -> Any:
    """The next message of `stream` (None at its end), as grpclib's `Stream.recv_message`
    reads it, once its length is known to be at most `max_size`; its bytes are also parsed by
    `strict` when given, which raises on bytes that are not the message. `required`: the
    call's one request (a unary call), whose absence is the client's error."""
    raw = stream._stream
    data = await read_message(raw, max_size)
    if data is None:
        if required:
            raise no_message()
        return None
    codec, recv_type = stream._codec, stream._recv_type
    message = parse_message(lambda data: codec.decode(data, recv_type), data, strict)
    (message,) = await stream._dispatch.recv_message(message)
    stream._messages_received += 1
    raw.connection.messages_received += 1
    return message


async def read_message(
    raw: grpclib.protocol.Stream, max_size: int, view: bool = False
) -> bytes | memoryview | None:
    """The bytes of the next length-prefixed message on `raw` (None at its end), read once
    its length is known to be at most `max_size`; with `view` (a lane's stream), a view of
    what the socket read where the message came in one piece."""
    try:
        prefix = await raw.recv_data(5)
    except AssertionError:  # grpclib's word for a stream that ended inside the prefix
        raise _truncated() from None
    if not prefix:
        return None
    if len(prefix) < 5:
        raise _truncated()
    length = int.from_bytes(prefix[1:5], "big")
    if length > max_size:
        raise GRPCError(
            Status.RESOURCE_EXHAUSTED,
            f"Received message larger than max ({length} vs. {max_size}). Use "
            "--grpc-max-message-size to increase the limit.",
        )
    try:
        data = await (raw.recv_view(length) if view else raw.recv_data(length))  # type: ignore[attr-defined]
    except AssertionError:  # the same, inside the message
        raise _truncated() from None
    if len(data) != length:
        raise _truncated()
    if prefix[0]:
        return await _inflate(data, raw, max_size)
    return data


# zlib's window bits for each `grpc-encoding` gRPC defines but identity.
_WINDOW_BITS = {"gzip": GZIP, "deflate": ZLIB}


async def _inflate(data: bytes | memoryview, raw: grpclib.protocol.Stream, max_size: int) -> bytes:
    """A compressed message's bytes, inflated as its call's `grpc-encoding` says (off the
    event loop when large, core/inflate.py)."""
    headers = getattr(raw, "headers", None) or ()
    encoding = next((value for name, value in headers if name == "grpc-encoding"), "identity")
    bits = _WINDOW_BITS.get(encoding)
    if bits is None:
        raise GRPCError(
            Status.UNIMPLEMENTED,
            f"Compressed message with grpc-encoding '{encoding}': not supported (gzip, deflate)",
        )
    try:
        return await inflate(data, bits, max_size)
    except TooLarge:
        raise GRPCError(
            Status.RESOURCE_EXHAUSTED,
            f"Received message larger than max (more than {max_size} bytes once inflated). "
            "Use --grpc-max-message-size to increase the limit.",
        ) from None
    except Truncated:
        raise GRPCError(
            Status.INTERNAL, "Unable to decompress the message: it ends early"
        ) from None
    except Inflated as error:
        raise GRPCError(Status.INTERNAL, f"Unable to decompress the message: {error}") from None


def no_message() -> GRPCError:
    """A unary call that ended with no request message (grpclib's handlers assert one)."""
    return GRPCError(Status.INVALID_ARGUMENT, "Unable to parse request: no request message")


def parse_message(
    decode: Callable[[bytes], Any], data: bytes, strict: Callable[[bytes], object] | None = None
) -> Any:
    """`data` parsed by `decode` (and `strict`, when given); bytes that are not the message are
    the client's error: INVALID_ARGUMENT."""
    try:
        message = decode(data)
        if strict is not None:
            strict(data)
    except Exception as error:  # whatever the message's parser raises: the bytes are wrong
        raise GRPCError(
            Status.INVALID_ARGUMENT, f"Unable to parse request: {_reason(error)}"
        ) from None
    return message


def _truncated() -> GRPCError:
    return GRPCError(Status.INVALID_ARGUMENT, "Unable to parse request: truncated message")


def _reason(error: Exception) -> str:
    if isinstance(error, UnicodeDecodeError):
        return "a string field is not valid UTF-8"
    text = str(error)
    return text if text else type(error).__name__


__all__ = ["bounded", "receive"]
