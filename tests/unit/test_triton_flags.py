"""tritonserver's flags on `tritonactor serve`: each is parsed into its setting (or refused with
a message naming it), survives the trip through the environment to hypercorn's workers, and is
either honoured or named in a warning at startup."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from tritonactor import cli
from tritonactor.backends.base import Backend, BackendModel, ModelContext
from tritonactor.backends.registry import BackendRegistry
from tritonactor.control import events as ev
from tritonactor.observability import logging as log_settings
from tritonactor.observability.logging import configure_logging
from tritonactor.observability.metrics import MetricsCollector
from tritonactor.server import Server, StartupFailed, startup_failures
from tritonactor.settings import (
    OPTIONS,
    VARIABLES,
    Restriction,
    Settings,
    SettingsError,
    Support,
    markdown_table,
)
from tritonactor.settings.docs import documented_table

ROOT = Path(__file__).resolve().parents[2]

# Every option tritonserver 2.51 takes (`tritonserver --help`), but --help itself.
TRITONSERVER_2_51_OPTIONS = """
--id --exit-timeout-secs --log-verbose --log-info --log-warning --log-error --log-format
--log-file --model-store --model-repository --exit-on-error --disable-auto-complete-config
--strict-readiness --model-control-mode --repository-poll-secs --load-model --model-config-name
--model-load-thread-count --model-load-retry-count --model-namespacing --enable-peer-access
--allow-http --http-address --http-port --reuse-http-port --http-header-forward-pattern
--http-thread-count --http-restricted-api --allow-grpc --grpc-address --grpc-port
--reuse-grpc-port --grpc-header-forward-pattern --grpc-infer-allocation-pool-size --grpc-use-ssl
--grpc-use-ssl-mutual --grpc-server-cert --grpc-server-key --grpc-root-cert
--grpc-infer-response-compression-level --grpc-keepalive-time --grpc-keepalive-timeout
--grpc-keepalive-permit-without-calls --grpc-http2-max-pings-without-data
--grpc-http2-min-recv-ping-interval-without-data --grpc-http2-max-ping-strikes
--grpc-max-connection-age --grpc-max-connection-age-grace --grpc-restricted-protocol
--allow-sagemaker --sagemaker-port --sagemaker-safe-port-range --sagemaker-thread-count
--allow-vertex-ai --vertex-ai-port --vertex-ai-thread-count --vertex-ai-default-model
--allow-metrics --allow-gpu-metrics --allow-cpu-metrics --metrics-address --metrics-port
--metrics-interval-ms --metrics-config --trace-config --backend-directory --backend-config
--repoagent-directory --cache-config --cache-directory --rate-limit --rate-limit-resource
--pinned-memory-pool-byte-size --cuda-memory-pool-byte-size --cuda-virtual-address-size
--min-supported-compute-capability --buffer-manager-thread-count --host-policy
--model-load-gpu-limit --strict-model-config --response-cache-byte-size --trace-file
--trace-level --trace-rate --trace-count --trace-log-frequency
""".split()  # noqa: SIM905 - as `tritonserver --help` lists them


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "models"
    path.mkdir()
    return path


@pytest.fixture
def base(repo: Path, tmp_path: Path) -> dict[str, str]:
    """The environment the flags are written over: a repository, a home for the journal."""
    return {"TRITONACTOR_MODEL_REPOSITORY": str(repo), "HOME": str(tmp_path / "home")}


@pytest.fixture
def execs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[str], dict[str, str]]]:
    calls: list[tuple[list[str], dict[str, str]]] = []
    monkeypatch.setattr(cli, "_exec", lambda command, env: calls.append((command, env)))
    # Nor bind the server's ports (tests/unit/test_tls_cli.py checks that it does).
    monkeypatch.setattr(cli, "claim_addresses", lambda settings, bind_http=False: None)
    # Nor start an engine process (the topologies are tested end to end).
    monkeypatch.setattr(cli, "start_engine", lambda settings: "/engine-not-started.sock")
    return calls


@pytest.fixture
def clean_environ(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.startswith(("TRITONACTOR_", "OTEL_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)


def settings_from(base: dict[str, str], *argv: str) -> Settings:
    """The settings `tritonactor serve ARGV` hands its workers."""
    args = cli.build_parser().parse_args(["serve", *argv])
    return Settings.from_env(cli.build_env(args, base))


def refusal(base: dict[str, str], *argv: str) -> str:
    """The message a command line's bad value is refused with."""
    args = cli.build_parser().parse_args(["serve", *argv])
    with pytest.raises(SettingsError) as caught:
        Settings.from_env(cli.build_env(args, base))
    return cli._explain(caught.value, args)


