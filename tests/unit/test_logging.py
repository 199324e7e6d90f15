from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.protobuf.json_format import MessageToJson
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from tritonclient.grpc import service_pb2

from tritonactor._proto import inference as pb
from tritonactor.core.errors import ErrorCode, TritonError
from tritonactor.observability import logging as log_settings
from tritonactor.observability.log_format import OBJECT, LogFormat, trace_fields
from tritonactor.observability.logging import (
    LogSettings,
    apply,
    configure_logging,
    current,
    request_logger,
    settings_from_grpc,
    settings_to_grpc,
    update,
    verbose,
)
from tritonactor.observability.trace_settings import TraceSettings
from tritonactor.observability.tracing import Tracing
from tritonactor.settings import Settings, SettingsError

TRITON_DEFAULTS = {
    "log_file": "",
    "log_info": True,
    "log_warning": True,
    "log_error": True,
    "log_verbose_level": 0,
    "log_format": "default",
}

log = logging.getLogger("tritonactor.test_logging")


@pytest.fixture(autouse=True)
def fresh_tree() -> Iterator[None]:
    """Each test starts with the tritonactor tree as nobody configured it, and leaves it so."""
    tree = logging.getLogger("tritonactor")
    root = logging.getLogger()
    saved = (tree.handlers[:], tree.level, tree.propagate, root.handlers[:])
    tree.handlers = [h for h in tree.handlers if not isinstance(h, log_settings._SettingsHandler)]
    yield
    for handler in tree.handlers + root.handlers:
        if isinstance(handler, log_settings._SettingsHandler):
            handler.close()
    tree.handlers, tree.level, tree.propagate, root.handlers = saved


@pytest.fixture
def tracer() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line]


def settings_for(tmp_path: Path, **values: object) -> Settings:
    repo = tmp_path / "models"
    repo.mkdir(exist_ok=True)
    return Settings(model_repositories=(repo,), journal=tmp_path / "j.jsonl", **values)  # type: ignore[arg-type]


# -- Triton's answers and validation -------------------------------------------------------------


def test_get_answers_tritons_settings_in_tritons_order() -> None:
    answer = current()
    assert answer == TRITON_DEFAULTS
    assert list(answer) == list(TRITON_DEFAULTS)


def test_post_changes_only_what_it_names_and_answers_every_setting() -> None:
    answer = update({"log_verbose_level": 1})
    assert answer == TRITON_DEFAULTS | {"log_verbose_level": 1}
    answer = update({"log_info": False, "log_format": "ISO8601"})
    assert answer == TRITON_DEFAULTS | {
        "log_verbose_level": 1,
        "log_info": False,
        "log_format": "ISO8601",
    }
    assert current() == answer


def test_null_and_empty_requests_change_nothing() -> None:
    update({"log_error": False})
    assert update({"log_error": None, "log_file": None}) == TRITON_DEFAULTS | {"log_error": False}
    assert update({}) == TRITON_DEFAULTS | {"log_error": False}


def test_the_documented_plural_names_work() -> None:
    # Triton's protocol document says log_warnings/log_errors; its server reads the singular.
    answer = update({"log_warnings": False, "log_errors": False})
    assert answer == TRITON_DEFAULTS | {"log_warning": False, "log_error": False}


