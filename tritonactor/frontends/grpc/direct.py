"""ModelInfer answered by the lane: a unary call of the hottest method taken without grpclib's
request handler and its stack of wrappers.

A unary ModelInfer call that a connection's lane took (lane.py) passes, under grpclib, its
request handler (the headers checked, a `grpclib.server.Stream` made, the deadline's wrapper,
the server's events dispatched) and then one wrapper each for the answer written once
(unary.py), the drain, the message's size limit and the restricted protocol, before the
service's handler. Each is a few µs; answering without them took the front end's CPU from
~195 to ~165 µs a call (bench/process_cpu.py, docs/benchmarks.md). `DirectInfer` takes such
a call itself, in one task, and does what that stack does, in the same order, with the same
words:

- a call the drain refuses: UNAVAILABLE, `SHUTTING_DOWN`; one it admitted is tracked, and
  answered UNAVAILABLE if the drain's exit timeout cancels it;
- the restricted protocol's header missing: UNAVAILABLE, as guard.py answers;
- the message read as limits.py reads it (its size, compression and parse checked);
- the service's `infer_call` (logged, traced, its errors translated as every handler's);
- the answer in one write (headers, message, trailers), or in pieces past the stream's window
  or the peer's frame size, as unary.py writes it;
- a deadline (`grpc-timeout`) kept by grpclib's own `DeadlineWrapper`: DEADLINE_EXCEEDED;
  also for a deadline already past when the call begins (it expired on its way), which
  grpclib answers UNKNOWN with a traceback in the log (a difference chosen);
- a failure answered as grpclib answers it: a trailers-only response with the status and its
  message (UNKNOWN, "Internal Server Error", for an error of ours, logged), the stream reset
  where the client has not finished sending; a stream reset by the client, or a connection
  lost, cancels the task through the stream's wrapper, as grpclib's, and sends nothing; an
  answer whose stream closed under it is dropped quietly, where grpclib logs a traceback (the
  other difference chosen).

What is not that common case is grpclib's: `accept` declines a call whose headers grpclib
would refuse or read its own way (not POST, another content type, no `te: trailers`, a
`grpc-timeout` grpclib cannot read, binary `-bin` metadata, a header given twice) and every
call on a server with listeners for grpclib's events (grpclib.events), which see each step as
grpclib takes it. The task is grpclib's handler's as its own are (`Handler._tasks`): the
server's close cancels it, and waits for it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any

from grpclib import GRPCError
from grpclib.const import Status
from grpclib.encoding.base import StatusDetailsCodecBase
from grpclib.exceptions import StreamTerminatedError
from grpclib.metadata import Deadline, decode_metadata, encode_bin_value, encode_grpc_message
from grpclib.protocol import Connection
from grpclib.server import Handler
from grpclib.utils import DeadlineWrapper, Wrapper
from h2.exceptions import StreamClosedError

from tritonactor.core.tensors import unchanging
from tritonactor.frontends.drain import SHUTTING_DOWN, Drain, timed_out
from tritonactor.frontends.grpc.lane_stream import WRITE_AS_IS, LaneStream
from tritonactor.frontends.grpc.limits import no_message, parse_message, read_message
from tritonactor.frontends.grpc.unary import DEADLINE_MESSAGE
from tritonactor.frontends.grpc.wire import InferRequestMessage, InferResponseMessage
from tritonactor.frontends.restrictions import INFERENCE, Restrictions, grpc_message

grpclib_log = logging.getLogger("grpclib.server")  # where grpclib logs what it logs here

MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
CONTENT_TYPE = "application/grpc+proto"  # what grpclib answers with its protobuf codec
CONTENT_TYPES = frozenset({"application/grpc", CONTENT_TYPE})
# Tuples: the connection's encoder finds a tuple it encoded before by its identity
# (hpack_cache.py).
_HEADERS = ((":status", "200"), ("content-type", CONTENT_TYPE))
_OK_TRAILERS = (("grpc-status", str(Status.OK.value)),)


# the service's `infer_call(message, carrier, metadata, send)`: the call answered, logged, traced
Infer = Callable[
    [
        InferRequestMessage,
        Mapping[str, Any],
        Any,
        Callable[[InferResponseMessage], Awaitable[None]],
    ],
    Awaitable[None],
]


class DirectInfer:
    """Unary ModelInfer calls taken from a lane and answered here (see above)."""

    def __init__(
        self,
        infer: Infer,
        max_size: int,
        restrictions: Restrictions,
        drain: Drain | None,
        forwards_headers: bool,
    ) -> None:
        self._infer = infer
        self._max_size = max_size
        self._restrictions = restrictions
        self._restricted = restrictions.restricts(INFERENCE)
        self._drain = drain
        # the call's metadata is decoded only where something reads it (the client's
        # traceparent is read from the headers themselves)
        self._needs_metadata = self._restricted or forwards_headers

    def accept(
        self,
        handler: Handler,
        stream: LaneStream,
        headers: list[tuple[str, str]],
        release: Callable[[], Any],
    ) -> bool:
        """Take the call `headers` open on `stream` (its task started); False, and nothing
        done, for a call that is grpclib's."""
        fields = dict(headers)
        if (
            fields.get(":path") != MODEL_INFER
            or fields.get(":method") != "POST"
            or fields.get("content-type") not in CONTENT_TYPES
            or fields.get("te") != "trailers"
            or len(fields) != len(headers)  # a header twice: grpclib's metadata keeps both
            or any(handler.dispatch._listeners.values())
        ):
            return False
        for name in fields:
            if name[-4:] == "-bin":  # binary metadata, which grpclib decodes (or refuses)
                return False
        deadline = None
        if "grpc-timeout" in fields:
            try:
                deadline = Deadline.from_headers(headers)
            except ValueError:  # grpclib answers it
                return False
        handler.__gc_step__()
        stream.headers = headers  # (a compressed message is read by them: limits.py)
        handler._tasks[stream] = handler.loop.create_task(
            self._call(handler, stream, headers, fields, deadline, release)
        )
        return True

    async def _call(
        self,
        handler: Handler,
        stream: LaneStream,
        headers: list[tuple[str, str]],
        fields: dict[str, str],
        deadline: Deadline | None,
        release: Callable[[], Any],
    ) -> None:
        """grpclib's `request_handler` for the call, from its deadline on."""
        try:
            await self._handle(handler, stream, headers, fields, deadline)
        except Exception:  # (in answering a failure: as grpclib's handler logs it)
            grpclib_log.exception("Server error")
        finally:
            release()

    async def _handle(
        self,
        handler: Handler,
        stream: LaneStream,
        headers: list[tuple[str, str]],
        fields: dict[str, str],
        deadline: Deadline | None,
    ) -> None:
        sent: list[bool] = [False]  # whether the answer's headers went out
        try:
            if deadline is None:
                wrapper = stream.wrapper = Wrapper()
                with wrapper:
                    await self._admit(self._serve(stream, headers, fields, sent))
            else:
                wrapper = stream.wrapper = DeadlineWrapper()
                with wrapper.start(deadline), wrapper:
                    await self._admit(self._serve(stream, headers, fields, sent))
        except GRPCError as error:
            await self._fail(handler, stream, sent, error.status, error.message, error.details)
        except TimeoutError:
            if wrapper.cancel_failed:
                grpclib_log.exception("Failed to handle cancellation")
                await self._fail(handler, stream, sent, Status.DEADLINE_EXCEEDED, DEADLINE_MESSAGE)
            elif wrapper.cancelled or (deadline is not None and not deadline.time_remaining()):
                # (also a deadline past before the call began, which expired on its way and
                # `start` refuses: grpclib logs a traceback for it and answers UNKNOWN)
                grpclib_log.info("Deadline exceeded")
                await self._fail(handler, stream, sent, Status.DEADLINE_EXCEEDED, DEADLINE_MESSAGE)
            else:  # the call's own TimeoutError, as grpclib answers it
                grpclib_log.exception("Timeout occurred")
                await self._fail(handler, stream, sent, Status.UNKNOWN, "Internal Server Error")
        except StreamTerminatedError as error:  # reset by the client, or the connection lost
            if wrapper.cancel_failed:
                grpclib_log.exception("Failed to handle cancellation")
            else:
                grpclib_log.info("Request was cancelled: %s", error)
        except StreamClosedError:  # closed under the answer: no one to answer
            pass
        except Exception:
            grpclib_log.exception("Application error")
            await self._fail(handler, stream, sent, Status.UNKNOWN, "Internal Server Error")

    async def _admit(self, work: Coroutine[Any, Any, None]) -> None:
        """`work` (the call's), behind the drain's gate and tracked by it (drain.py's
        `gate_grpc`): a call is answered, for the drain, before its failure's status is
        written."""
        drain = self._drain
        if drain is None:
            await work
            return
        if drain.draining:
            work.close()
            raise GRPCError(Status.UNAVAILABLE, SHUTTING_DOWN)
        task = drain.admitted()
        try:
            await work
        except asyncio.CancelledError:
            if not drain.expired:
                raise
            task.uncancel()  # the drain's exit timeout
            raise GRPCError(Status.UNAVAILABLE, timed_out(drain.exit_timeout)) from None
        finally:
            drain.answered(task)

    async def _serve(
        self,
        stream: LaneStream,
        headers: list[tuple[str, str]],
        fields: dict[str, str],
        sent: list[bool],
    ) -> None:
        metadata = decode_metadata(headers) if self._needs_metadata else None
        if self._restricted:
            missing = self._restrictions.missing(INFERENCE, metadata.get)  # type: ignore[union-attr]
            if missing is not None:
                raise GRPCError(Status.UNAVAILABLE, grpc_message(missing))
        data = await read_message(stream, self._max_size, view=True)
        if data is None:
            raise no_message()
        message = parse_message(InferRequestMessage.FromString, data)
        connection = stream.connection
        connection.messages_received += 1
        kept: list[tuple[list[Any], int]] = []
        await self._infer(message, fields, metadata, functools.partial(_keep, connection, kept))
        if not kept:  # (grpclib answers a unary call without a message UNKNOWN)
            raise RuntimeError("ModelInfer answered without a message")
        await _send(stream, sent, *kept[0])

    async def _fail(
        self,
        handler: Handler,
        stream: LaneStream,
        sent: list[bool],
        status: Status,
        message: str | None = None,
        details: Any = None,
    ) -> None:
        """The status a failed call ends with, as grpclib sends it: trailers-only where nothing
        was sent, the stream then reset where the client may still send."""
        if stream.local_closed or stream.reset_done or stream._transport.is_closing():
            return
        trailers = [] if sent[0] else list(_HEADERS)
        trailers.append(("grpc-status", str(status.value)))
        if message is not None:
            trailers.append(("grpc-message", encode_grpc_message(message)))
        codec: StatusDetailsCodecBase | None = handler.status_details_codec
        if details is not None and codec is not None:
            encoded = encode_bin_value(codec.encode(status, message, details)).decode("ascii")
            trailers.append(("grpc-status-details-bin", encoded))
        try:
            await stream.send_headers(trailers, end_stream=True)
        except StreamClosedError:
            return
        if stream.closable:
            stream.reset_nowait()