# -- every tritonserver option is a flag -------------------------------------------------------


def test_every_tritonserver_option_is_accepted() -> None:
    flags = {flag for name, option in OPTIONS.items() for flag in option.flags_for(name)}
    flags |= {switch.flag for option in OPTIONS.values() for switch in option.switches}
    assert set(TRITONSERVER_2_51_OPTIONS) <= flags


def test_help_lists_every_flag_with_its_variable(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    assert cli.main(["serve", "--help"]) == 0
    text = capsys.readouterr().out
    for name, option in OPTIONS.items():
        for flag in option.flags_for(name):
            assert f"{flag} " in text or f"{flag}," in text, flag
        assert f"[{VARIABLES[name]}]" in text, name
        if option.support is Support.IGNORED:
            assert f"accepted, ignored: {option.why.split(' ')[0]}" in text
    assert "--disable-auto-complete-config" in text


def test_the_docs_table_is_the_generated_one() -> None:
    document = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert documented_table(document) == markdown_table(), (
        "docs/configuration.md's settings table is stale: run "
        "`python -m tritonactor.settings --update docs/configuration.md`"
    )


def test_the_docs_table_has_a_row_for_every_variable() -> None:
    table = markdown_table()
    for name, option in OPTIONS.items():
        assert f"| `{VARIABLES[name]}` | `{option.flags_for(name)[0]}" in table
    assert "| accepted, ignored: there is no SageMaker endpoint |" in table


# -- booleans, exit-on-error, strict readiness ----------------------------------------------------


def test_tritons_defaults(base: dict[str, str]) -> None:
    settings = settings_from(base)
    assert settings.exit_on_error is True
    assert settings.strict_readiness is True
    assert settings.exit_timeout_secs == 30
    assert (settings.log_info, settings.log_warning, settings.log_error) == (True, True, True)
    assert settings.backend_config == {}
    assert settings.http_restricted_api == settings.grpc_restricted_protocol == ()
    assert settings.warnings() == []


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--exit-on-error=false"], False),
        (["--exit-on-error", "false"], False),
        (["--exit-on-error", "OFF"], False),
        (["--exit-on-error"], True),
        (["--exit-on-error=0", "--exit-on-error=true"], True),
    ],
)
def test_bool_flag_syntax(base: dict[str, str], argv: list[str], expected: bool) -> None:
    assert settings_from(base, *argv).exit_on_error is expected


def test_strict_readiness_flag(base: dict[str, str]) -> None:
    assert settings_from(base, "--strict-readiness", "false").strict_readiness is False
    assert settings_from(base, "--strict-readiness").strict_readiness is True


def test_a_bool_of_the_wrong_kind_names_variable_and_flag(base: dict[str, str]) -> None:
    message = refusal(base, "--strict-readiness=maybe")
    assert message.startswith("TRITONACTOR_STRICT_READINESS='maybe' is not a boolean")
    assert message.endswith("(set by --strict-readiness)")


def test_disable_auto_complete_config_wins_over_strict_model_config(base: dict[str, str]) -> None:
    assert settings_from(base, "--disable-auto-complete-config").strict_model_config is True
    settings = settings_from(base, "--strict-model-config=false", "--disable-auto-complete-config")
    assert settings.strict_model_config is True
    assert settings_from(base, "--strict-model-config").strict_model_config is True


def test_exit_timeout_secs(base: dict[str, str]) -> None:
    assert settings_from(base, "--exit-timeout-secs", "5").exit_timeout_secs == 5
    assert "is not an integer" in refusal(base, "--exit-timeout-secs=soon")
    assert "expected an integer >= 0" in refusal(base, "--exit-timeout-secs=-1")


def test_exit_timeout_becomes_hypercorns_graceful_timeout(base: dict[str, str]) -> None:
    command = cli.hypercorn_command(settings_from(base, "--exit-timeout-secs=5"))
    assert command[command.index("--graceful-timeout") + 1] == "5"


