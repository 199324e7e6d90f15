"""Triton's `inference.GRPCInferenceService` on grpclib (the health service: health.py).

Like the HTTP front end, it only translates: requests go through the same router and the same
validation, and a TritonError becomes the gRPC status Triton uses for its code.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import grpclib
import grpclib.const
import grpclib.server

from tritonactor._proto import inference as pb
from tritonactor.actors.loop import on_loop
from tritonactor.control.load_parameters import parse_load_parameters, parse_unload_parameters
from tritonactor.core.errors import ErrorCode, TritonError, cancelled, internal, unavailable
from tritonactor.core.types import InferenceRequest, ResponseSender
from tritonactor.frontends.classification import encode_off_loop
from tritonactor.frontends.drain import SHUTTING_DOWN, Drain
from tritonactor.frontends.grpc.codec import (
    decode_infer_request,
    encode_infer_response,
)
from tritonactor.frontends.grpc.direct import MODEL_INFER, DirectInfer
from tritonactor.frontends.grpc.guard import guard
from tritonactor.frontends.grpc.limits import bounded
from tritonactor.frontends.grpc.status import grpc_error
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
from tritonactor.memory.region import Kind
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

STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"
F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


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


class InferenceService(pb.GrpcInferenceServiceBase):
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
                    f"ModelInfer RPC doesn't support models with decoupled transaction policy; "
                    f"use ModelStreamInfer for model '{handle.name}'",
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
        send, receive = anyio.create_memory_object_stream[Answer](math.inf)
        pending = Pending(send, STREAM_WINDOW)
        error_ends_stream = metadata_flag(stream.metadata, GRPC_ERROR_MODE)
        draining = self._drain.stream(pending) if self._drain is not None else nullcontext()
        try:
            with draining:
                async with anyio.create_task_group() as group:
                    reading = group.cancel_scope
                    group.start_soon(
                        write_answers, stream, receive, error_ends_stream, pending, reading
                    )
                    async for message in stream:
                        await pending.start()
                        if pending.draining:  # shutting down: the stream takes no new requests
                            pending.deliver(refusal(message.id, unavailable(SHUTTING_DOWN)), True)
                        elif self._router.loader is None or await self._load_lazily(
                            message, pending
                        ):
                            await self._submit_streamed(message, pending, stream.metadata)
                    pending.input_done()
        except* grpclib.GRPCError as ended:
            # The writer ended the stream with a status ("triton_grpc_error" mode): grpclib
            # answers a GRPCError, not the task group's exception group.
            raise ended.exceptions[0] from None
        finally:
            # The stream is over: requests still in the server answer nobody any more.
            pending.cancel_all()
        if pending.ended_by_drain:
            # Every request it had admitted is answered; the client learns why the stream ends.
            raise grpclib.GRPCError(grpclib.const.Status.UNAVAILABLE, SHUTTING_DOWN)

    async def _load_lazily(self, message: InferRequestMessage, pending: Pending) -> bool:
        try:
            await self._router.ensure_loaded(message.model_name)
        except TritonError as error:
            pending.deliver(refusal(message.id, error), finished=True)
            return False
        return True

    async def _submit_streamed(
        self, message: InferRequestMessage, pending: Pending, metadata: Any = None
    ) -> None:
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
                reply.add_done_callback(functools.partial(decoupled_done, request, pending))
                return
            reply = self._router.submit(request)
            pending.requests[id(request)] = request
        except TritonError as error:
            lease.release()
            if trace is not None:
                trace.end(error)
            pending.deliver(refusal(message.id, error), finished=True)
            return
        except Exception as error:  # as in ModelInfer: INTERNAL, and the stream stays open
            lease.release()
            if trace is not None:
                trace.end(error)
            log.exception("streamed request for model '%s' failed", message.model_name)
            text = f"internal error: {type(error).__name__}: {error}"
            pending.deliver(refusal(message.id, internal(text)), finished=True)
            return
        except BaseException:  # the stream ended while its key was worked out
            lease.release()
            if trace is not None:
                trace.end(cancelled("the stream ended before the request was submitted"))
            raise
        reply.add_done_callback(functools.partial(streamed_answer, request, pending))

    @translate_errors
    async def model_statistics(
        self, message: pb.ModelStatisticsRequest
    ) -> pb.ModelStatisticsResponse:
        handles = await self._server.statistics(message.name, message.version)
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
        options = parse_load_parameters(
            message.parameters,
            name,
            base64_files=False,
            max_depth=self._server.settings.http_max_json_depth,
        )
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

    @translate_errors
    async def system_shared_memory_status(
        self, message: pb.SystemSharedMemoryStatusRequest
    ) -> pb.SystemSharedMemoryStatusResponse:
        regions = self._server.shared_memory.status(Kind.SYSTEM, message.name)
        return pb.SystemSharedMemoryStatusResponse(
            regions={
                region.name: pb.SystemSharedMemoryStatusResponseRegionStatus(**region.status())
                for region in regions
            }
        )

    @translate_errors
    async def system_shared_memory_register(
        self, message: pb.SystemSharedMemoryRegisterRequest
    ) -> pb.SystemSharedMemoryRegisterResponse:
        await self._server.register_system_memory(
            message.name, message.key, message.offset, message.byte_size
        )
        return pb.SystemSharedMemoryRegisterResponse()

    @translate_errors
    async def system_shared_memory_unregister(
        self, message: pb.SystemSharedMemoryUnregisterRequest
    ) -> pb.SystemSharedMemoryUnregisterResponse:
        await self._server.unregister_memory(Kind.SYSTEM, message.name)
        return pb.SystemSharedMemoryUnregisterResponse()

    @translate_errors
    async def cuda_shared_memory_status(
        self, message: pb.CudaSharedMemoryStatusRequest
    ) -> pb.CudaSharedMemoryStatusResponse:
        regions = self._server.shared_memory.status(Kind.CUDA, message.name)
        return pb.CudaSharedMemoryStatusResponse(
            regions={
                region.name: pb.CudaSharedMemoryStatusResponseRegionStatus(**region.status())
                for region in regions
            }
        )

    @translate_errors
    async def cuda_shared_memory_register(
        self, message: pb.CudaSharedMemoryRegisterRequest
    ) -> pb.CudaSharedMemoryRegisterResponse:
        await self._server.register_cuda_memory(
            message.name, message.raw_handle, message.device_id, message.byte_size
        )
        return pb.CudaSharedMemoryRegisterResponse()

    @translate_errors
    async def cuda_shared_memory_unregister(
        self, message: pb.CudaSharedMemoryUnregisterRequest
    ) -> pb.CudaSharedMemoryUnregisterResponse:
        await self._server.unregister_memory(Kind.CUDA, message.name)
        return pb.CudaSharedMemoryUnregisterResponse()

    @translate_errors
    async def trace_setting(self, message: pb.TraceSettingRequest) -> pb.TraceSettingResponse:
        # As in Triton, the RPC always answers with the settings in force, after any change.
        # A map entry without a value holds the empty value (protobuf's rule), as [] does.
        changes = from_grpc(
            {
                name: value.value if value is not None else []
                for name, value in message.settings.items()
            }
        )
        settings = await self._server.trace_extension(message.model_name, changes)
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
        changes = log_settings.settings_from_grpc(message)
        return log_settings.settings_to_grpc(await self._server.log_settings(changes))


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
