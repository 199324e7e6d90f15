"""A unary call's answer in one write.

grpclib sends a unary answer in three steps, each through coroutines of its own and each
ending in a socket write: the headers, the message, the trailers. `UnaryStream` keeps the
headers and the message until the trailers are due and gives h2 all three at once, so the
answer leaves in one write. The frames are the ones grpclib sends (HEADERS, DATA, HEADERS with
END_STREAM, the same header fields), so a client sees the same answer.

What is not that common case goes out as grpclib sends it: initial metadata given by the
handler, a status other than OK, trailing metadata or status details, and a message larger
than the stream's flow-control window or the peer's frame size (its headers are written, then
grpclib sends the message in pieces as the window allows).

`unary_answers` makes every unary-unary handler of a mapping answer that way: it turns the
`grpclib.server.Stream` it is given into a `UnaryStream` (the same object, its class swapped)
and, once the handler returns, sends the trailers of an answer still kept (the headers and
the message alone where the handler failed after sending it: grpclib sends its error status
after), so the answer is written while the call's deadline and the server's drain still watch
it, as grpclib's own answer is. A deadline or the drain's exit timeout that cuts the wait for
the socket short drops the kept answer, as grpclib, blocked before its headers, has sent
nothing: grpclib then sends its trailers-only status. A cancel from the handler sends the kept
answer before the reset, as grpclib has sent it by then. A stream of another class is left as
it is, and so is a stream whose events carry listeners for initial or trailing metadata
(grpclib.events): they see each step as grpclib takes it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpclib.const
import grpclib.server
from grpclib.const import Status
from grpclib.events import SendInitialMetadata, SendTrailingMetadata
from grpclib.exceptions import ProtocolError
from h2.exceptions import StreamClosedError

from tritonactor.frontends.grpc.lane_stream import LaneStream

Handler = Callable[[grpclib.server.Stream[Any, Any]], Awaitable[None]]

_OK_TRAILERS = [("grpc-status", str(Status.OK.value))]
# What a call past its deadline ends with, in Triton's (and grpcio's) words: grpclib sends the
# status alone, and clients then show an empty message.
DEADLINE_MESSAGE = "Deadline Exceeded"


class WordedStream(grpclib.server.Stream):  # type: ignore[type-arg]
    """A server stream that words the status of a call past its deadline (`unary_answers`
    gives every handler's stream this class, or `UnaryStream`)."""

    async def send_trailing_metadata(
        self,
        *,
        status: Status = Status.OK,
        status_message: str | None = None,
        status_details: Any = None,
        metadata: Any = None,
    ) -> None:
        if status is Status.DEADLINE_EXCEEDED and status_message is None:
            status_message = DEADLINE_MESSAGE
        await super().send_trailing_metadata(
            status=status,
            status_message=status_message,
            status_details=status_details,
            metadata=metadata,
        )


class UnaryStream(WordedStream):
    """A server stream of a unary-unary method whose answer is written once (see above)."""

    _answer_headers: list[tuple[str, str]] | None = None
    _answer_data: bytes | None = None

    async def send_initial_metadata(self, *, metadata: Any = None) -> None:
        if metadata or self._send_initial_metadata_done:
            await super().send_initial_metadata(metadata=metadata)
            return
        self._answer_headers = [(":status", "200"), ("content-type", self._content_type)]
        self._send_initial_metadata_done = True

    async def send_message(self, message: Any) -> None:
        if not self._send_initial_metadata_done:
            await self.send_initial_metadata()
        if self._answer_headers is None:  # the headers went out already: as grpclib sends it
            await super().send_message(message)
            return
        if self._send_message_done:
            raise ProtocolError("Message was already sent")
        (message,) = await self._dispatch.send_message(message)
        data = self._codec.encode(message, self._send_type)
        self._answer_data = b"\0" + len(data).to_bytes(4, "big") + data
        self._send_message_done = True
        self._messages_sent += 1
        connection = self._stream.connection
        connection.messages_sent += 1
        connection.last_message_sent = time.monotonic()

    async def send_trailing_metadata(
        self,
        *,
        status: Status = Status.OK,
        status_message: str | None = None,
        status_details: Any = None,
        metadata: Any = None,
    ) -> None:
        if self._answer_headers is None:
            await super().send_trailing_metadata(
                status=status,
                status_message=status_message,
                status_details=status_details,
                metadata=metadata,
            )
            return
        common = (
            status is Status.OK
            and status_message is None
            and status_details is None
            and not metadata
            and self._send_message_done
        )
        if self._send_trailing_metadata_done:
            raise ProtocolError("Trailing metadata was already sent")
        await self._send_answer(_OK_TRAILERS if common else None)
        if not common:
            await super().send_trailing_metadata(
                status=status,
                status_message=status_message,
                status_details=status_details,
                metadata=metadata,
            )

    async def cancel(self) -> None:
        if self._answer_headers is not None and not self._cancel_done:
            # what grpclib would have written already goes out before the reset
            with contextlib.suppress(StreamClosedError):
                await self._send_answer(None)
        await super().cancel()

    async def written(self) -> None:
        """Write the kept headers and message, not the trailers: a handler failed after sending
        them, and grpclib would have written them inside the handler."""
        if (
            self._answer_headers is not None
            and not self._cancel_done
            and not self._stream._transport.is_closing()
        ):
            with contextlib.suppress(StreamClosedError):
                await self._send_answer(None)

    async def finish(self) -> None:
        """Send the trailers of an answer still kept when the handler returned."""
        if (
            self._answer_headers is not None
            and self._send_message_done
            and not self._cancel_done
            and not self._stream._transport.is_closing()
        ):
            await self.send_trailing_metadata()

    async def _send_answer(self, trailers: list[tuple[str, str]] | None) -> None:
        """The kept headers and message, then `trailers` (None: sent by grpclib after).

        The answer stays kept until it is written: a wait cut short (a deadline, a cancel)
        leaves it for whatever grpclib sends next."""
        raw = self._stream
        h2 = raw._h2_connection
        connection = raw.connection
        try:
            await connection.write_ready.wait()
        except BaseException:
            # cut short before a byte of it went out (a deadline, the drain's exit timeout, a
            # reset): as grpclib's answer, blocked before its headers, nothing was sent, and
            # grpclib's next send is its trailers-only answer
            if self._answer_headers is not None:
                self._answer_headers = self._answer_data = None
                self._send_initial_metadata_done = False
            raise
        headers, data = self._answer_headers, self._answer_data
        if headers is None:  # written meanwhile, by another task's send
            raise ProtocolError("Trailing metadata was already sent")
        if isinstance(raw, LaneStream):
            raw.check_open()
            self._answer_headers = self._answer_data = None
            if data is None or raw.fits(len(data)):
                raw.send_answer(
                    headers, None if data is None else (data,), trailers, len(data or b"")
                )
            else:
                raw.send_answer(headers, None, None)
                await raw.send_data(data)  # in pieces, as the window allows
                if trailers is not None:
                    await raw.send_headers(trailers, end_stream=True)
            if trailers is not None:
                self._send_trailing_metadata_done = True
            return
        if raw.id not in h2.streams:  # grpclib's own check before it sends headers
            raise StreamClosedError(raw.id)
        self._answer_headers = self._answer_data = None
        h2.send_headers(raw.id, headers)
        connection.headers_send_process()
        if data is not None:
            if len(data) <= min(h2.local_flow_control_window(raw.id), h2.max_outbound_frame_size):
                h2.send_data(raw.id, data)
                raw.data_sent += len(data)
                connection.data_sent += len(data)
                connection.data_send_process()
            else:
                raw._transport.write(h2.data_to_send())
                await raw.send_data(data)  # in pieces, as the window allows
        if trailers is not None:
            h2.send_headers(raw.id, trailers, end_stream=True)
            self._send_trailing_metadata_done = True
        raw._transport.write(h2.data_to_send())


def unary_answers(mapping: dict[str, grpclib.const.Handler]) -> dict[str, grpclib.const.Handler]:
    """`mapping` with each unary-unary handler answering through a `UnaryStream`, and every
    other one through a `WordedStream`."""
    return {
        method: handler._replace(func=_answering_once(handler.func))
        if handler.cardinality is grpclib.const.Cardinality.UNARY_UNARY
        else handler._replace(func=_worded(handler.func))
        for method, handler in mapping.items()
    }


def _worded(func: Handler) -> Handler:
    async def call(stream: grpclib.server.Stream[Any, Any]) -> None:
        if type(stream) is grpclib.server.Stream:
            stream.__class__ = WordedStream
        await func(stream)

    return call


def _answering_once(func: Handler) -> Handler:
    async def call(stream: grpclib.server.Stream[Any, Any]) -> None:
        if type(stream) is not grpclib.server.Stream:
            await func(stream)
            return
        if _metadata_listened(stream):
            stream.__class__ = WordedStream
            await func(stream)
            return
        stream.__class__ = UnaryStream
        try:
            await func(stream)
        except Exception:
            await stream.written()  # type: ignore[attr-defined]
            raise
        await stream.finish()  # type: ignore[attr-defined]

    return call


def _metadata_listened(stream: grpclib.server.Stream[Any, Any]) -> bool:
    listeners = stream._dispatch._listeners
    return bool(listeners.get(SendInitialMetadata) or listeners.get(SendTrailingMetadata))


__all__ = ["DEADLINE_MESSAGE", "UnaryStream", "WordedStream", "unary_answers"]
