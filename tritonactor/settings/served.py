"""The settings tritonactor honours: each field's type, default and `Option` (its kind of value,
flags, variable and help) in one place. `Settings` adds tritonserver's ignored options and the
rules; the CLI, --help and docs/configuration.md's table are read from here."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from tritonactor.settings import common
from tritonactor.settings.common import ControlMode
from tritonactor.settings.kinds import (
    BOOL,
    HOST,
    LOG_FILE,
    LOG_FORMAT,
    LOG_VERBOSE,
    MODEL_NAMES,
    PATH,
    POLL_SECONDS,
    PORT,
    REGEX,
    REPOSITORIES,
    SIZE,
    at_least,
    enum,
    in_range,
)
from tritonactor.settings.options import Switch, honoured
from tritonactor.settings.pairs import (
    BACKEND_CONFIG,
    CACHE_CONFIG,
    INT32_MAX,
    METRICS_CONFIG,
    TRACE_CONFIG,
    TRACE_LEVEL,
    UINT32_MAX,
    GroupSetting,
    Restriction,
    restrictions,
)
from tritonactor.store.location import StoreLocation

REPOSITORY = "Model repository"
SERVER = "Server"
HTTP = "HTTP"
GRPC = "gRPC"
METRICS = "Metrics"
LOGGING = "Logging"
TRACING = "Tracing"
BACKEND = "Backend and cache"


def _default_repositories() -> tuple[Path, ...]:
    # Looked up at call time, so that a test can stand in for the bundled repository.
    return (common.example_repository(),)


def _default_repository_cache() -> Path:
    return common.default_repository_cache()


def _default_journal() -> Path:
    return common.default_journal()


class ServedSettings(BaseSettings):
    """The fields of `Settings` that tritonactor acts on."""

    # Field names such as model_repositories are ours to use, whatever pydantic reserves.
    model_config = SettingsConfigDict(protected_namespaces=())

    model_repositories: Annotated[
        tuple[Path | StoreLocation, ...],
        honoured(
            "model repositories (comma-separated in the variable; repeat the flag): local "
            "folders, which must exist, and object-store folders as Triton names them "
            "(`s3://bucket/path`, `s3://host:port/bucket/path`, `gs://…`, `as://…`; "
            "[object-store.md](object-store.md))",
            REPOSITORIES,
            REPOSITORY,
            "--model-repository",
            "--model-store",
            variable="MODEL_REPOSITORY",
            default="the bundled example repository",
        ),
    ] = Field(default_factory=_default_repositories)
    model_control_mode: Annotated[
        ControlMode,
        honoured(
            "`none`: load every model at start. `poll`: the same, then follow the "
            "repositories' changes ([poll-mode.md](poll-mode.md)). `explicit`: load "
            "`TRITONACTOR_LOAD_MODEL` at start, plus what the journal says was loaded through "
            "the API; then load/unload on request ([repository-api.md](repository-api.md))",
            enum(ControlMode),
            REPOSITORY,
        ),
    ] = ControlMode.NONE
    repository_poll_secs: Annotated[
        float,
        honoured(
            "poll interval, for poll mode; 0: load at start and never poll again (Triton's 0)",
            POLL_SECONDS,
            REPOSITORY,
        ),
    ] = 15.0
    repository_cache_dir: Annotated[
        Path,
        honoured(
            "where object-store repositories are copied before their models load (one "
            "folder per store location, kept across restarts; one server at a time)",
            PATH,
            REPOSITORY,
            default="`$TRITON_AWS_MOUNT_DIRECTORY` if set, else `$XDG_CACHE_HOME/tritonactor/"
            "repositories` (else `~/.cache/…`)",
        ),
    ] = Field(default_factory=_default_repository_cache)
    # Names of models to load at startup, or ("*",) for all. Only explicit mode acts on it, as in
    # Triton; other modes load everything anyway.
    load_models: Annotated[
        tuple[str, ...],
        honoured(
            "explicit mode: models to load at start (comma-separated in the variable; repeat "
            "the flag); `*` = all. A name in no repository is reported UNAVAILABLE in the index",
            MODEL_NAMES,
            REPOSITORY,
            "--load-model",
            variable="LOAD_MODEL",
        ),
    ] = ()
    exit_on_error: Annotated[
        bool,
        honoured(
            "`true`: a model that fails to load at start (modes none and poll, or the "
            "`--load-model` list) stops the server, which exits non-zero naming it and why. "
            "`false`: the server serves the other models",
            BOOL,
            REPOSITORY,
        ),
    ] = True
    strict_readiness: Annotated[
        bool,
        honoured(
            "`true`: ready when live and every model that should be loaded is READY. `false`: "
            "ready whenever live (`/v2/health/ready`, gRPC `ServerReady`, the health service)",
            BOOL,
            REPOSITORY,
        ),
    ] = True
    strict_model_config: Annotated[
        bool,
        honoured(
            "`true`: no auto-complete; a model without `config.pbtxt` fails to load with that "
            "reason",
            BOOL,
            REPOSITORY,
            "--strict-model-config",
            switches=(
                Switch(
                    "--disable-auto-complete-config",
                    "true",
                    "as --strict-model-config=true (tritonserver's newer name)",
                ),
            ),
        ),
    ] = False
    # Load a model when its first request arrives instead of at startup.
    lazy_load: Annotated[
        bool,
        honoured(
            "`true`: a model is loaded when its first inference request arrives (that request "
            "waits for the load and gets its error if it fails), not at start. Readiness does "
            "not wait for models nobody asked for. In explicit mode the startup list still "
            "loads at start",
            BOOL,
            REPOSITORY,
        ),
    ] = False
    # Bytes that loaded models may take (0: no limit); see docs/configuration.md.
    memory_budget: Annotated[
        int,
        honoured(
            "bytes that loaded models may take, e.g. `8GiB`, `512MiB`, `2G`. See "
            "[the memory budget](#the-memory-budget)",
            SIZE,
            REPOSITORY,
            default="`0` (no limit)",
        ),
    ] = 0
    journal: Annotated[
        Path,
        honoured(
            "the control-plane journal; never inside a model repository",
            PATH,
            SERVER,
            default="`$XDG_STATE_HOME/tritonactor/journal.jsonl` (else `~/.local/state/…`)",
        ),
    ] = Field(default_factory=_default_journal)
    exit_timeout_secs: Annotated[
        int,
        honoured(
            "at shutdown (SIGTERM, SIGINT), how long the requests already admitted may take "
            "to finish while new ones are answered 503 / UNAVAILABLE, and then the models to "
            "stop (shutdown.md)",
            at_least(0, "SECONDS"),
            SERVER,
        ),
    ] = 30

    http_host: Annotated[
        str, honoured("where `tritonactor serve` binds hypercorn", HOST, HTTP, "--http-address")
    ] = "0.0.0.0"
    http_port: Annotated[int, honoured("the HTTP port (0: any free port)", PORT, HTTP)] = 8000
    http_header_forward_pattern: Annotated[
        str,
        honoured(
            "HTTP headers whose name matches this regular expression reach the model as "
            "request parameters (case-insensitive unless it starts with `(?-i)`); empty: none",
            REGEX,
            HTTP,
        ),
    ] = ""
    http_restricted_api: Annotated[
        tuple[Restriction, ...],
        honoured(
            "`<api>[,<api>…]:<key>=<value>`: those APIs answer only requests with header "
            "`<key>: <value>`. APIs: health, metadata, inference, shared-memory, model-config, "
            "model-repository, statistics, trace, logging; each in one group at most",
            restrictions("api"),
            HTTP,
        ),
    ] = ()
    # Bounds on a request's body ([limits.md](limits.md)); Triton's defaults.
    http_max_input_size: Annotated[
        int,
        honoured(
            "the largest request body, in bytes: a larger one is answered 400 before it is read",
            at_least(1, "BYTES"),
            HTTP,
            default="`67108864` (64 MiB, Triton's)",
        ),
    ] = 64 * 1024 * 1024
    http_body_timeout_secs: Annotated[
        int,
        honoured(
            "how long a request's body may take to arrive, from its headers: past it, 408 and "
            "the connection is closed",
            at_least(1, "SECONDS"),
            HTTP,
        ),
    ] = 30
    http_max_json_depth: Annotated[
        int,
        honoured(
            "how deep a request's JSON may nest arrays and objects: deeper is answered 400 "
            "before it is parsed",
            in_range(1, 500),
            HTTP,
            default="`100` (Triton's)",
        ),
    ] = 100
    http_lane: Annotated[
        bool,
        honoured(
            "under `tritonactor serve`'s uvicorn, an infer request whose body came with its "
            "headers answered below ASGI by the infer route's own handler, as the app answers "
            "it ([architecture.md](architecture.md)); `false`: every request through uvicorn's "
            "request cycle and the app's layers",
            BOOL,
            HTTP,
        ),
    ] = True
    # TLS ([tls.md](tls.md)): Triton has no HTTP TLS; the gRPC family's rules, with HTTP names.
    http_use_ssl: Annotated[
        bool,
        honoured(
            "serve HTTP over TLS with `--http-server-cert` and `--http-server-key` "
            "(`tritonactor serve` hands them to the ASGI server; [tls.md](tls.md))",
            BOOL,
            HTTP,
        ),
    ] = False
    http_use_ssl_mutual: Annotated[
        bool,
        honoured(
            "HTTP over TLS, and every client must show a certificate that chains to "
            "`--http-root-cert` (implies `--http-use-ssl`)",
            BOOL,
            HTTP,
        ),
    ] = False
    http_server_cert: Annotated[
        Path | None,
        honoured("PEM file: the HTTP server's certificate (chain)", PATH, HTTP, default="unset"),
    ] = None
    http_server_key: Annotated[
        Path | None,
        honoured(
            "PEM file: the HTTP server certificate's private key", PATH, HTTP, default="unset"
        ),
    ] = None
    http_root_cert: Annotated[
        Path | None,
        honoured(
            "PEM file: the root certificate(s) client certificates must chain to; used with "
            "`--http-use-ssl-mutual`",
            PATH,
            HTTP,
            default="unset",
        ),
    ] = None

    grpc_enabled: Annotated[
        bool, honoured("serve gRPC", BOOL, GRPC, "--allow-grpc", variable="ALLOW_GRPC")
    ] = True
    # None until validated: then the HTTP address, unless given (as the metrics address).
    grpc_host: Annotated[
        str | None,
        honoured(
            "the gRPC listener's address",
            HOST,
            GRPC,
            "--grpc-address",
            default="the HTTP address",
        ),
    ] = None
    grpc_port: Annotated[int, honoured("the gRPC port (0: any free port)", PORT, GRPC)] = 8001
    grpc_header_forward_pattern: Annotated[
        str,
        honoured(
            "gRPC metadata whose key matches this regular expression reach the model as "
            "request parameters (case-insensitive unless it starts with `(?-i)`); empty: none",
            REGEX,
            GRPC,
        ),
    ] = ""
    grpc_restricted_protocol: Annotated[
        tuple[Restriction, ...],
        honoured(
            "`<protocol>[,<protocol>…]:<key>=<value>`: those protocols answer only calls with "
            "metadata `triton-grpc-protocol-<key>: <value>`; the same categories as "
            "`--http-restricted-api`",
            restrictions("protocol"),
            GRPC,
        ),
    ] = ()
    grpc_max_message_size: Annotated[
        int,
        honoured(
            "the largest request message, in bytes: a larger one is answered RESOURCE_EXHAUSTED "
            "from its length, before it is read",
            in_range(1, INT32_MAX, "BYTES"),
            GRPC,
            default="`2147483647` (Triton's)",
        ),
    ] = INT32_MAX
    grpc_lane: Annotated[
        bool,
        honoured(
            "calls, unary and streaming, read and answered beside h2, without its per-frame "
            "objects, and ModelInfer without grpclib's request handler "
            "([grpc.md](grpc.md#performance)); "
            "`false`: every call through h2 and grpclib's handler, as grpclib serves it",
            BOOL,
            GRPC,
        ),
    ] = True
    # TLS as Triton's flags ([tls.md](tls.md)).
    grpc_use_ssl: Annotated[
        bool,
        honoured(
            "serve gRPC over TLS with `--grpc-server-cert` and `--grpc-server-key` "
            "([tls.md](tls.md))",
            BOOL,
            GRPC,
        ),
    ] = False
    grpc_use_ssl_mutual: Annotated[
        bool,
        honoured(
            "gRPC over TLS, and every client must show a certificate that chains to "
            "`--grpc-root-cert` (implies `--grpc-use-ssl`)",
            BOOL,
            GRPC,
        ),
    ] = False
    grpc_server_cert: Annotated[
        Path | None,
        honoured("PEM file: the gRPC server's certificate (chain)", PATH, GRPC, default="unset"),
    ] = None
    grpc_server_key: Annotated[
        Path | None,
        honoured(
            "PEM file: the gRPC server certificate's private key", PATH, GRPC, default="unset"
        ),
    ] = None
    grpc_root_cert: Annotated[
        Path | None,
        honoured(
            "PEM file: the root certificate(s) client certificates must chain to; used with "
            "`--grpc-use-ssl-mutual`",
            PATH,
            GRPC,
            default="unset",
        ),
    ] = None

    metrics_enabled: Annotated[
        bool,
        honoured(
            "serve metrics ([metrics.md](metrics.md))",
            BOOL,
            METRICS,
            "--allow-metrics",
            variable="ALLOW_METRICS",
        ),
    ] = True
    cpu_metrics_enabled: Annotated[
        bool,
        honoured(
            "export the `nv_cpu_*` families",
            BOOL,
            METRICS,
            "--allow-cpu-metrics",
            variable="ALLOW_CPU_METRICS",
        ),
    ] = True
    gpu_metrics_enabled: Annotated[
        bool,
        honoured(
            "export the `nv_gpu_*` families (where NVML sees a GPU)",
            BOOL,
            METRICS,
            "--allow-gpu-metrics",
            variable="ALLOW_GPU_METRICS",
        ),
    ] = True
    # None until validated: then the HTTP address, as in Triton, unless given.
    metrics_host: Annotated[
        str | None,
        honoured(
            "the metrics listener's address",
            HOST,
            METRICS,
            "--metrics-address",
            default="the HTTP address",
        ),
    ] = None
    metrics_port: Annotated[int, honoured("the metrics port (0: any free port)", PORT, METRICS)] = (
        8002
    )
    metrics_config: Annotated[
        tuple[str, ...],
        honoured(
            "the latency metrics, as Triton's: `counter_latencies=false` leaves the duration "
            "counters out, `summary_latencies=true` adds the latency summaries, "
            "`summary_quantiles=<quantile>:<error>,...` chooses their quantiles "
            "([metrics.md](metrics.md#latency-summaries)); other settings are warned of and "
            "ignored",
            METRICS_CONFIG,
            METRICS,
            default="empty",
        ),
    ] = ()

    log_verbose: Annotated[
        int,
        honoured(
            "`> 0`: verbose logging up to that level ([logging.md](logging.md)); changeable "
            "at run time through `/v2/logging`",
            LOG_VERBOSE,
            LOGGING,
        ),
    ] = 0
    log_info: Annotated[
        bool, honoured("log info lines; changeable through `/v2/logging`", BOOL, LOGGING)
    ] = True
    log_warning: Annotated[
        bool, honoured("log warnings; changeable through `/v2/logging`", BOOL, LOGGING)
    ] = True
    log_error: Annotated[
        bool, honoured("log errors; changeable through `/v2/logging`", BOOL, LOGGING)
    ] = True
    # text (alias default), ISO8601 (text with ISO 8601 times) or json (one object a line); see
    # docs/logging.md. tritonserver's own values are accepted so its --log-format works unchanged.
    log_format: Annotated[
        str,
        honoured(
            "`text` (alias `default`): Triton's log line layout; `ISO8601`: the same with ISO "
            "8601 times; `json`: one JSON object a line, with the trace context. See "
            "[logging.md](logging.md)",
            LOG_FORMAT,
            LOGGING,
        ),
    ] = "text"
    # Empty: log to stderr. Fixed at start: as in Triton, the logging API cannot move it.
    log_file: Annotated[
        str,
        honoured(
            "append the log to this file; its directory must exist. Fixed at start",
            LOG_FILE,
            LOGGING,
            default="empty (stderr)",
        ),
    ] = ""

    trace_level: Annotated[
        tuple[str, ...],
        honoured(
            "the initial trace level (TIMESTAMPS and TENSORS add up, OFF wins); "
            "as `--trace-config level=…`. Unset: TIMESTAMPS when an OpenTelemetry exporter is "
            "configured, else OFF ([tracing.md](tracing.md))",
            TRACE_LEVEL,
            TRACING,
            default="unset",
        ),
    ] = ()
    trace_rate: Annotated[
        int | None,
        honoured(
            "trace 1 request in this many; as `--trace-config rate=…`. Unset: 1 (every "
            "request); 0: only those a client's `traceparent` samples",
            in_range(0, UINT32_MAX),
            TRACING,
            default="unset",
        ),
    ] = None
    trace_count: Annotated[
        int | None,
        honoured(
            "how many requests to trace (-1: no limit); as `--trace-config count=…`",
            in_range(-1, INT32_MAX),
            TRACING,
            default="unset (-1)",
        ),
    ] = None
    trace_log_frequency: Annotated[
        int | None,
        honoured(
            "accepted, as `--trace-config triton,log-frequency=…`: traces go to OpenTelemetry, "
            "not files, and the trace API shows no `log_frequency` (Triton's OpenTelemetry mode)",
            in_range(0, UINT32_MAX),
            TRACING,
            default="unset (0)",
        ),
    ] = None
    trace_config: Annotated[
        tuple[GroupSetting, ...],
        honoured(
            "`[<mode>,]<setting>=<value>`: `level`, `rate`, `count` and "
            "`triton,log-frequency` set the initial trace settings (a rate, count or frequency "
            "wins over the older flag; levels add up, OFF winning, as in Triton). Other "
            "settings are accepted with a warning: `opentelemetry,url`, "
            "`resource` and `bsp_*` name the `OTEL_*` variable to use instead; `mode=triton` "
            "and `triton,file` have no meaning here (traces go to OpenTelemetry)",
            TRACE_CONFIG,
            TRACING,
        ),
    ] = ()

    backend_config: Annotated[
        dict[str, dict[str, str]],
        honoured(
            "`<backend>,<setting>=<value>`, or `<setting>=<value>` for every backend. Each "
            "backend reads its own (`Backend.backend_config`: the global "
            "settings overlaid by its own), e.g. the python backend's `shm-default-byte-size`",
            BACKEND_CONFIG,
            BACKEND,
        ),
    ] = Field(default_factory=dict)
    cache_config: Annotated[
        dict[str, dict[str, str]],
        honoured(
            "`<cache>,<setting>=<value>`: the response cache. The one cache is `local`, with "
            "one setting, `size` (bytes, at least 192): `local,size=1048576`. Models ask for "
            "it with `response_cache { enable: true }` "
            "([response-cache.md](response-cache.md))",
            CACHE_CONFIG,
            BACKEND,
        ),
    ] = Field(default_factory=dict)
    response_cache_byte_size: Annotated[
        int | None,
        honoured(
            "the older form of `--cache-config=local,size=…` (warned about, as Triton does); "
            "not with `--cache-config`",
            at_least(0, "BYTES"),
            BACKEND,
        ),
    ] = None