# -- logging ------------------------------------------------------------------------------------


@pytest.fixture
def fresh_tree() -> Iterator[None]:
    tree = logging.getLogger("tritonactor")
    root = logging.getLogger()
    saved = (tree.handlers[:], tree.level, tree.propagate, root.handlers[:])
    tree.handlers = [h for h in tree.handlers if not isinstance(h, log_settings._SettingsHandler)]
    yield
    for handler in tree.handlers + root.handlers:
        if isinstance(handler, log_settings._SettingsHandler):
            handler.close()
    tree.handlers, tree.level, tree.propagate, root.handlers = saved


@pytest.mark.usefixtures("fresh_tree")
def test_log_kinds_start_as_the_flags_say(base: dict[str, str]) -> None:
    settings = settings_from(base, "--log-info=false", "--log-warning", "--log-error", "off")
    configured = configure_logging(settings)
    assert (configured.log_info, configured.log_warning, configured.log_error) == (
        False,
        True,
        False,
    )
    assert log_settings.current()["log_info"] is False  # what GET /v2/logging answers


def test_log_verbose_takes_tritons_true_and_false(base: dict[str, str]) -> None:
    assert settings_from(base, "--log-verbose=true").log_verbose == 1
    assert settings_from(base, "--log-verbose", "false").log_verbose == 0
    assert settings_from(base, "--log-verbose=3").log_verbose == 3


# -- tracing -------------------------------------------------------------------------------------


def test_trace_flags_become_the_initial_trace_settings(base: dict[str, str]) -> None:
    settings = settings_from(
        base,
        "--trace-level=TIMESTAMPS",
        "--trace-level",
        "tensors",
        "--trace-rate=100",
        "--trace-count=3",
        "--trace-log-frequency=7",
    )
    assert settings.trace_level == ("TIMESTAMPS", "TENSORS")
    defaults = settings.trace_defaults()
    assert (defaults.level, defaults.rate, defaults.count, defaults.log_frequency) == (
        ("TIMESTAMPS", "TENSORS"),
        100,
        3,
        7,
    )
    assert defaults.notes == ()


def test_trace_config_wins_over_the_older_flags(base: dict[str, str]) -> None:
    settings = settings_from(
        base,
        "--trace-rate=100",
        "--trace-config",
        "rate=5",
        "--trace-config=count=-1",
        "--trace-config=level=TIMESTAMPS",
        "--trace-config=triton,log-frequency=9",
        "--trace-log-frequency=7",
        "--trace-config=mode=opentelemetry",
    )
    defaults = settings.trace_defaults()
    assert (defaults.level, defaults.rate, defaults.count, defaults.log_frequency) == (
        ("TIMESTAMPS",),
        5,
        -1,
        9,
    )
    assert defaults.notes == ()


def test_an_off_level_anywhere_turns_tracing_off(base: dict[str, str]) -> None:
    settings = settings_from(base, "--trace-level=TIMESTAMPS", "--trace-config=level=off")
    assert settings.trace_defaults().level == ("OFF",)


def test_trace_settings_with_no_meaning_here_are_warned_about(base: dict[str, str]) -> None:
    settings = settings_from(
        base,
        "--trace-config=triton,file=/tmp/trace.json",
        "--trace-config=mode=triton",
        "--trace-config=opentelemetry,url=http://collector:4318/v1/traces",
        "--trace-config=opentelemetry,bsp_max_queue_size=10",
    )
    notes = settings.warnings()
    assert any(n.startswith("--trace-config triton,file=/tmp/trace.json: accepted") for n in notes)
    assert any(n.startswith("--trace-config mode=triton: accepted, ignored") for n in notes)
    url = next(n for n in notes if "url=" in n)
    assert "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT" in url
    assert any("OTEL_BSP_MAX_QUEUE_SIZE" in n for n in notes)


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--trace-config=bogus,level=OFF"], "invalid value for trace mode option: bogus"),
        (["--trace-config=level"], "expected '<trace mode>,<setting>=<value>'"),
        (["--trace-config=,level=OFF"], "no trace mode before ','"),
        (["--trace-config=rate=often"], "'often' is not an integer"),
        (["--trace-config=level=loud"], "invalid value for trace level option: loud"),
        (["--trace-level=loud"], "invalid value for trace level option: loud"),
        (["--trace-rate=-1"], "out of range"),
        (["--trace-count=-2"], "out of range"),
    ],
)
def test_bad_trace_flags_are_refused(base: dict[str, str], argv: list[str], fragment: str) -> None:
    message = refusal(base, *argv)
    assert fragment in message
    assert message.endswith(f"(set by {argv[0].split('=')[0]})")