@pytest.mark.parametrize(
    ("request_json", "code", "message"),
    [
        (
            {"log_info": "false"},
            ErrorCode.INVALID_ARG,
            "expect boolean for 'log_info', got \"false\"",
        ),
        ({"log_warning": 1}, ErrorCode.INVALID_ARG, "expect boolean for 'log_warning', got 1"),
        ({"log_error": "yes"}, ErrorCode.INVALID_ARG, "expect boolean for 'log_error'"),
        (
            {"log_verbose_level": -1},
            ErrorCode.INVALID_ARG,
            "expect uint32 for 'log_verbose_level', got -1",
        ),
        (
            {"log_verbose_level": "1"},
            ErrorCode.INVALID_ARG,
            "expect uint32 for 'log_verbose_level'",
        ),
        (
            {"log_verbose_level": 1.5},
            ErrorCode.INVALID_ARG,
            "expect uint32 for 'log_verbose_level'",
        ),
        ({"log_verbose_level": True}, ErrorCode.INVALID_ARG, "expect uint32"),
        ({"log_verbose_level": 2**32}, ErrorCode.INVALID_ARG, "expect uint32"),
        ({"log_format": "iso"}, ErrorCode.INVALID_ARG, "invalid argument for log_format, got: iso"),
        ({"log_format": "iso8601"}, ErrorCode.INVALID_ARG, "invalid argument for log_format"),
        ({"log_format": 1}, ErrorCode.INVALID_ARG, "expect string for 'log_format', got 1"),
        (
            {"log_file": "/tmp/elsewhere.log"},
            ErrorCode.UNSUPPORTED,
            "log file location can not be updated through network protocol",
        ),
        (
            {"log_level": 1},
            ErrorCode.INVALID_ARG,
            "unknown log setting 'log_level': expected one of log_file, log_info, log_warning, "
            "log_error, log_verbose_level, log_format",
        ),
        ([1, 2], ErrorCode.INVALID_ARG, "the log settings must be a JSON object"),
    ],
)
def test_bad_requests_are_refused(request_json: object, code: ErrorCode, message: str) -> None:
    with pytest.raises(TritonError) as caught:
        update(request_json)  # type: ignore[arg-type]
    assert caught.value.code is code
    assert caught.value.message.startswith(message)
    assert current() == TRITON_DEFAULTS


def test_a_refused_request_changes_nothing_it_named() -> None:
    with pytest.raises(TritonError):
        update({"log_verbose_level": 2, "log_info": False, "log_format": "fancy"})
    assert current() == TRITON_DEFAULTS


def test_log_settings_check_their_values() -> None:
    assert LogSettings(log_format="ISO8601").log_format is LogFormat.ISO8601  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        LogSettings(log_verbose_level=-1)
    with pytest.raises(ValueError):
        LogSettings(log_format="fancy")  # type: ignore[arg-type]


# -- what the settings let through ---------------------------------------------------------------


def test_info_warning_and_error_toggles_are_independent(capsys: pytest.CaptureFixture[str]) -> None:
    apply(LogSettings())
    log.info("info one")
    log.warning("warning one")
    log.error("error one")
    update({"log_info": False, "log_error": False})
    log.info("info two")
    log.warning("warning two")
    log.error("error two")
    log.critical("critical two")  # Triton has no critical: it is an error
    update({"log_info": True, "log_warning": False, "log_error": True})
    log.info("info three")
    log.warning("warning three")
    log.error("error three")
    written = capsys.readouterr().err
    for shown in ["info one", "warning one", "error one", "warning two", "info three"]:
        assert shown in written
    for hidden in ["info two", "error two", "critical two", "warning three"]:
        assert hidden not in written
    assert "error three" in written


def test_verbose_levels(capsys: pytest.CaptureFixture[str]) -> None:
    apply(LogSettings())
    log.debug("debug at 0")
    update({"log_verbose_level": 1})
    log.debug("debug at 1")
    log.log(verbose(2), "v2 at 1")
    update({"log_verbose_level": 2})
    log.log(verbose(2), "v2 at 2")
    log.log(verbose(3), "v3 at 2")
    # Verbose messages are their own kind: switching info off leaves them on.
    update({"log_info": False})
    log.debug("debug without info")
    log.info("info without info")
    written = capsys.readouterr().err
    assert "debug at 0" not in written
    assert "debug at 1" in written
    assert "v2 at 1" not in written
    assert "v2 at 2" in written
    assert "v3 at 2" not in written
    assert "debug without info" in written
    assert "info without info" not in written


