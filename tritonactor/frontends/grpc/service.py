"""Triton's `inference.GRPCInferenceService` and `grpc.health.v1.Health` on grpclib.

Like the HTTP front end, it only translates: requests go through the same router and the same
validation, and a TritonError becomes the gRPC status Triton uses for its code.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import threading
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import grpclib
import grpclib.const
import grpclib.server
from anyio.streams.memory import MemoryObjectSendStream

from tritonactor._proto import inference as pb
from tritonactor._proto.grpc.health import v1 as health
from tritonactor.actors import ActorStopped, Reply
from tritonactor.control.overrides import parse_load_parameters, parse_unload_parameters
from tritonactor.core.errors import ErrorCode, TritonError, internal, unavailable
from tritonactor.core.types import InferenceRequest, InferenceResponse, ResponseSender
from tritonactor.frontends.grpc.codec import (
    decode_infer_request,
    encode_infer_response,
    encode_parameters,
)
from tritonactor.observability import logging as log_settings
from tritonactor.observability.logging import request_logger
from tritonactor.observability.trace_settings import from_grpc
from tritonactor.observability.tracing import RequestTrace
from tritonactor.scheduling import statistics
from tritonactor.scheduling.router import ModelHandle
from tritonactor.settings import ControlMode

if TYPE_CHECKING:
    from tritonactor.server import Server

log = logging.getLogger(__name__)

STATUS = {
    ErrorCode.INVALID_ARG: grpclib.const.Status.INVALID_ARGUMENT,
    ErrorCode.NOT_FOUND: grpclib.const.Status.NOT_FOUND,
    ErrorCode.ALREADY_EXISTS: grpclib.const.Status.ALREADY_EXISTS,
    ErrorCode.INTERNAL: grpclib.const.Status.INTERNAL,
    ErrorCode.UNSUPPORTED: grpclib.const.Status.UNIMPLEMENTED,
    ErrorCode.UNAVAILABLE: grpclib.const.Status.UNAVAILABLE,
    ErrorCode.CANCELLED: grpclib.const.Status.CANCELLED,
}

MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"
# Requests one stream may have in the server at once (see _Pending).
STREAM_WINDOW = 128
FINAL_RESPONSE = "triton_final_response"
ENABLE_EMPTY_FINAL = "triton_enable_empty_final_response"

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


def grpc_error(error: TritonError) -> grpclib.GRPCError:
    return grpclib.GRPCError(STATUS[error.code], error.message)


def translate_errors(method: F) -> F:
    """TritonError -> the matching gRPC status; anything else -> INTERNAL, logged."""

    @functools.wraps(method)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return await method(*args, **kwargs)
        except TritonError as error:
            raise grpc_error(error) from None
        except grpclib.GRPCError:
            raise
        except Exception as error:
            log.exception("gRPC %s failed", method.__name__)
            raise grpclib.GRPCError(
                grpclib.const.Status.INTERNAL, f"internal error: {type(error).__name__}: {error}"
            ) from None

    return wrapper  # type: ignore[return-value]


def not_available(what: str) -> grpclib.GRPCError:
    return grpclib.GRPCError(
        grpclib.const.Status.UNIMPLEMENTED,
        f"{what} is not available in this version of tritonactor",
    )


class InferenceService(pb.GrpcInferenceServiceBase):
    def __init__(self, server: Server) -> None:
        self._server = server
        self._router = server.router

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        mapping = super().__mapping__()
        # Our own handler: it reads the call's metadata (a client's traceparent).
        mapping[MODEL_INFER] = grpclib.const.Handler(
            self._model_infer,
            grpclib.const.Cardinality.UNARY_UNARY,
            pb.ModelInferRequest,
            pb.ModelInferResponse,
        )
        # Streaming is served by our own handler on the raw grpclib stream: it reads requests
        # and writes responses as they complete, without an async generator in between.
        mapping[STREAM_INFER] = grpclib.const.Handler(
            self._model_stream_infer,
            grpclib.const.Cardinality.STREAM_STREAM,
            pb.ModelInferRequest,
            pb.ModelStreamInferResponse,
        )
        return mapping

    @translate_errors
    async def server_live(self, message: pb.ServerLiveRequest) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self._server.live)

    @translate_errors
    async def server_ready(self, message: pb.ServerReadyRequest) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=await self._server.ready())

    @translate_errors
    async def model_ready(self, message: pb.ModelReadyRequest) -> pb.ModelReadyResponse:
        try:
            self._router.resolve(message.name, message.version)
        except TritonError as error:
            if error.code is ErrorCode.INVALID_ARG:
                raise
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=True)

    @translate_errors
    async def server_metadata(self, message: pb.ServerMetadataRequest) -> pb.ServerMetadataResponse:
        server = self._server
        return pb.ServerMetadataResponse(
            name=server.name, version=server.version, extensions=list(server.extensions)
        )

    @translate_errors
    async def model_metadata(self, message: pb.ModelMetadataRequest) -> pb.ModelMetadataResponse:
        handle = self._router.resolve(message.name, message.version)
        signature = handle.signature
        batch = signature.max_batch_size

        def tensors(specs: Any) -> list[pb.ModelMetadataResponseTensorMetadata]:
            return [
                pb.ModelMetadataResponseTensorMetadata(
                    name=spec.name, datatype=spec.datatype, shape=spec.shape(batch)
                )
                for spec in specs
            ]

        return pb.ModelMetadataResponse(
            name=handle.name,
            versions=[str(v) for v in self._router.ready_versions(handle.name)],
            platform=handle.config.platform or handle.config.backend,
            inputs=tensors(signature.inputs),
            outputs=tensors(signature.outputs),
        )

    @translate_errors
    async def model_config(self, message: pb.ModelConfigRequest) -> pb.ModelConfigResponse:
        handle = self._router.resolve(message.name, message.version)
        return pb.ModelConfigResponse(config=handle.config)

    async def _model_infer(
        self, stream: grpclib.server.Stream[pb.ModelInferRequest, pb.ModelInferResponse]
    ) -> None:
        message = await stream.recv_message()
        assert message is not None
        with request_logger("GRPC", "ModelInfer", message.model_name) as entry:
            tracing = self._server.tracing
            trace = None
            if tracing is not None:
                trace = tracing.start_request(
                    message.model_name, message.model_version, stream.metadata, "GRPC"
                )
            if trace is None:
                response = await self.model_infer(message)
            else:
                entry.span_context = trace.span_context
                try:
                    response = await self.model_infer(message, trace)
                except BaseException as error:
                    trace.end(error)
                    raise
                trace.end()
            await stream.send_message(response)

    @translate_errors
    async def model_infer(
        self, message: pb.ModelInferRequest, trace: RequestTrace | None = None
    ) -> pb.ModelInferResponse:
        request = decode_infer_request(message)
        if trace is not None:
            request.trace = trace
            trace.describe(request)
        if self._router.loader is not None:
            await self._router.ensure_loaded(request.model_name)
        handle = self._router.resolve(request.model_name, request.model_version)
        if handle.decoupled:
            raise grpclib.GRPCError(
                grpclib.const.Status.UNIMPLEMENTED,
                f"ModelInfer RPC doesn't support models with decoupled transaction policy; "
                f"use ModelStreamInfer for model '{handle.name}'",
            )
        return encode_infer_response(await self._router.infer(request))

    async def _model_stream_infer(
        self, stream: grpclib.server.Stream[pb.ModelInferRequest, pb.ModelStreamInferResponse]
    ) -> None:
        send, receive = anyio.create_memory_object_stream[pb.ModelStreamInferResponse](math.inf)
        pending = _Pending(send, STREAM_WINDOW)

        async def write() -> None:
            async with receive:
                async for response in receive:
                    await stream.send_message(response)

        try:
            async with anyio.create_task_group() as group:
                group.start_soon(write)
                async for message in stream:
                    await pending.start()
                    if self._router.loader is None or await self._load_lazily(message, pending):
                        self._submit_streamed(message, pending, stream.metadata)
                pending.input_done()
        finally:
            # The stream is over: requests still in the server answer nobody any more.
            pending.cancel_all()

    async def _load_lazily(self, message: pb.ModelInferRequest, pending: _Pending) -> bool:
        try:
            await self._router.ensure_loaded(message.model_name)
        except TritonError as error:
            pending.deliver(_stream_error(message.id, error.message), finished=True)
            return False
        return True

    def _submit_streamed(
        self, message: pb.ModelInferRequest, pending: _Pending, metadata: Any = None
    ) -> None:
        tracing = self._server.tracing
        trace = None
        if tracing is not None:
            trace = tracing.start_request(
                message.model_name, message.model_version, metadata, "GRPC"
            )
        try:
            request = decode_infer_request(message)
            if trace is not None:
                request.trace = trace
                trace.describe(request)
            if self._router.resolve(request.model_name, request.model_version).decoupled:
                request.sender = ResponseSender(
                    _on_this_loop(functools.partial(_decoupled_answer, request, pending))
                )
                reply = self._router.submit(request)
                pending.requests[id(request)] = request
                reply.add_done_callback(functools.partial(_decoupled_done, request, pending))
                return
            reply = self._router.submit(request)
            pending.requests[id(request)] = request
        except TritonError as error:
            if trace is not None:
                trace.end(error)
            pending.deliver(_stream_error(message.id, error.message), finished=True)
            return
        except Exception as error:  # as in ModelInfer: INTERNAL, and the stream stays open
            if trace is not None:
                trace.end(error)
            log.exception("streamed request for model '%s' failed", message.model_name)
            text = f"internal error: {type(error).__name__}: {error}"
            pending.deliver(_stream_error(message.id, text), finished=True)
            return
        reply.add_done_callback(functools.partial(_streamed_answer, request, pending))

    @translate_errors
    async def model_statistics(
        self, message: pb.ModelStatisticsRequest
    ) -> pb.ModelStatisticsResponse:
        handles = statistics.select(self._router, message.name, message.version)
        return pb.ModelStatisticsResponse(model_stats=[_model_statistics(h) for h in handles])

    @translate_errors
    async def repository_index(
        self, message: pb.RepositoryIndexRequest
    ) -> pb.RepositoryIndexResponse:
        entries = await self._server.index(ready_only=message.ready)
        return pb.RepositoryIndexResponse(
            models=[
                pb.RepositoryIndexResponseModelIndex(
                    name=e.name, version=e.version, state=e.state, reason=e.reason
                )
                for e in entries
            ]
        )

    @translate_errors
    async def repository_model_load(
        self, message: pb.RepositoryModelLoadRequest
    ) -> pb.RepositoryModelLoadResponse:
        self._check_explicit()
        name = message.model_name
        options = parse_load_parameters(message.parameters, name, base64_files=False)
        await self._server.load(name, options)
        return pb.RepositoryModelLoadResponse()

    @translate_errors
    async def repository_model_unload(
        self, message: pb.RepositoryModelUnloadRequest
    ) -> pb.RepositoryModelUnloadResponse:
        self._check_explicit()
        name = message.model_name
        options = parse_unload_parameters(message.parameters, model=name)
        await self._server.unload(name, options)
        return pb.RepositoryModelUnloadResponse()

    def _check_explicit(self) -> None:
        if self._server.settings.model_control_mode is not ControlMode.EXPLICIT:
            raise grpc_error(
                unavailable("explicit model load / unload is not allowed if polling is enabled")
            )

    async def system_shared_memory_status(self, message: Any) -> Any:
        raise not_available("system shared memory")

    async def system_shared_memory_register(self, message: Any) -> Any:
        raise not_available("system shared memory")

    async def system_shared_memory_unregister(self, message: Any) -> Any:
        raise not_available("system shared memory")

    async def cuda_shared_memory_status(self, message: Any) -> Any:
        raise not_available("CUDA shared memory")

    async def cuda_shared_memory_register(self, message: Any) -> Any:
        raise not_available("CUDA shared memory")

    async def cuda_shared_memory_unregister(self, message: Any) -> Any:
        raise not_available("CUDA shared memory")

    @translate_errors
    async def trace_setting(self, message: pb.TraceSettingRequest) -> pb.TraceSettingResponse:
        # As in Triton, the RPC always answers with the settings in force, after any change.
        changes = from_grpc({name: value.value for name, value in message.settings.items()})
        settings = self._server.trace_setting(message.model_name, changes)
        return pb.TraceSettingResponse(
            settings={
                name: pb.TraceSettingResponseSettingValue(
                    value=value if isinstance(value, list) else [value]
                )
                for name, value in settings.items()
            }
        )

    @translate_errors
    async def log_settings(self, message: pb.LogSettingsRequest) -> pb.LogSettingsResponse:
        return log_settings.settings_to_grpc(
            log_settings.update(log_settings.settings_from_grpc(message))
        )


class _Pending:
    """A stream's requests in the server. At most `window` run at once: beyond that the stream
    stops reading, and HTTP/2 flow control slows the client down, rather than the requests
    overflowing the scheduler's mailbox. Closes the response stream after the last answer once
    the client has finished sending."""

    def __init__(self, send: MemoryObjectSendStream[pb.ModelStreamInferResponse], window: int):
        self._send = send
        self._slots = anyio.Semaphore(window)
        self._running = 0
        self._input_done = False
        # The stream's requests submitted and not yet finished, by id().
        self.requests: dict[int, InferenceRequest] = {}

    async def start(self) -> None:
        """Wait for room for one more request; it then counts as running until its answer is
        delivered with `finished=True`."""
        try:
            self._slots.acquire_nowait()  # the common case skips the checkpoint acquire makes
        except anyio.WouldBlock:
            await self._slots.acquire()
        self._running += 1

    def deliver(
        self,
        response: pb.ModelStreamInferResponse | None,
        finished: bool = False,
        request: InferenceRequest | None = None,
    ) -> None:
        """Send `response` (None: nothing to send); `finished` ends its request."""
        if finished and request is not None:
            self.requests.pop(id(request), None)
        # Called from the actor that answered: it must never raise there.
        # A closed stream means the client went away: nobody is left to read the answer.
        if response is not None:
            with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                self._send.send_nowait(response)
        if finished:
            self._running -= 1
            self._slots.release()
            self._maybe_close()

    def cancel_all(self) -> None:
        for request in list(self.requests.values()):
            request.cancel()
        self.requests.clear()

    def input_done(self) -> None:
        self._input_done = True
        self._maybe_close()

    def _maybe_close(self) -> None:
        if self._input_done and self._running == 0:
            self._send.close()


def _on_this_loop(function: Callable[..., None]) -> Callable[..., None]:
    """`function`, made callable from any thread: a backend may send a decoupled response from
    a thread of its own, and the stream's state belongs to this event loop (grpclib runs on
    asyncio)."""
    loop = asyncio.get_running_loop()
    loop_thread = threading.get_ident()

    def call(*args: Any) -> None:
        if threading.get_ident() == loop_thread:
            function(*args)
        else:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody listens
                loop.call_soon_threadsafe(function, *args)

    return call


def _decoupled_answer(
    request: InferenceRequest,
    pending: _Pending,
    response: InferenceResponse | None,
    error: TritonError | None,
    final: bool,
) -> None:
    """A decoupled model's `sender.send`: each response as it comes, then the final flag (an
    empty final response only when the client asked for one)."""
    flagged = request.parameters.get(ENABLE_EMPTY_FINAL) is True
    answer: pb.ModelStreamInferResponse | None = None
    failure: BaseException | None = error
    try:
        if error is not None:
            answer = _stream_error(request.id, error.message)
        elif response is not None:
            if flagged:
                response.parameters[FINAL_RESPONSE] = final
            answer = pb.ModelStreamInferResponse(infer_response=encode_infer_response(response))
        elif final and flagged:
            answer = pb.ModelStreamInferResponse(
                infer_response=pb.ModelInferResponse(
                    model_name=request.model_name,
                    id=request.id,
                    parameters=encode_parameters({FINAL_RESPONSE: True}),
                )
            )
    except Exception as encoding:
        log.exception("a response of model '%s' could not be encoded", request.model_name)
        answer = _stream_error(request.id, f"internal error: {type(encoding).__name__}: {encoding}")
        failure = encoding
    if final and request.trace is not None:
        request.trace.end(failure)
    pending.deliver(answer, finished=final, request=request)


def _decoupled_done(
    request: InferenceRequest, pending: _Pending, reply: Reply[InferenceResponse]
) -> None:
    """Execute is over. If it failed before the model sent its final response, that failure
    is the request's last answer."""
    sender = request.sender
    if sender is None or sender.finished:
        return
    try:
        reply.result()
    except TritonError as error:
        sender.send(error=error, final=True)
    except Exception as error:
        sender.send(error=internal(f"{type(error).__name__}: {error}"), final=True)