@pytest.mark.usefixtures("clean_environ")
def test_the_server_starts_with_the_trace_settings_asked_for(base: dict[str, str]) -> None:
    server = Server(settings_from(base, "--trace-config=level=TIMESTAMPS", "--trace-rate=10"))
    assert server.trace_settings.get() == {
        "trace_level": ["TIMESTAMPS"],
        "trace_rate": "10",
        "trace_count": "-1",
        "trace_mode": "opentelemetry",
        # Triton's OpenTelemetry mode shows where spans go and how they are batched.
        "url": "",
        "bsp_schedule_delay": "5000",
        "bsp_max_export_batch_size": "512",
        "bsp_max_queue_size": "65536",
    }
    # No OTEL_* exporter here: the level cannot take effect, and the server says so.
    assert any("no OpenTelemetry exporter" in line for line in server.startup_warnings())


@pytest.mark.usefixtures("clean_environ")
def test_without_trace_flags_the_server_keeps_its_defaults(base: dict[str, str]) -> None:
    settings = Server(settings_from(base)).trace_settings.get()
    assert (settings["trace_level"], settings["trace_rate"]) == (["OFF"], "1")


# -- backend-config --------------------------------------------------------------------------------


def test_backend_config_per_backend_and_global(base: dict[str, str]) -> None:
    settings = settings_from(
        base,
        "--backend-config=python,shm-default-byte-size=1048576",
        "--backend-config",
        "default-max-batch-size=8",
        "--backend-config=python,stub-timeout-seconds=30",
        "--backend-config=onnxruntime,option=a=b,c",
    )
    assert settings.backend_config == {
        "python": {"shm-default-byte-size": "1048576", "stub-timeout-seconds": "30"},
        "": {"default-max-batch-size": "8"},
        "onnxruntime": {"option": "a=b,c"},
    }


def test_backend_config_variable_is_a_json_list_or_one_entry(base: dict[str, str]) -> None:
    one = Settings.from_env(base | {"TRITONACTOR_BACKEND_CONFIG": "python,a=1"})
    assert one.backend_config == {"python": {"a": "1"}}
    listed = Settings.from_env(base | {"TRITONACTOR_BACKEND_CONFIG": '["python,a=1", "g=2"]'})
    assert listed.backend_config == {"python": {"a": "1"}, "": {"g": "2"}}
    assert listed.to_env()["TRITONACTOR_BACKEND_CONFIG"] == '["python,a=1", "g=2"]'


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("python", "has 'python': expected '<backend name>,<setting>=<value>'"),
        ("python,=1", "has 'python,=1': expected"),
        ("=1", "has '=1': expected"),
        (",a=1", "no backend name before ','"),
        ("python,a=", "has 'python,a=': expected"),
    ],
)
def test_malformed_backend_config_is_refused(
    base: dict[str, str], value: str, fragment: str
) -> None:
    message = refusal(base, f"--backend-config={value}")
    assert message.startswith("TRITONACTOR_BACKEND_CONFIG=")
    assert fragment in message
    assert message.endswith("(set by --backend-config)")


def test_a_backend_config_variable_that_is_not_json_is_refused(base: dict[str, str]) -> None:
    with pytest.raises(SettingsError, match="is not a JSON list of strings"):
        Settings.from_env(base | {"TRITONACTOR_BACKEND_CONFIG": '["python,a=1"'})


class _Recording(Backend):
    name = "recording"

    def initialize(self) -> None:
        self.seen_at_initialize = dict(self.backend_config)

    def load_model(self, context: ModelContext) -> BackendModel:
        raise NotImplementedError