def test_the_tree_does_not_pass_records_on_to_the_root(caplog: pytest.LogCaptureFixture) -> None:
    apply(LogSettings(log_info=False))
    with caplog.at_level(logging.INFO):
        log.info("switched off")
    assert "switched off" not in caplog.text


def test_a_bare_root_gets_the_same_handler(capsys: pytest.CaptureFixture[str]) -> None:
    root = logging.getLogger()
    root.handlers = []
    apply(LogSettings(json_lines=True, log_verbose_level=1))
    library = logging.getLogger("some.library")
    library.setLevel(logging.DEBUG)  # as a library that configures itself might
    library.warning("library warning")
    library.info("library info")
    library.debug("library debug")
    logging.getLogger("tritonactorish").info("not ours either")
    entries = [json.loads(line) for line in lines(capsys.readouterr().err)]
    assert [(e["logger"], e["message"]) for e in entries] == [("some.library", "library warning")]
    library.setLevel(logging.NOTSET)


# -- line formats --------------------------------------------------------------------------------


def test_default_format_is_tritons(capsys: pytest.CaptureFixture[str]) -> None:
    apply(LogSettings())
    log.warning("hello %s", "there")
    (line,) = lines(capsys.readouterr().err)
    assert re.fullmatch(
        r'W\d{4} \d{2}:\d{2}:\d{2}\.\d{6} \d+ test_logging\.py:\d+\] "hello there"', line
    ), line


def test_iso8601_format(capsys: pytest.CaptureFixture[str]) -> None:
    apply(LogSettings())
    update({"log_format": "ISO8601"})
    log.info("hello")
    log.error("broken")
    info, error = lines(capsys.readouterr().err)
    assert re.fullmatch(
        r'\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z I \d+ test_logging\.py:\d+\] "hello"', info
    )
    assert re.search(r"Z E \d+ ", error)


def test_text_lines_carry_extra_fields_and_stay_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    apply(LogSettings())
    log.info("model %s", "a\nI0101 forged line", extra={"model": "a b", "count": 2, "ok": True})
    (line,) = lines(capsys.readouterr().err)
    assert line.endswith('] "model a\\nI0101 forged line model=\\"a b\\" count=2 ok=true"')
    message = line.split("] ", 1)[1]
    assert json.loads(message) == 'model a\nI0101 forged line model="a b" count=2 ok=true'


def test_a_message_is_a_json_string_with_its_exception_inside(
    capsys: pytest.CaptureFixture[str],
) -> None:
    apply(LogSettings())
    try:
        raise ValueError('bad "value"')
    except ValueError:
        log.exception("failed \\ here\u2028next")
    (line,) = lines(capsys.readouterr().err)
    message = line.split("] ", 1)[1]
    assert "\u2028" not in message  # escaped: nothing in the message breaks the line
    text = json.loads(message)
    assert text.startswith("failed \\ here\u2028next\nTraceback (most recent call last):")
    assert text.endswith('ValueError: bad "value"')


