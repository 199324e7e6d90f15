"""The calls of Triton's `inference.GRPCInferenceService` besides inference: health, model
metadata and config, statistics, the repository (index, load, unload), shared memory (system and
CUDA), trace and log settings. `ExtensionCalls` is mixed into `InferenceService` (service.py),
whose server and router they answer from; each only translates, as the HTTP routes do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tritonactor._proto import inference as pb
from tritonactor.control.load_parameters import parse_load_parameters, parse_unload_parameters
from tritonactor.core.errors import ErrorCode, TritonError, unavailable, unsupported
from tritonactor.core.protocol import NAMED_REPOSITORY
from tritonactor.frontends.grpc.status import grpc_error, translate_errors
from tritonactor.memory.region import Kind
from tritonactor.observability import logging as log_settings
from tritonactor.observability.trace_settings import from_grpc
from tritonactor.scheduling import statistics
from tritonactor.scheduling.router import ModelHandle, Router
from tritonactor.settings import ControlMode

if TYPE_CHECKING:
    from tritonactor.server import Server


class ExtensionCalls:
    """The service's calls besides ModelInfer and ModelStreamInfer (mixed into
    `InferenceService`, which sets the server and router they read)."""

    _server: Server
    _router: Router

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

        # A version asked for is the one listed, as Triton lists it; else every ready one.
        versions = [handle.version] if message.version else self._router.ready_versions(handle.name)
        return pb.ModelMetadataResponse(
            name=handle.name,
            versions=[str(v) for v in versions],
            platform=handle.config.platform or handle.config.backend,
            inputs=tensors(signature.inputs),
            outputs=tensors(signature.outputs),
        )

    @translate_errors
    async def model_config(self, message: pb.ModelConfigRequest) -> pb.ModelConfigResponse:
        handle = self._router.resolve(message.name, message.version)
        return pb.ModelConfigResponse(config=handle.config)

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
        _check_unnamed(message.repository_name)
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
        _check_unnamed(message.repository_name)
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
        _check_unnamed(message.repository_name)
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


def _check_unnamed(repository: str) -> None:
    """A call that names a repository: UNIMPLEMENTED, as Triton answers (its HTTP routes take
    the name in the path: http/app.py)."""
    if repository:
        raise unsupported(NAMED_REPOSITORY)