def _stream_error(request_id: str, message: str) -> pb.ModelStreamInferResponse:
    # As Triton does, the id rides along so that the client can tell which request failed.
    return pb.ModelStreamInferResponse(
        error_message=message, infer_response=pb.ModelInferResponse(id=request_id)
    )


def _streamed_answer(
    request: InferenceRequest, pending: _Pending, reply: Reply[InferenceResponse]
) -> None:
    """Runs as a done callback inside the actor that answered: whatever happens here becomes
    an answer on the stream, never an exception in that actor."""
    failure: BaseException | None = None
    try:
        response = reply.result()
        if request.parameters.get(ENABLE_EMPTY_FINAL) is True:
            response.parameters[FINAL_RESPONSE] = True
        answer = pb.ModelStreamInferResponse(infer_response=encode_infer_response(response))
    except TritonError as error:
        failure = error
        answer = _stream_error(request.id, error.message)
    except ActorStopped as error:
        failure = error
        message = f"model '{request.model_name}' stopped before answering"
        answer = _stream_error(request.id, message)
    except Exception as error:
        failure = error
        log.exception("streamed request for model '%s' failed", request.model_name)
        answer = _stream_error(request.id, f"internal error: {type(error).__name__}: {error}")
    if request.trace is not None:
        request.trace.end(failure)
    pending.deliver(answer, finished=True, request=request)