def test_escaping_switched_off_as_in_triton(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRITON_SERVER_ESCAPE_LOG_MESSAGES", "0")
    apply(LogSettings())
    log.info('say "hi"\nI0101 forged')
    (line,) = lines(capsys.readouterr().err)
    # Unquoted, but control characters stay escaped: one record a line, still.
    assert line.endswith('] say "hi"\\nI0101 forged')
    monkeypatch.setenv("TRITON_SERVER_ESCAPE_LOG_MESSAGES", "false")  # only "0" switches it off
    apply(LogSettings(log_verbose_level=1))
    log.info("quoted")
    (line,) = lines(capsys.readouterr().err)
    assert line.endswith('] "quoted"')


def test_a_table_follows_its_heading_on_lines_of_its_own(
    capsys: pytest.CaptureFixture[str],
) -> None:
    apply(LogSettings())
    table = "+---+\n| a |\n+---+"
    log.info("", extra={OBJECT: table})
    log.info("heading", extra={OBJECT: table})
    written = capsys.readouterr().err.split("\n")
    assert re.fullmatch(r"I\S+ \S+ \d+ test_logging\.py:\d+\] ", written[0])
    assert written[1:4] == written[5:8] == table.split("\n")
    assert written[4].endswith('] "heading"')
    apply(LogSettings(json_lines=True))
    log.info("heading", extra={OBJECT: table})
    (entry,) = (json.loads(line) for line in lines(capsys.readouterr().err))
    assert (entry["message"], entry["object"]) == ("heading", table)
    assert OBJECT not in entry


def test_text_lines_carry_the_trace_context(
    capsys: pytest.CaptureFixture[str], tracer: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = tracer
    apply(LogSettings())
    with provider.get_tracer("test").start_as_current_span("request"):
        log.info("inside")
    log.info("outside")
    (span,) = exporter.get_finished_spans()
    inside, outside = lines(capsys.readouterr().err)
    assert inside.endswith(
        f'] "inside trace_id={span.context.trace_id:032x} span_id={span.context.span_id:016x}"'
    )
    assert outside.endswith('] "outside"')


def test_json_lines(
    capsys: pytest.CaptureFixture[str], tracer: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = tracer
    apply(LogSettings(json_lines=True, log_verbose_level=1))
    log.info("plain %d", 1)
    with provider.get_tracer("test").start_as_current_span("request"):
        log.warning("traced", extra={"model": "simple", "batch": 4, "where": Path("/x")})
    log.debug("verbose one")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        log.exception("failed")
    (span,) = exporter.get_finished_spans()
    plain, traced, debug, failed = (json.loads(line) for line in lines(capsys.readouterr().err))
    assert set(plain) == {"time", "level", "logger", "message"}
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z", plain["time"])
    assert (plain["level"], plain["logger"], plain["message"]) == (
        "INFO",
        "tritonactor.test_logging",
        "plain 1",
    )
    assert traced == traced | {
        "level": "WARNING",
        "message": "traced",
        "trace_id": f"{span.context.trace_id:032x}",
        "span_id": f"{span.context.span_id:016x}",
        "model": "simple",
        "batch": 4,
        "where": "/x",
    }
    assert (debug["level"], debug["verbose"]) == ("DEBUG", 1)
    assert failed["level"] == "ERROR"
    assert "RuntimeError: boom" in failed["exception"]


def test_json_lines_keep_an_explicit_trace_id(
    capsys: pytest.CaptureFixture[str], tracer: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, _ = tracer
    apply(LogSettings(json_lines=True))
    with provider.get_tracer("test").start_as_current_span("request"):
        log.info("from a thread", extra={"trace_id": "given"})
    (entry,) = (json.loads(line) for line in lines(capsys.readouterr().err))
    assert entry["trace_id"] == "given"
    assert "span_id" not in entry


# -- the log file --------------------------------------------------------------------------------


def test_log_file_switching(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first, second = tmp_path / "first.log", tmp_path / "second.log"
    apply(LogSettings(log_file=str(first)))
    log.info("to first")
    apply(LogSettings(log_file=str(second)))
    log.info("to second")
    assert current()["log_file"] == str(second)
    apply(LogSettings())
    log.info("to stderr")
    assert "to first" in first.read_text()
    assert "to second" not in first.read_text()
    assert "to second" in second.read_text()
    assert "to stderr" not in first.read_text() + second.read_text()
    assert "to stderr" in capsys.readouterr().err


def test_a_log_file_that_cannot_be_opened_changes_nothing(tmp_path: Path) -> None:
    good = tmp_path / "good.log"
    apply(LogSettings(log_file=str(good), log_verbose_level=1))
    with pytest.raises(OSError):
        apply(LogSettings(log_file=str(tmp_path / "missing" / "x.log")))
    with pytest.raises(OSError):
        apply(LogSettings(log_file=str(tmp_path)))
    assert current() == TRITON_DEFAULTS | {"log_file": str(good), "log_verbose_level": 1}
    log.debug("still here")
    assert "still here" in good.read_text()


def test_changing_other_settings_keeps_the_file_open(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    apply(LogSettings(log_file=str(path)))
    log.info("one")
    update({"log_format": "ISO8601"})
    log.info("two")
    one, two = lines(path.read_text())
    assert one.startswith("I") and one.endswith('] "one"')
    assert re.match(r"\d{4}-", two) and two.endswith('] "two"')


# -- configuring from the server's settings ------------------------------------------------------


def test_configure_logging_from_settings(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    settings = settings_for(tmp_path, log_verbose=2, log_format="ISO8601", log_file=str(path))
    configured = configure_logging(settings)
    assert configured == LogSettings(
        log_file=str(path), log_verbose_level=2, log_format=LogFormat.ISO8601
    )
    assert current() == TRITON_DEFAULTS | {
        "log_file": str(path),
        "log_verbose_level": 2,
        "log_format": "ISO8601",
    }
    log.log(verbose(2), "deep")
    # Triton writes verbose messages with the information letter.
    assert re.fullmatch(r'\S+Z I \d+ test_logging\.py:\d+\] "deep"\n', path.read_text())


def test_configure_logging_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging(settings_for(tmp_path, log_format="json"))
    assert current() == TRITON_DEFAULTS  # json lines are ours, not one of Triton's settings
    log.info("as json")
    log.debug("not verbose")
    (entry,) = (json.loads(line) for line in lines(capsys.readouterr().err))
    assert entry["message"] == "as json"


def test_configure_logging_reports_a_file_it_cannot_open(tmp_path: Path) -> None:
    folder = tmp_path / "logs"
    folder.mkdir()
    settings = settings_for(tmp_path, log_file=str(folder / "server.log"))
    folder.rmdir()  # gone between the check of the settings and the start
    with pytest.raises(SettingsError) as caught:
        configure_logging(settings)
    assert caught.value.variable == "TRITONACTOR_LOG_FILE"
    assert str(caught.value).startswith(f"TRITONACTOR_LOG_FILE='{folder / 'server.log'}' ")


# -- gRPC ----------------------------------------------------------------------------------------


def test_grpc_request_as_tritonclient_builds_it() -> None:
    # Built as tritonclient.grpc's update_log_settings builds it: a None becomes an empty value.
    request = service_pb2.LogSettingsRequest()
    request.settings["log_info"].bool_param = False
    request.settings["log_verbose_level"].uint32_param = 3
    request.settings["log_format"].string_param = "ISO8601"
    # Reading a map key creates the empty value.
    request.settings["log_file"]
    ours = pb.LogSettingsRequest.parse(request.SerializeToString())
    assert settings_from_grpc(ours) == {
        "log_info": False,
        "log_verbose_level": 3,
        "log_format": "ISO8601",
        "log_file": None,
    }
    assert update(settings_from_grpc(ours)) == TRITON_DEFAULTS | {
        "log_info": False,
        "log_verbose_level": 3,
        "log_format": "ISO8601",
    }


def test_grpc_response_reads_as_tritonclient_reads_it() -> None:
    update({"log_verbose_level": 1})
    response = service_pb2.LogSettingsResponse()
    response.ParseFromString(bytes(settings_to_grpc(current())))
    as_json = json.loads(MessageToJson(response, preserving_proto_field_name=True))
    assert as_json == {
        "settings": {
            "log_file": {"string_param": ""},
            "log_info": {"bool_param": True},
            "log_warning": {"bool_param": True},
            "log_error": {"bool_param": True},
            "log_verbose_level": {"uint32_param": 1},
            "log_format": {"string_param": "default"},
        }
    }


def test_grpc_type_errors_are_the_same_as_http() -> None:
    request = pb.LogSettingsRequest(
        settings={"log_info": pb.LogSettingsRequestSettingValue(uint32_param=1)}
    )
    with pytest.raises(TritonError, match="expect boolean for 'log_info', got 1"):
        update(settings_from_grpc(request))


# -- request lines -------------------------------------------------------------------------------


def test_requests_are_not_logged_below_verbose_1(capsys: pytest.CaptureFixture[str]) -> None:
    apply(LogSettings())
    with request_logger("HTTP", "GET", "/v2/health/ready") as entry:
        entry.status = 200
    assert capsys.readouterr().err == ""


def test_a_request_line(
    capsys: pytest.CaptureFixture[str], tracer: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = tracer
    apply(LogSettings(json_lines=True, log_verbose_level=1))
    with (
        provider.get_tracer("test").start_as_current_span("request"),
        request_logger(
            "HTTP", "POST", "/v2/models/simple/infer", model="simple", version=""
        ) as entry,
    ):
        entry.status = 200
    (span,) = exporter.get_finished_spans()
    (line,) = (json.loads(text) for text in lines(capsys.readouterr().err))
    assert line["logger"] == "tritonactor.requests"
    assert line["message"] == "HTTP POST /v2/models/simple/infer"
    assert (line["status"], line["model"], line["version"]) == (200, "simple", "")
    assert isinstance(line["duration_ms"], float)
    assert line["trace_id"] == f"{span.context.trace_id:032x}"


def test_a_request_line_names_a_span_that_is_not_current(
    capsys: pytest.CaptureFixture[str], tracer: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    # The tracing keeps a request's span in the request instead of making it current.
    provider, _ = tracer
    apply(LogSettings(json_lines=True, log_verbose_level=1))
    span = provider.get_tracer("test").start_span("request")
    with request_logger("GRPC", "ModelInfer", "simple") as entry:
        entry.span_context = span.get_span_context()
    log.info("elsewhere", extra=trace_fields(span.get_span_context()))
    span.end()
    line, elsewhere = (json.loads(text) for text in lines(capsys.readouterr().err))
    for logged in (line, elsewhere):
        assert logged["trace_id"] == f"{span.get_span_context().trace_id:032x}"
        assert logged["span_id"] == f"{span.get_span_context().span_id:016x}"
    assert trace_fields(None) == {}


def test_a_request_line_names_the_traced_requests_span(
    capsys: pytest.CaptureFixture[str], tracer: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    """A front end hands the line its request's trace (`RequestLog.trace`): the line names the
    request's span, read only as the line is written."""
    provider, _ = tracer
    apply(LogSettings(json_lines=True, log_verbose_level=1))
    tracing = Tracing(provider, TraceSettings(level=("TIMESTAMPS",), rate=1))
    trace = tracing.start_request("simple", "", None, "HTTP")
    assert trace is not None
    with request_logger("HTTP", "POST", "/v2/models/simple/infer") as entry:
        entry.trace = trace
    (line,) = (json.loads(text) for text in lines(capsys.readouterr().err))
    assert line["trace_id"] == f"{trace.span_context.trace_id:032x}"
    assert line["span_id"] == f"{trace.span_context.span_id:016x}"
    assert trace.span is not None
    assert (line["trace_id"], line["span_id"]) == (
        f"{trace.span.context[0]:032x}",
        f"{trace.span.context[1]:016x}",
    )


def test_a_failed_request_line(capsys: pytest.CaptureFixture[str]) -> None:
    apply(LogSettings(log_verbose_level=1))
    with pytest.raises(TritonError), request_logger("GRPC", "ModelInfer", "simple"):
        raise TritonError(ErrorCode.NOT_FOUND, "Request for unknown model: 'simple'")
    (line,) = lines(capsys.readouterr().err)
    # The line names the code that ran the block, not the logging module.
    assert re.match(
        r'I\S+ \S+ \d+ test_logging\.py:\d+\] "GRPC ModelInfer simple status=NOT_FOUND ', line
    )
    assert "error=\\\"Request for unknown model: 'simple'\\\"" in line
