"""Triton's trace settings: the JSON they show, what an update accepts (with Triton's messages),
per-model overrides and clearing them, and the sampling decision they make."""

from __future__ import annotations

from typing import Any

import pytest

from tritonactor.core.errors import ErrorCode, TritonError
from tritonactor.observability.span_export import exporter_settings
from tritonactor.observability.trace_settings import TraceSettings, from_grpc

EXPORTER = {
    "url": "collector:4318/v1/traces",
    "bsp_max_export_batch_size": "512",
    "bsp_schedule_delay": "5000",
    "bsp_max_queue_size": "2048",
}
# Triton's answer in its OpenTelemetry mode, keys in its order.
GLOBAL = {
    "trace_level": ["TIMESTAMPS"],
    "trace_rate": "1",
    "trace_count": "-1",
    "trace_mode": "opentelemetry",
    **EXPORTER,
}


@pytest.fixture
def settings() -> TraceSettings:
    return TraceSettings(level=("TIMESTAMPS",), rate=1, exporter=EXPORTER)


def take(settings: TraceSettings, model: str) -> bool:
    """Whether a request of `model` is traced, using up trace_count as a traced request does."""
    use_up = settings.sample(model)
    if use_up is None:
        return False
    use_up()
    return True


def test_a_request_the_sampler_drops_uses_up_no_trace_count() -> None:
    settings = TraceSettings(level=("TIMESTAMPS",), rate=1)
    settings.update({"trace_count": "2"})
    for _ in range(5):
        assert settings.sample("m") is not None  # considered, then dropped by the sampler
    assert settings.get()["trace_count"] == "2"
    assert [take(settings, "m") for _ in range(3)] == [True, True, False]


def test_settings_read_as_triton_writes_them(settings: TraceSettings) -> None:
    assert settings.get() == GLOBAL
    assert list(settings.get()) == list(GLOBAL)
    assert TraceSettings().get()["trace_level"] == ["OFF"]
    assert TraceSettings().get()["trace_rate"] == "1000"


def test_an_update_changes_only_what_it_names(settings: TraceSettings) -> None:
    answer = settings.update({"trace_rate": "5", "trace_level": ["TENSORS", "TIMESTAMPS"]})
    assert answer == GLOBAL | {"trace_rate": "5", "trace_level": ["TIMESTAMPS", "TENSORS"]}
    assert settings.get() == answer


def test_a_model_override_falls_back_to_the_global_setting(settings: TraceSettings) -> None:
    assert settings.update({"trace_rate": "7"}, "m") == GLOBAL | {"trace_rate": "7"}
    # Not set for the model: follows the global setting, now and later.
    settings.update({"trace_count": "9"})
    assert settings.get("m") == GLOBAL | {"trace_rate": "7", "trace_count": "9"}
    assert settings.get("other") == GLOBAL | {"trace_count": "9"}
    # null clears the override: the global value is in force again.
    assert settings.update({"trace_rate": None}, "m")["trace_rate"] == "1"