def test_each_backend_gets_the_global_settings_overlaid_by_its_own() -> None:
    registry = BackendRegistry(
        {"python": _Recording, "other": _Recording},
        config={"": {"default-max-batch-size": "8", "x": "global"}, "python": {"x": "own"}},
    )
    python = registry.get("python")
    assert isinstance(python, _Recording)
    assert python.seen_at_initialize == {"default-max-batch-size": "8", "x": "own"}
    assert registry.get("other").backend_config == {"default-max-batch-size": "8", "x": "global"}
    with pytest.raises(TypeError):
        python.backend_config["x"] = "changed"  # type: ignore[index]


def test_a_backend_without_settings_has_an_empty_mapping() -> None:
    backend = BackendRegistry({"recording": _Recording}).get("recording")
    assert backend.backend_config == {}
    assert isinstance(Backend.backend_config, MappingProxyType)


def test_the_server_hands_its_registry_the_backend_config(base: dict[str, str]) -> None:
    server = Server(settings_from(base, "--backend-config=python,shm-default-byte-size=1048576"))
    assert server.registry.config_of("python") == {"shm-default-byte-size": "1048576"}


# -- header forwarding, restricted APIs ------------------------------------------------------------


def test_header_forward_patterns(base: dict[str, str]) -> None:
    settings = settings_from(
        base, "--http-header-forward-pattern=x-.*", "--grpc-header-forward-pattern=(?-i)X-.*"
    )
    assert settings.http_header_forward_pattern == "x-.*"
    assert settings.grpc_header_forward_pattern == "(?-i)X-.*"
    assert settings_from(base).http_header_forward_pattern == ""
    message = refusal(base, "--http-header-forward-pattern=x-(")
    assert message.startswith("TRITONACTOR_HTTP_HEADER_FORWARD_PATTERN='x-(' is not a regular")
    assert message.endswith("(set by --http-header-forward-pattern)")


def test_restricted_apis_are_parsed(base: dict[str, str]) -> None:
    settings = settings_from(
        base,
        "--http-restricted-api=model-repository,health:admin-key=admin:value=1",
        "--http-restricted-api",
        "inference:infer-key=x",
        "--grpc-restricted-protocol=statistics,trace,logging:k=v",
    )
    assert settings.http_restricted_api == (
        Restriction(frozenset({"model-repository", "health"}), "admin-key", "admin:value=1"),
        Restriction(frozenset({"inference"}), "infer-key", "x"),
    )
    assert settings.grpc_restricted_protocol == (
        Restriction(frozenset({"statistics", "trace", "logging"}), "k", "v"),
    )
    assert Settings.from_env(settings.to_env()) == settings


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--http-restricted-api=bogus:a=b"], "unknown restricted api 'bogus'"),
        (
            ["--http-restricted-api=health:a=b", "--http-restricted-api=metadata,health:c=d"],
            "restricted api 'health' can not be specified in multiple config groups",
        ),
        (["--http-restricted-api=health"], "expected '<api>[,<api>...]:<key>=<value>'"),
        (["--http-restricted-api=health:a="], "expected '<api>[,<api>...]:<key>=<value>'"),
        (["--grpc-restricted-protocol=bogus:a=b"], "unknown restricted protocol 'bogus'"),
        (
            ["--grpc-restricted-protocol=trace,trace:a=b"],
            "restricted protocol 'trace' can not be specified in multiple config groups",
        ),
    ],
)
def test_bad_restrictions_are_refused(base: dict[str, str], argv: list[str], fragment: str) -> None:
    message = refusal(base, *argv)
    assert fragment in message, message
    assert message.endswith(f"(set by {argv[0].split('=')[0]})")


def test_restrictions_given_directly_are_checked(repo: Path, tmp_path: Path) -> None:
    twice = (Restriction(frozenset({"health"}), "a", "b"),) * 2
    with pytest.raises(SettingsError, match=r"TRITONACTOR_HTTP_RESTRICTED_API=.*twice"):
        Settings(model_repositories=(repo,), journal=tmp_path / "j", http_restricted_api=twice)


# -- the response cache ----------------------------------------------------------------------------


