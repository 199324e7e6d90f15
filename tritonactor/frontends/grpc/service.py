"""Triton's `inference.GRPCInferenceService` on grpclib (the health service: health.py): its
inference calls, ModelInfer and ModelStreamInfer, here; every other call (health, metadata,
statistics, the repository, shared memory, trace and log settings) in extensions.py, mixed in.

Like the HTTP front end, it only translates: requests go through the same router and the same
validation, and a TritonError becomes the gRPC status Triton uses for its code (status.py).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Mapping
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any, cast

import anyio
import grpclib
import grpclib.const
import grpclib.server

from tritonactor._proto import inference as pb
from tritonactor.actors.loop import on_loop
from tritonactor.actors.mailbox import Mailbox
from tritonactor.core.errors import TritonError, cancelled, internal, unavailable
from tritonactor.core.types import InferenceRequest, ResponseSender
from tritonactor.frontends.classification import encode_off_loop
from tritonactor.frontends.drain import SHUTTING_DOWN, Drain
from tritonactor.frontends.grpc.codec import (
    decode_infer_request,
    encode_infer_response,
)
from tritonactor.frontends.grpc.direct import MODEL_INFER, DirectInfer
from tritonactor.frontends.grpc.extensions import ExtensionCalls
from tritonactor.frontends.grpc.guard import guard
from tritonactor.frontends.grpc.limits import bounded
from tritonactor.frontends.grpc.status import translate_errors
from tritonactor.frontends.grpc.stream import (
    GRPC_ERROR_MODE,
    STREAM_WINDOW,
    Answer,
    Pending,
    decoupled_answer,
    decoupled_done,
    metadata_flag,
    refusal,
    streamed_answer,
    text_metadata,
    write_answers,
)
from tritonactor.frontends.grpc.unary import unary_answers
from tritonactor.frontends.grpc.wire import (
    InferRequestMessage,
    InferResponseMessage,
    StreamInferResponse,
)
from tritonactor.frontends.headers import HeaderForwarder
from tritonactor.frontends.restrictions import GRPC_HEADER_PREFIX, Restrictions
from tritonactor.memory import lease as shared_memory
from tritonactor.memory.lease import Lease
from tritonactor.observability.logging import request_logger
from tritonactor.observability.tracing import RequestTrace

if TYPE_CHECKING:
    from tritonactor.server import Server

log = logging.getLogger(__name__)

STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"


class InferenceService(ExtensionCalls, pb.GrpcInferenceServiceBase):
    def __init__(self, server: Server, drain: Drain | None = None) -> None:
        self._server = server
        self._drain = drain
        self._router = server.router
        self._headers = HeaderForwarder(server.settings.grpc_header_forward_pattern)

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        mapping = super().__mapping__()
        # Our own handler: it reads the call's metadata (a client's traceparent).
        mapping[MODEL_INFER] = grpclib.const.Handler(
            self._model_infer,
            grpclib.const.Cardinality.UNARY_UNARY,
            InferRequestMessage,  # parsed and serialized by protobuf's C runtime (upb)
            InferResponseMessage,
        )
        # Streaming is served by our own handler on the raw grpclib stream: it reads requests
        # and writes responses as they complete, without an async generator in between.
        mapping[STREAM_INFER] = grpclib.const.Handler(
            self._model_stream_infer,
            grpclib.const.Cardinality.STREAM_STREAM,
            InferRequestMessage,
            StreamInferResponse,
        )
        settings = self._server.settings
        return unary_answers(
            bounded(
                guard(mapping, settings.grpc_restricted_protocol), settings.grpc_max_message_size
            )
        )

    def direct_infer(self) -> DirectInfer:
        """ModelInfer calls answered by a connection's lane, as `__mapping__`'s handler and its
        wrappers answer them (direct.py)."""
        settings = self._server.settings
        return DirectInfer(
            self.infer_call,
            settings.grpc_max_message_size,
            Restrictions(settings.grpc_restricted_protocol, GRPC_HEADER_PREFIX),
            self._drain,
            self._headers.enabled,
        )

    async def _model_infer(
        self, stream: grpclib.server.Stream[InferRequestMessage, InferResponseMessage]
    ) -> None:
        message = await stream.recv_message()
        assert message is not None
        metadata = stream.metadata
        await self.infer_call(message, metadata, metadata, stream.send_message)

    async def infer_call(
        self,
        message: InferRequestMessage,
        carrier: Mapping[str, Any] | None,
        metadata: Any,
        send: Callable[[InferResponseMessage], Awaitable[None]],
    ) -> None:
        """A ModelInfer call answered (`send`), logged and traced: `carrier` holds the client's
        `traceparent` (its metadata, or its headers), `metadata` is the call's metadata where a
        header is forwarded from it (None otherwise)."""
        with request_logger("GRPC", "ModelInfer", message.model_name) as entry:
            tracing = self._server.tracing
            trace = None
            if tracing is not None:
                trace = tracing.start_request(
                    message.model_name, message.model_version, carrier, "GRPC"
                )
            if trace is None:
                response = await self.model_infer(message, metadata=metadata)
            else:
                entry.trace = trace
                try:
                    response = await self.model_infer(message, trace, metadata)
                except BaseException as error:
                    trace.end(error)
                    raise
                trace.end()
            await send(response)

    @translate_errors
    async def model_infer(
        self,
        message: InferRequestMessage,
        trace: RequestTrace | None = None,
        metadata: Any = None,
    ) -> InferResponseMessage:
        # The shared-memory regions the request reads and writes: held until it is answered.
        lease = Lease(self._server.shared_memory)
        try:
            request = self._decode(message, lease)
            if metadata is not None and self._headers.enabled:
                self._headers.forward(request, text_metadata(metadata))
            if trace is not None:
                request.trace = trace
                trace.describe(request)
            if self._router.loader is not None:
                await self._router.ensure_loaded(request.model_name)
            handle = self._router.resolve(request.model_name, request.model_version)
            if handle.decoupled:
                raise grpclib.GRPCError(
                    grpclib.const.Status.UNIMPLEMENTED,
                    "ModelInfer RPC doesn't support models with decoupled transaction policy",
                )
            response = await shared_memory.answer_holding(
                lease, request, self._router.infer(request)
            )
            written = await lease.write_off_loop(response)
            return await encode_off_loop(  # a large ranking: off the loop
                response,
                request,
                lambda: encode_infer_response(response, in_shared_memory=written, request=request),
            )
        finally:
            lease.release()

    def _decode(self, message: InferRequestMessage, lease: Lease) -> InferenceRequest:
        return decode_infer_request(
            message, shared_memory=lease.read, shared_memory_outputs=lease.reserve
        )

    async def _model_stream_infer(
        self, stream: grpclib.server.Stream[InferRequestMessage, StreamInferResponse]
    ) -> None:
        answers: Mailbox[Answer] = Mailbox.for_stream()
        pending = Pending(answers, STREAM_WINDOW)
        error_ends_stream = metadata_flag(stream.metadata, GRPC_ERROR_MODE)
        draining = self._drain.stream(pending) if self._drain is not None else nullcontext()
        # A message that does not parse (or is past the size limit) ends the stream with its
        # status once the requests before it are answered.
        unreadable: grpclib.GRPCError | None = None
        try:
            with draining:
                async with anyio.create_task_group() as group:
                    reading = group.cancel_scope
                    group.start_soon(
                        write_answers, stream, answers, error_ends_stream, pending, reading
                    )
                    messages = aiter(stream)
                    while True:
                        try:
                            message = await anext(messages)
                        except StopAsyncIteration:
                            break
                        except grpclib.GRPCError as error:
                            unreadable = error
                            break
                        ticket = await pending.start()
                        if pending.draining:  # shutting down: the stream takes no new requests
                            shutting = refusal(message.id, unavailable(SHUTTING_DOWN))
                            pending.deliver(shutting, True, ticket=ticket)
                        elif self._router.loader is None or await self._load_lazily(
                            message, pending, ticket
                        ):
                            await self._submit_streamed(message, pending, ticket, stream.metadata)
                    pending.input_done()
        except BaseExceptionGroup as failed:
            # The writer ended the stream with a status ("triton_grpc_error" mode), or a message
            # did not parse: grpclib answers a GRPCError, not the task group's exception group.
            # A group holding anything else stays whole. Not `except*`: CPython before 3.11.4
            # wraps an exception raised inside one in a new group (gh-103590), answered UNKNOWN.
            statuses, rest = failed.split(grpclib.GRPCError)
            if statuses is None or rest is not None:
                raise
            raise _first_status(statuses) from None
        finally:
            # The stream is over: requests still in the server answer nobody any more.
            pending.cancel_all()
        if unreadable is not None:
            raise unreadable
        if pending.ended_by_drain:
            # Every request it had admitted is answered; the client learns why the stream ends.
            raise grpclib.GRPCError(grpclib.const.Status.UNAVAILABLE, SHUTTING_DOWN)

    async def _load_lazily(
        self, message: InferRequestMessage, pending: Pending, ticket: int
    ) -> bool:
        try:
            await self._router.ensure_loaded(message.model_name)
        except TritonError as error:
            pending.deliver(refusal(message.id, error), finished=True, ticket=ticket)
            return False
        return True

    async def _submit_streamed(
        self, message: InferRequestMessage, pending: Pending, ticket: int, metadata: Any = None
    ) -> None:
        """Submit the stream's request of place `ticket` (`Pending`)."""
        tracing = self._server.tracing
        trace = None
        if tracing is not None:
            trace = tracing.start_request(
                message.model_name, message.model_version, metadata, "GRPC"
            )
        lease = Lease(self._server.shared_memory)
        try:
            request = self._decode(message, lease)
            # Released once the request's last answer is written (stream.py).
            shared_memory.attach(request, lease)
            if metadata is not None and self._headers.enabled:
                self._headers.forward(request, text_metadata(metadata))
            if trace is not None:
                request.trace = trace
                trace.describe(request)
            await self._router.prepare(request)  # a large request's cache key: off the loop
            if self._router.resolve(request.model_name, request.model_version).decoupled:
                request.sender = ResponseSender(
                    on_loop(functools.partial(decoupled_answer, request, pending))
                )
                reply = self._router.submit(request)
                pending.requests[id(request)] = request
                pending.skip(ticket)  # its responses go out as they come
                reply.add_done_callback(functools.partial(decoupled_done, request, pending))
                return
            reply = self._router.submit(request)
            pending.requests[id(request)] = request
        except TritonError as error:
            lease.release()
            if trace is not None:
                trace.end(error)
            pending.deliver(refusal(message.id, error), finished=True, ticket=ticket)
            return
        except Exception as error:  # as in ModelInfer: INTERNAL, and the stream stays open
            lease.release()
            if trace is not None:
                trace.end(error)
            log.exception("streamed request for model '%s' failed", message.model_name)
            text = f"internal error: {type(error).__name__}: {error}"
            pending.deliver(refusal(message.id, internal(text)), finished=True, ticket=ticket)
            return
        except BaseException:  # the stream ended while its key was worked out
            lease.release()
            if trace is not None:
                trace.end(cancelled("the stream ended before the request was submitted"))
            raise
        reply.add_done_callback(functools.partial(streamed_answer, request, pending, ticket))


def _first_status(statuses: BaseExceptionGroup[grpclib.GRPCError]) -> grpclib.GRPCError:
    """The first status in a group split out of a task group's (groups may nest)."""
    error: BaseException = statuses
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return cast(grpclib.GRPCError, error)