def test_clearing_a_global_setting_restores_the_servers_default(settings: TraceSettings) -> None:
    settings.update({"trace_rate": "50", "trace_level": ["OFF"]})
    assert settings.update({"trace_rate": None, "trace_level": None}) == GLOBAL


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"trace_rate": "abc"}, "Unable to parse 'trace_rate', got: abc"),
        (
            {"trace_rate": "0"},
            "Attempting to set invalid trace setting :sample rate must be non-zero",
        ),
        (
            {"trace_rate": "4294967296"},
            "Unable to parse 'trace_rate', value is out of range [ 0, 4294967295 ], "
            "got: 4294967296",
        ),
        ({"trace_rate": 5}, "Unable to parse 'trace_rate', expected a string, got: 5"),
        ({"trace_count": "-2"}, "Unable to parse 'trace_count'. Expecting value >= -1, got:-2"),
        ({"log_frequency": "x"}, "Unable to parse 'log_frequency', got: x"),
        ({"trace_level": ["OFF", "TIMESTAMPS"]}, "Expect only one trace level 'OFF' is specified"),
        ({"trace_level": "TIMESTAMPS"}, "Unable to parse 'trace_level', expected an array"),
        ({"trace_level": ["LOUD"]}, "unknown level 'LOUD'"),
        ({"trace_mode": "triton"}, "trace_mode cannot be set to 'triton'"),
        ({"trace_colour": "red"}, "Unknown trace setting 'trace_colour'"),
    ],
)
def test_invalid_values_are_refused_and_change_nothing(
    settings: TraceSettings, changes: dict[str, Any], message: str
) -> None:
    with pytest.raises(TritonError) as caught:
        settings.update({"trace_count": "3", **changes})
    assert caught.value.code is ErrorCode.INVALID_ARG
    assert message in caught.value.message
    assert settings.get() == GLOBAL


@pytest.mark.parametrize("value", ["/tmp/trace.json", "", None])
def test_a_trace_file_is_unsupported_as_in_triton(settings: TraceSettings, value: object) -> None:
    with pytest.raises(TritonError) as caught:
        settings.update({"trace_count": "3", "trace_file": value})
    assert caught.value.code is ErrorCode.UNSUPPORTED
    assert caught.value.message == (
        "trace file location can not be updated through network protocol"
    )
    assert settings.get() == GLOBAL


def test_the_exporter_settings_are_taken_and_stay_as_the_environment_says(
    settings: TraceSettings,
) -> None:
    answer = settings.update(
        {"url": "elsewhere:4318", "bsp_schedule_delay": "1", "trace_rate": "3"}
    )
    assert answer == GLOBAL | {"trace_rate": "3"}


def test_rate_0_from_the_start_samples_nothing_by_itself() -> None:
    settings = TraceSettings(level=("TIMESTAMPS",), rate=0)
    assert settings.get()["trace_rate"] == "0"
    assert not any(take(settings, "m") for _ in range(5))


def test_what_get_shows_can_be_posted_back(settings: TraceSettings) -> None:
    assert settings.update(settings.get()) == GLOBAL


def test_trace_rate_takes_one_request_in_n(settings: TraceSettings) -> None:
    settings.update({"trace_rate": "4"})
    assert [take(settings, "m") for _ in range(8)] == [False, False, False, True] * 2


def test_trace_count_stops_sampling_and_counts_down(settings: TraceSettings) -> None:
    settings.update({"trace_count": "2"})
    assert [take(settings, "m") for _ in range(4)] == [True, True, False, False]
    assert settings.get()["trace_count"] == "0"


def test_trace_level_off_samples_nothing(settings: TraceSettings) -> None:
    settings.update({"trace_level": ["OFF"]})
    assert not take(settings, "m")
    assert not settings.enabled("m")


def test_a_model_override_has_its_own_counters(settings: TraceSettings) -> None:
    settings.update({"trace_rate": "2"})
    settings.update({"trace_count": "1"}, "counted")
    settings.update({"trace_level": ["OFF"]}, "silent")
    assert not take(settings, "silent")
    # "counted" shares the global rate counter but has a count of its own.
    assert [take(settings, "counted") for _ in range(4)] == [False, True, False, False]
    assert settings.get("counted")["trace_count"] == "0"
    assert settings.get()["trace_count"] == "-1"
    settings.update({"trace_count": None}, "counted")
    assert not take(settings, "other") and take(settings, "counted")