def test_cache_config_is_honoured(base: dict[str, str]) -> None:
    settings = settings_from(base, "--cache-config=local,size=1048576")
    assert settings.cache_config == {"local": {"size": "1048576"}}
    assert settings.response_cache_size() == 1048576
    assert settings.warnings() == []
    older = settings_from(base, "--response-cache-byte-size=4096")
    assert older.response_cache_byte_size == 4096
    assert older.warnings() == [
        "--response-cache-byte-size (TRITONACTOR_RESPONSE_CACHE_BYTE_SIZE=4096) is deprecated, "
        "as in Triton: it is --cache-config=local,size=4096"
    ]


def test_cache_config_needs_a_cache_name(base: dict[str, str]) -> None:
    assert "no cache name given" in refusal(base, "--cache-config=size=1")


def test_both_cache_flags_are_refused(base: dict[str, str]) -> None:
    message = refusal(base, "--cache-config=local,size=1048576", "--response-cache-byte-size=1")
    assert "give one or the other" in message


# -- options accepted and ignored ----------------------------------------------------------------


def test_ignored_options_are_kept_and_named_in_warnings(base: dict[str, str]) -> None:
    settings = settings_from(
        base,
        "--http-thread-count=4",
        "--reuse-grpc-port=false",
        "--id",
        "mine",
        "--rate-limit-resource=R1:10:0",
        "--cuda-memory-pool-byte-size=0:67108864",
        "--model-load-gpu-limit=0:0.8",
        "--sagemaker-safe-port-range=8000-8080",
        "--grpc-infer-response-compression-level=High",
    )
    assert settings.http_thread_count == 4
    assert settings.reuse_grpc_port is False
    assert settings.grpc_infer_response_compression_level == "high"
    warnings = settings.warnings()
    assert len(warnings) == 8
    assert warnings[0] == (
        "--id (TRITONACTOR_ID=mine): accepted, ignored: server metadata always names the "
        "server triton"
    )
    named = " ".join(warnings)
    for flag in ("--http-thread-count", "--reuse-grpc-port", "--rate-limit-resource"):
        assert f"{flag} (TRITONACTOR_" in named


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--http-thread-count=abc"], "TRITONACTOR_HTTP_THREAD_COUNT='abc' is not an integer"),
        (["--reuse-grpc-port=maybe"], "is not a boolean"),
        (["--grpc-infer-response-compression-level=huge"], "is not one of: none, low"),
        (["--rate-limit-resource=R1"], "expected '<resource_name>:<count>:<device>'"),
        (["--cuda-memory-pool-byte-size=0"], "expected '<device id>:<bytes>'"),
        (["--metrics-config=a,b=c"], "expected '<setting>=<value>'"),
        (["--host-policy=numa-node=0"], "no policy name given"),
        (["--metrics-interval-ms=soon"], "is not a number"),
    ],
)
def test_an_ignored_option_of_the_wrong_kind_is_refused(
    base: dict[str, str], argv: list[str], fragment: str
) -> None:
    message = refusal(base, *argv)
    assert fragment in message
    assert message.endswith(f"(set by {argv[0].split('=')[0]})")


@pytest.mark.usefixtures("clean_environ")
def test_the_server_logs_a_warning_naming_each_ignored_flag(
    base: dict[str, str], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = Server(settings_from(base, "--http-thread-count=4", "--reuse-grpc-port=false"))
    # Once logging is configured the tree keeps its records from the root, where caplog is.
    monkeypatch.setattr(logging.getLogger("tritonactor"), "propagate", True)
    with caplog.at_level(logging.INFO, logger="tritonactor"):
        server.log_startup()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "--http-thread-count (TRITONACTOR_HTTP_THREAD_COUNT=4): accepted, ignored: HTTP is "
        "served by an event loop; --workers N runs N front-end processes",
        "--reuse-grpc-port (TRITONACTOR_REUSE_GRPC_PORT=false): accepted, ignored: the gRPC "
        "port is bound once and shared by this server's front ends only (operations.md)",
    ]
    # The options table (log_format.OBJECT) holds every setting in force.
    (options,) = [r.triton_object for r in caplog.records if hasattr(r, "triton_object")]
    assert re.search(r"^\| TRITONACTOR_HTTP_THREAD_COUNT +\| 4 +\|$", options, re.M), options
    assert re.search(r"^\| TRITONACTOR_EXIT_ON_ERROR +\| true +\|$", options, re.M)


# -- the environment channel -----------------------------------------------------------------------


