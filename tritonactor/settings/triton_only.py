"""tritonserver 2.51's options that tritonactor accepts and ignores, so that a Triton command
line starts unchanged. A value is still checked for its kind (`--http-thread-count=abc` is an
error, as in Triton); a given one is named in a warning at startup."""

from __future__ import annotations

from typing import Annotated

from pydantic_settings import BaseSettings, SettingsConfigDict

from tritonactor.settings.kinds import BOOL, FLOAT, INT, STRING, at_least, choice
from tritonactor.settings.options import ignored
from tritonactor.settings.pairs import (
    DEVICE_BYTES,
    DEVICE_FRACTION,
    HOST_POLICY,
    PORT_RANGE,
    RATE_LIMIT_RESOURCE,
)

_HTTP2 = "grpclib's HTTP/2 connection defaults apply"
_NO_SAGEMAKER = "there is no SageMaker endpoint"
_NO_VERTEX = "there is no Vertex AI endpoint"
_NO_RATE_LIMITER = "there is no rate limiter: an instance takes a request as soon as it is free"


class TritonOnlySettings(BaseSettings):
    """The fields of `Settings` for tritonserver options with no meaning here (None: not given)."""

    # Field names such as model_repositories are ours to use, whatever pydantic reserves.
    model_config = SettingsConfigDict(protected_namespaces=())

    id: Annotated[
        str | None, ignored(STRING, "server metadata always names the server `triton`")
    ] = None
    model_config_name: Annotated[
        str | None, ignored(STRING, "a model's configuration is its `config.pbtxt`")
    ] = None
    model_load_thread_count: Annotated[
        int | None, ignored(INT, "models load concurrently, each in its own actor")
    ] = None
    model_load_retry_count: Annotated[int | None, ignored(INT, "a failed load is not retried")] = (
        None
    )
    model_namespacing: Annotated[
        bool | None, ignored(BOOL, "a model's name is unique across the repositories")
    ] = None
    enable_peer_access: Annotated[
        bool | None, ignored(BOOL, "the server sets up no CUDA peer access")
    ] = None

    allow_http: Annotated[
        bool | None, ignored(BOOL, "HTTP is always served (the server is hypercorn's app)")
    ] = None
    reuse_http_port: Annotated[
        bool | None,
        ignored(
            BOOL,
            "the HTTP port is bound once and shared by this server's front ends only "
            "([operations.md](operations.md#ports))",
        ),
    ] = None
    http_thread_count: Annotated[
        int | None,
        ignored(INT, "HTTP is served by an event loop; `--workers N` runs N front-end processes"),
    ] = None

    reuse_grpc_port: Annotated[
        bool | None,
        ignored(
            BOOL,
            "the gRPC port is bound once and shared by this server's front ends only "
            "([operations.md](operations.md#ports))",
        ),
    ] = None
    grpc_infer_allocation_pool_size: Annotated[
        int | None, ignored(INT, "no pool of request objects is kept")
    ] = None
    grpc_infer_response_compression_level: Annotated[
        str | None,
        ignored(choice("none", "low", "medium", "high"), "responses are not compressed"),
    ] = None
    grpc_keepalive_time: Annotated[int | None, ignored(INT, _HTTP2)] = None
    grpc_keepalive_timeout: Annotated[int | None, ignored(INT, _HTTP2)] = None
    grpc_keepalive_permit_without_calls: Annotated[bool | None, ignored(BOOL, _HTTP2)] = None
    grpc_http2_max_pings_without_data: Annotated[int | None, ignored(INT, _HTTP2)] = None
    grpc_http2_min_recv_ping_interval_without_data: Annotated[int | None, ignored(INT, _HTTP2)] = (
        None
    )
    grpc_http2_max_ping_strikes: Annotated[int | None, ignored(INT, _HTTP2)] = None
    grpc_max_connection_age: Annotated[int | None, ignored(INT, _HTTP2)] = None
    grpc_max_connection_age_grace: Annotated[int | None, ignored(INT, _HTTP2)] = None

    allow_sagemaker: Annotated[bool | None, ignored(BOOL, _NO_SAGEMAKER)] = None
    sagemaker_port: Annotated[int | None, ignored(INT, _NO_SAGEMAKER)] = None
    sagemaker_safe_port_range: Annotated[str | None, ignored(PORT_RANGE, _NO_SAGEMAKER)] = None
    sagemaker_thread_count: Annotated[int | None, ignored(INT, _NO_SAGEMAKER)] = None
    allow_vertex_ai: Annotated[bool | None, ignored(BOOL, _NO_VERTEX)] = None
    vertex_ai_port: Annotated[int | None, ignored(INT, _NO_VERTEX)] = None
    vertex_ai_thread_count: Annotated[int | None, ignored(INT, _NO_VERTEX)] = None
    vertex_ai_default_model: Annotated[str | None, ignored(STRING, _NO_VERTEX)] = None

    metrics_interval_ms: Annotated[
        float | None, ignored(FLOAT, "metrics are read when scraped, not on an interval")
    ] = None
    trace_file: Annotated[
        str | None,
        ignored(STRING, "traces are exported through OpenTelemetry (`OTEL_*`), not to files"),
    ] = None

    backend_directory: Annotated[
        str | None,
        ignored(
            STRING,
            "backends are Python packages, found through `tritonactor.backends` entry points",
        ),
    ] = None
    repoagent_directory: Annotated[
        str | None, ignored(STRING, "there are no repository agents")
    ] = None
    cache_directory: Annotated[
        str | None, ignored(STRING, "caches are not shared libraries here")
    ] = None
    rate_limit: Annotated[
        str | None, ignored(choice("execution_count", "off"), _NO_RATE_LIMITER)
    ] = None
    rate_limit_resource: Annotated[
        tuple[str, ...], ignored(RATE_LIMIT_RESOURCE, _NO_RATE_LIMITER)
    ] = ()

    pinned_memory_pool_byte_size: Annotated[
        int | None, ignored(at_least(0, "BYTES"), "there is no pinned memory pool")
    ] = None
    cuda_memory_pool_byte_size: Annotated[
        tuple[str, ...], ignored(DEVICE_BYTES, "there is no CUDA memory pool")
    ] = ()
    cuda_virtual_address_size: Annotated[
        tuple[str, ...], ignored(DEVICE_BYTES, "implicit state does not grow in CUDA memory")
    ] = ()
    min_supported_compute_capability: Annotated[
        float | None, ignored(FLOAT, "every GPU the backends can use is used")
    ] = None
    buffer_manager_thread_count: Annotated[
        int | None, ignored(INT, "tensors are copied by the thread that needs them")
    ] = None
    host_policy: Annotated[tuple[str, ...], ignored(HOST_POLICY, "there are no host policies")] = ()
    model_load_gpu_limit: Annotated[
        tuple[str, ...],
        ignored(DEVICE_FRACTION, "GPU memory is not checked before a load (see --memory-budget)"),
    ] = ()