def test_a_front_ends_uses_are_told_and_counted_where_the_count_is_kept(
    settings: TraceSettings,
) -> None:
    """A front end tells the scope each traced request used up (`on_use`); the engine's
    settings count them there (`use`), never below 0, and only where a count is set."""
    told: list[str] = []
    settings.on_use = told.append
    settings.update({"trace_count": "5"})
    settings.update({"trace_count": "1"}, "counted")
    assert take(settings, "m") and take(settings, "counted") and not take(settings, "counted")
    assert told == ["", "counted"]
    settings.update({"trace_count": "-1"})
    assert take(settings, "m") and told == ["", "counted"]  # unlimited: nothing to tell

    engine = TraceSettings(level=("TIMESTAMPS",), rate=1)
    engine.update({"trace_count": "1"})
    engine.update({"trace_count": "2"}, "counted")
    assert [engine.use(""), engine.use(""), engine.use("counted")] == [0, 0, 1]
    assert engine.use("uncounted") is None
    engine.update({"trace_rate": "3"}, "rated")  # an override without a count of its own
    assert engine.use("rated") is None
    assert engine.get()["trace_count"] == "0" and engine.get("counted")["trace_count"] == "1"


def test_what_the_engine_says_is_left_never_raises_a_front_ends_count(
    settings: TraceSettings,
) -> None:
    """Two traces used here before the engine's answer to the first arrives: its "1 left"
    must not give this front end a third."""
    settings.update({"trace_count": "2"})
    assert take(settings, "m") and take(settings, "m")
    settings.count_left("", 1)
    assert not take(settings, "m") and settings.get()["trace_count"] == "0"
    settings.update({"trace_count": "5"})  # a POST raises it: that is an update, not a count
    settings.count_left("", 3)
    assert settings.get()["trace_count"] == "3"
    settings.count_left("nobody", 0)  # a scope this front end does not count in: nothing
    assert "nobody" not in settings.snapshot()[1]


def test_a_front_end_that_joins_takes_the_settings_in_force(settings: TraceSettings) -> None:
    settings.update({"trace_count": "0", "trace_rate": "7"})
    settings.update({"trace_level": ["OFF"]}, "quiet")
    joining = TraceSettings(level=("TIMESTAMPS",), rate=1, exporter=EXPORTER)  # its own env
    joining.restore(settings.snapshot())
    assert joining.get() == settings.get() and joining.get("quiet") == settings.get("quiet")
    assert not take(joining, "m") and not take(joining, "quiet")


def test_changing_the_rate_starts_counting_again(settings: TraceSettings) -> None:
    settings.update({"trace_rate": "3"})
    assert [take(settings, "m") for _ in range(2)] == [False, False]
    settings.update({"trace_rate": "2"})
    assert [take(settings, "m") for _ in range(2)] == [False, True]


def test_grpc_values_become_json_values() -> None:
    assert from_grpc(
        {"trace_level": ["TIMESTAMPS", "TENSORS"], "trace_rate": ["3"], "trace_count": []}
    ) == {"trace_level": ["TIMESTAMPS", "TENSORS"], "trace_rate": "3", "trace_count": None}
    with pytest.raises(TritonError, match=r"^expect only 1 value for 'trace_rate'$"):
        from_grpc({"trace_rate": ["1", "2"]})


@pytest.mark.parametrize(
    ("environ", "url"),
    [
        ({}, ""),  # no exporter: nothing is traced
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"}, "http://c:4318/v1/traces"),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
            "http://c:4317",
        ),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:1/x"}, "http://t:1/x"),
        ({"OTEL_TRACES_EXPORTER": "OTLP"}, "http://localhost:4318/v1/traces"),
        ({"OTEL_TRACES_EXPORTER": "console", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, ""),
    ],
)
def test_the_url_is_where_the_otlp_exporter_sends(environ: dict[str, str], url: str) -> None:
    settings = exporter_settings(environ)
    assert settings["url"] == url
    assert list(settings) == list(EXPORTER)  # Triton's order


def test_bad_batch_settings_are_shown_as_the_defaults_in_force() -> None:
    settings = exporter_settings({"OTEL_BSP_SCHEDULE_DELAY": "abc"})
    assert settings["bsp_schedule_delay"] == "5000"