def test_a_triton_command_line_survives_the_trip_to_the_workers(
    base: dict[str, str], tmp_path: Path
) -> None:
    settings = settings_from(
        base,
        "--exit-on-error=false",
        "--strict-readiness=false",
        "--disable-auto-complete-config",
        "--exit-timeout-secs=5",
        "--log-info=false",
        "--log-verbose=1",
        "--trace-level=TIMESTAMPS",
        "--trace-rate=10",
        "--trace-count=-1",
        "--trace-log-frequency=2",
        "--trace-config=opentelemetry,resource=service.name=x,y",
        "--backend-config=python,shm-default-byte-size=1048576",
        "--backend-config=default-max-batch-size=8",
        "--http-header-forward-pattern=x-.*",
        "--grpc-header-forward-pattern=y-.*",
        "--http-restricted-api=health,metadata:k=v",
        "--grpc-restricted-protocol=inference:k=v",
        "--cache-config=local,size=1048576",
        "--allow-cpu-metrics=false",
        "--allow-gpu-metrics=false",
        "--http-thread-count=4",
        "--metrics-config=summary_latencies=true",
        "--host-policy=gpu_0,numa-node=0",
        "--min-supported-compute-capability=6.0",
    )
    assert Settings.from_env(settings.to_env()) == settings
    assert Settings.from_env(base | settings.to_env()) == settings


@pytest.mark.usefixtures("clean_environ")
def test_serve_hands_the_workers_every_new_setting(
    repo: Path, execs: list[tuple[list[str], dict[str, str]]]
) -> None:
    cli.main(
        [
            "serve",
            f"--model-repository={repo}",
            "--backend-config=python,shm-default-byte-size=1048576",
            "--http-thread-count=4",
            "--exit-on-error=false",
        ]
    )
    [(_, env)] = execs
    assert env["TRITONACTOR_BACKEND_CONFIG"] == '["python,shm-default-byte-size=1048576"]'
    assert env["TRITONACTOR_HTTP_THREAD_COUNT"] == "4"
    assert env["TRITONACTOR_EXIT_ON_ERROR"] == "false"
    assert env["TRITONACTOR_REUSE_GRPC_PORT"] == ""  # not given: empty, which is unset
    assert Settings.from_env(env).backend_config == {"python": {"shm-default-byte-size": "1048576"}}


def test_an_unknown_variable_beside_the_new_ones_is_refused(base: dict[str, str]) -> None:
    with pytest.raises(SettingsError, match=r"^unknown setting TRITONACTOR_EXIT_ON_ERRORS;"):
        Settings.from_env(base | {"TRITONACTOR_EXIT_ON_ERRORS": "false"})


# -- exit-on-error, strict readiness, metrics, in the server --------------------------------------


def _failed_state() -> ev.State:
    events: list[ev.Event] = [
        ev.LoadRequested(model="good", versions=(1,), source=ev.Source.STARTUP),
        ev.ModelLoaded(model="good", version=1),
        ev.LoadRequested(model="broken", versions=(1,), source=ev.Source.STARTUP),
        ev.LoadFailed(model="broken", version=1, reason="not an onnx model"),
        ev.LoadFailed(model="nosuch", version=None, reason="not in any model repository"),
        ev.ModelDiscovered(model="unasked", repository="/r", versions=(1,)),
    ]
    return ev.fold(events)


def test_startup_failures_name_each_model_and_why() -> None:
    failures = startup_failures(_failed_state())
    assert failures == [
        ("broken", "version 1: not an onnx model"),
        ("nosuch", "not in any model repository"),
    ]
    message = str(StartupFailed(failures))
    assert "'broken': version 1: not an onnx model" in message
    assert "TRITONACTOR_EXIT_ON_ERROR=false" in message


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_without_strict_readiness_ready_is_live(base: dict[str, str]) -> None:
    server = Server(settings_from(base, "--strict-readiness=false"))
    assert await server.ready() is False  # not live yet
    server.live = True
    assert await server.ready() is True  # whatever the models (nothing even asked here)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_exit_timeout_is_the_actor_systems_shutdown_timeout(
    base: dict[str, str], monkeypatch: pytest.MonkeyPatch, clean_environ: None
) -> None:
    from tritonactor import server as server_module

    seen: list[float] = []
    real = server_module.ActorSystem

    def recording(**options: Any) -> Any:
        seen.append(options["shutdown_timeout"])
        return real(**options)

    monkeypatch.setattr(server_module, "ActorSystem", recording)
    server = Server(settings_from(base, "--exit-timeout-secs=7"))
    async with server.running():
        assert server.live
    assert seen == [7]