async def _keep(
    connection: Connection, kept: list[tuple[list[Any], int]], response: InferResponseMessage
) -> None:
    """The answer encoded and counted, and kept for its write after the call's log line, as
    unary.py's `send_message` keeps it until the handler returns: joined when small; when
    large, its length prefix and the message's pieces (`InferResponseMessage.pieces`), a
    tensor that lies in a lane's slot (or in `bytes`) as it is, anything else copied."""
    pieces, size = response.pieces()
    pieces[0] = b"\0" + size.to_bytes(4, "big") + pieces[0]
    if size < WRITE_AS_IS:
        pieces = [b"".join(pieces)]
    else:  # a tensor a model may still change (its own buffer, say) is copied now, as before
        pieces = [piece if unchanging(piece) else bytes(piece) for piece in pieces]
    kept.append((pieces, size + 5))
    connection.messages_sent += 1
    connection.last_message_sent = time.monotonic()


async def _send(stream: LaneStream, sent: list[bool], pieces: list[Any], size: int) -> None:
    """The answer: headers, message and trailers in one write, or in pieces past the stream's
    window or the peer's frame size (as unary.py writes it)."""
    connection = stream.connection
    if not connection.write_ready.is_set():
        await connection.write_ready.wait()
    stream.check_open()
    if stream.fits(size):
        sent[0] = True
        stream.send_answer(_HEADERS, pieces, _OK_TRAILERS, size)
        return
    stream.send_answer(_HEADERS, None, None)
    sent[0] = True
    await stream.send_data(b"".join(pieces))  # in pieces, as the window allows
    await stream.send_headers(_OK_TRAILERS, end_stream=True)


__all__ = ["MODEL_INFER", "DirectInfer"]