def _model_statistics(handle: ModelHandle) -> pb.ModelStatistics:
    stats = handle.statistics

    def duration(d: statistics.Duration) -> pb.StatisticDuration:
        return pb.StatisticDuration(count=d.count, ns=d.ns)

    return pb.ModelStatistics(
        name=handle.name,
        version=str(handle.version),
        last_inference=stats.last_inference_ms,
        inference_count=stats.inference_count,
        execution_count=stats.execution_count,
        inference_stats=pb.InferStatistics(
            **{k: duration(d) for k, d in stats.inference_stats().items()}
        ),
        batch_stats=[
            pb.InferBatchStatistics(
                batch_size=batch.batch_size,
                compute_input=duration(batch.compute_input),
                compute_infer=duration(batch.compute_infer),
                compute_output=duration(batch.compute_output),
            )
            for batch in stats.batch_stats
        ],
    )


class HealthService(health.HealthBase):
    """SERVING when the server is ready (every model that should load is loaded)."""

    def __init__(self, server: Server) -> None:
        self._server = server

    async def check(self, message: health.HealthCheckRequest) -> health.HealthCheckResponse:
        ready = await self._server.ready()
        status = (
            health.HealthCheckResponseServingStatus.SERVING
            if ready
            else health.HealthCheckResponseServingStatus.NOT_SERVING
        )
        return health.HealthCheckResponse(status=status)