class _NoVersions:
    def versions(self) -> list[Any]:
        return []

    def load_seconds(self) -> dict[tuple[str, int], float]:
        return {}

    def journal_events(self) -> dict[str, int]:
        return {}

    def mailboxes(self) -> list[Any]:
        return []


class _OneGpu:
    def collect(self) -> Iterator[Any]:
        from prometheus_client.metrics_core import Metric

        family = Metric("nv_gpu_utilization", "GPU utilization", "gauge")
        family.add_sample("nv_gpu_utilization", {"gpu_uuid": "GPU-0"}, 0.5)
        yield family


@pytest.mark.parametrize(("cpu", "gpu"), [(True, True), (False, True), (True, False)])
def test_cpu_and_gpu_metrics_can_be_turned_off(cpu: bool, gpu: bool) -> None:
    collector = MetricsCollector(
        _NoVersions(),
        gpu=_OneGpu(),  # type: ignore[arg-type]
        cpu_metrics=cpu,
        gpu_metrics=gpu,
    )
    names = {family.name for family in collector.collect()}
    assert ("nv_cpu_memory_total_bytes" in names) is cpu
    assert ("nv_gpu_utilization" in names) is gpu
    assert "nv_inference_request_success" in names


def test_the_startup_log_masks_restricted_api_header_values() -> None:
    settings = Settings(
        http_restricted_api='["model-config:Admin-Key=s3cret"]',
        grpc_restricted_protocol='["health:k=hidden"]',
    )

    shown = dict(settings.describe())

    assert shown["TRITONACTOR_HTTP_RESTRICTED_API"] == '["model-config:Admin-Key=***"]'
    assert shown["TRITONACTOR_GRPC_RESTRICTED_PROTOCOL"] == '["health:k=***"]'
    assert "s3cret" not in repr(settings.describe()) + repr(settings.warnings())
    # The value itself is kept: the front ends need it, and the workers read it back.
    assert Settings.from_env(settings.to_env()) == settings


def test_the_metrics_listener_binds_where_http_does_unless_told() -> None:
    # Triton's default for --metrics-address is --http-address: binding HTTP to loopback does
    # not leave the metrics open on every interface.
    assert Settings(http_host="127.0.0.1").metrics_host == "127.0.0.1"
    assert Settings(http_host="127.0.0.1", metrics_host="0.0.0.0").metrics_host == "0.0.0.0"
    assert Settings().metrics_host == "0.0.0.0"
    local = Settings.from_env({"TRITONACTOR_HTTP_HOST": "127.0.0.1"})
    assert local.metrics_host == "127.0.0.1"
    assert Settings.from_env(local.to_env()) == local


def test_a_poll_interval_of_zero_is_triton_s_never_poll_again() -> None:
    assert Settings(repository_poll_secs="0").repository_poll_secs == 0
    with pytest.raises(SettingsError, match="expected seconds >= 0"):
        Settings(repository_poll_secs="-1")


def test_grpc_binds_where_http_does_unless_told() -> None:
    local = Settings(http_host="127.0.0.1")
    assert (local.grpc_host, local.metrics_host) == ("127.0.0.1", "127.0.0.1")
    assert Settings(http_host="127.0.0.1", grpc_host="0.0.0.0").grpc_host == "0.0.0.0"
    assert Settings.from_env(local.to_env()) == local


@pytest.mark.usefixtures("clean_environ")
@pytest.mark.parametrize("flag", ["--trace-config=rate=0", "--trace-rate=0"])
def test_a_trace_rate_of_0_at_start_traces_only_what_clients_sample(
    base: dict[str, str], flag: str
) -> None:
    """Triton's docs give rate 0 for tracing only requests whose client sampled them."""
    server = Server(settings_from(base, "--trace-config=level=TIMESTAMPS", flag))
    assert server.trace_settings.get()["trace_rate"] == "0"
    assert server.trace_settings.sample("m") is None
