"""The metrics in-process: failures by Triton's reason and the first-response histogram as the
statistics keep them, the collector's families read back with prometheus_client's own parser,
the /proc readings, the HTTP route and the metrics listener."""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import httpx
import numpy as np
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette

from tests.unit.test_scheduling import EchoBackend, context, request
from tritonactor.actors import Actor, ActorStopped, ActorSystem, Reply
from tritonactor.control import events as ev
from tritonactor.control.journal import open_journal
from tritonactor.core.errors import TritonError, cancelled, internal, invalid_arg, unavailable
from tritonactor.core.types import InferenceRequest, InferenceResponse, ResponseSender, Tensor
from tritonactor.observability.endpoint import (
    JournalTally,
    ServerMetrics,
    metrics_listener,
    metrics_route,
)
from tritonactor.observability.exposition import CONTENT_TYPE, render
from tritonactor.observability.gpu import GpuMetrics
from tritonactor.observability.host import CpuUsage, read_memory
from tritonactor.observability.metrics import MetricsCollector
from tritonactor.scheduling.first_response import (
    FIRST_RESPONSE_BUCKETS_MS,
    FirstResponseHistogram,
)
from tritonactor.scheduling.messages import Infer
from tritonactor.scheduling.model import ModelVersionActor
from tritonactor.scheduling.router import ModelHandle
from tritonactor.scheduling.sequence import NULL_REQUEST
from tritonactor.scheduling.signature import ModelSignature
from tritonactor.scheduling.statistics import ExecutionTimes, VersionStatistics
from tritonactor.server import Server
from tritonactor.settings import Settings

pytestmark = pytest.mark.anyio


@pytest.fixture
async def system() -> AsyncIterator[ActorSystem]:
    async with ActorSystem() as actors:
        yield actors


# Bounds a wait for an event that is bound to happen: reached only when something is broken.
WAIT = 30

OK = InferenceResponse("echo", "1")
TIMES = ExecutionTimes(started=1_000, backend_started=1_100, backend_finished=1_600, answered=1_650)


def answered(stats: VersionStatistics, error: BaseException | None = None) -> None:
    """A request routed to `stats` and answered (with `error`: failed)."""
    reply: Reply[Any] = Reply()
    stats.admit(request(1), reply, time.perf_counter_ns())
    if error is None:
        reply.set(OK)
    else:
        reply.fail(error)


def executed(stats: VersionStatistics, results: list[Any], arrival_ns: int = 900) -> None:
    """One execute, its requests answered first as an instance answers them."""
    batch = []
    for result in results:
        reply: Reply[Any] = Reply()
        item = Infer(request(1), reply, arrival_ns)
        stats.admit(item.request, reply, arrival_ns)
        batch.append(item)
        if isinstance(result, BaseException):
            reply.fail(result)
        else:
            reply.set(result)
    stats.record_execution(batch, results, TIMES)


# -- failures by reason ----------------------------------------------------------------------------


def test_failures_are_counted_by_triton_reason() -> None:
    stats = VersionStatistics(batching=False)
    answered(stats, unavailable("Exceeds maximum queue size"))
    answered(stats, unavailable("Request timeout expired"))
    answered(stats, ActorStopped("actor 'echo' stopped before answering"))
    answered(stats, cancelled("request for model 'echo' was cancelled"))
    answered(stats, invalid_arg("sequence batching needs a correlation ID"))
    answered(stats)
    assert stats.failures() == {"REJECTED": 3, "CANCELED": 1, "BACKEND": 0, "OTHER": 1}
    assert stats.pending == 0
    # The statistics extension counts each one too, as Triton's (one count for both).
    assert (stats.fail.count, stats.success.count) == (5, 0)


def test_a_failed_execute_is_backend_whatever_its_error_says() -> None:
    stats = VersionStatistics(batching=False)
    # A dead instance answers UNAVAILABLE, a backend may answer any code: all BACKEND.
    executed(stats, [internal("boom"), unavailable("instance died"), invalid_arg("bad shape"), OK])
    assert stats.failures() == {"REJECTED": 0, "CANCELED": 0, "BACKEND": 3, "OTHER": 0}
    assert (stats.success.count, stats.fail.count) == (1, 3)


def test_an_answer_held_after_its_execute_never_makes_a_counter_go_down() -> None:
    # With preserve_ordering a failed request's answer may go out after its execute is
    # recorded: meanwhile its failure is BACKEND and nothing else moves back.
    stats = VersionStatistics(batching=False)
    answered(stats, unavailable("Request timeout expired"))
    assert stats.failures()["REJECTED"] == 1
    error = unavailable("instance died")
    stats.record_execution([Infer(request(1), Reply(), 900)], [error], TIMES)
    assert stats.failures() == {"REJECTED": 1, "CANCELED": 0, "BACKEND": 1, "OTHER": 0}
    answered(stats, error)  # the held answer goes out
    assert stats.failures() == {"REJECTED": 1, "CANCELED": 0, "BACKEND": 1, "OTHER": 0}


def test_the_sequence_batchers_null_requests_count_nowhere() -> None:
    stats = VersionStatistics(batching=True)
    null = request(0)
    null.context[NULL_REQUEST] = True
    real = Infer(request(1), Reply(), 900)
    stats.record_execution([real, Infer(null, Reply(), 900)], [OK, OK], TIMES)
    assert (stats.success.count, stats.inference_count, stats.execution_count) == (1, 1, 1)
    assert [b.batch_size for b in stats.batch_stats] == [1]
    assert sum(stats.first_response.sample().counts) == 1


# -- the first-response histogram ------------------------------------------------------------------


def test_first_responses_fall_in_tritons_buckets() -> None:
    histogram = FirstResponseHistogram()
    assert histogram.bounds_ms == FIRST_RESPONSE_BUCKETS_MS == (100.0, 500.0, 2000.0, 5000.0)
    for ms in (0.2, 100, 100.5, 499, 6000):
        histogram.observe_ns(int(ms * 1e6))
    sample = histogram.sample()
    assert sample.counts == (2, 2, 0, 0, 1)  # a bound belongs to its own bucket (le)
    assert sample.total == pytest.approx(0.2 + 100 + 100.5 + 499 + 6000)


def test_a_request_answered_at_once_is_timed_from_arrival_to_answer() -> None:
    stats = VersionStatistics(batching=False)
    executed(stats, [OK, internal("no")], arrival_ns=650)  # answered at 1_650: 1 µs later
    sample = stats.first_response.sample()
    assert sample.counts[0] == 1 and sum(sample.counts) == 1  # the failure has no response
    assert sample.total == pytest.approx(0.001)


def test_a_decoupled_request_is_timed_at_its_first_response() -> None:
    stats = VersionStatistics(batching=False)
    delivered: list[tuple[Any, Any, bool]] = []
    inner = ResponseSender(
        lambda response, error, final: delivered.append((response, error, final))
    )
    req = InferenceRequest("echo", sender=inner)
    reply: Reply[Any] = Reply()
    stats.admit(req, reply, arrival_ns=0)
    assert stats.pending == 1
    sender = req.sender
    assert sender is not None and sender is not inner
    sender.send(OK)
    sender.send(OK)
    sender.send(final=True)
    assert delivered == [(OK, None, False), (OK, None, False), (None, None, True)]
    assert inner.finished
    assert sum(stats.first_response.sample().counts) == 1  # the first one only
    req.cancel()
    assert inner.is_cancelled() and sender.is_cancelled()
    reply.set(None)  # type: ignore[arg-type]
    assert stats.pending == 0
    # The execute of a decoupled request does not time it again.
    stats.record_execution([Infer(req, reply, 0)], [None], TIMES)
    assert sum(stats.first_response.sample().counts) == 1


# -- the collector, through a real model -----------------------------------------------------------


def families(text: str) -> dict[str, Any]:
    return {family.name: family for family in text_string_to_metric_families(text)}


def value(found: dict[str, Any], family: str, sample: str | None = None, **labels: str) -> float:
    for item in found[family].samples:
        if (sample is None or item.name == sample) and all(
            item.labels.get(k) == v for k, v in labels.items()
        ):
            return item.value
    raise KeyError(f"{family}{labels}")


def settings(tmp_path: Path, **changes: Any) -> Settings:
    repository = tmp_path / "models"
    repository.mkdir(exist_ok=True)
    return Settings(model_repositories=(repository,), journal=tmp_path / "journal.jsonl", **changes)


class _Owner(Actor[Any]):
    """Stands in for the model manager: the parent of one model-version actor."""

    def __init__(self, child: Actor[Any]) -> None:
        super().__init__("model-manager")
        self._child = child

    async def started(self) -> None:
        await self.spawn(self._child)

    async def receive(self, message: Any) -> None:
        pass


async def serving_server(system: ActorSystem, tmp_path: Path, **changes: Any) -> Server:
    """A Server (not started: no repository scan) whose router serves a real echo model."""
    server = Server(settings(tmp_path, **changes))
    server.journal, _ = open_journal(server.settings.journal)
    ctx = context(1)
    actor = ModelVersionActor(EchoBackend(), ctx)
    owner = _Owner(actor)
    # The manager's place in the tree: the mailbox gauges walk down from it.
    server._manager = await system.spawn(owner)
    assert actor.scheduler is not None
    signature = ModelSignature.from_config(ctx.config)
    server.router.known.add("echo")
    server.router.add(
        ModelHandle("echo", 1, ctx.config, signature, actor.scheduler, actor.statistics)
    )
    server.journal.append(ev.ModelLoaded(model="echo", version=1, load_seconds=0.25))
    server.journal.append(ev.ModelLoaded(model="gone", version=1, load_seconds=9.0))
    return server


async def test_the_collector_reports_what_the_model_served(
    system: ActorSystem, tmp_path: Path
) -> None:
    server = await serving_server(system, tmp_path)
    metrics = ServerMetrics(server)
    before = families((await metrics.render()).decode())
    for v in range(3):
        await server.router.infer(request(v))
    data = np.ones((2, 2), dtype=np.int32)
    await server.router.infer(
        InferenceRequest("echo", inputs=[Tensor("IN", "INT32", (2, 2), data)])
    )
    with pytest.raises(TritonError, match="negative input"):
        await server.router.infer(request(-5))
    after = families((await metrics.render()).decode())

    labels = {"model": "echo", "version": "1"}
    for family, moved in (
        ("nv_inference_request_success", 4),
        ("nv_inference_count", 5),
        ("nv_inference_exec_count", 4),
        ("nv_inference_first_response_histogram_ms", 4),
    ):
        sample = f"{family}_count" if family.endswith("_ms") else None
        assert (
            value(after, family, sample, **labels) - value(before, family, sample, **labels)
            == moved
        )
    failures = {
        r: value(after, "nv_inference_request_failure", reason=r)
        for r in ("REJECTED", "CANCELED", "BACKEND", "OTHER")
    }
    assert failures == {"REJECTED": 0, "CANCELED": 0, "BACKEND": 1, "OTHER": 0}
    assert value(after, "nv_inference_request_duration_us", **labels) > 0
    assert value(after, "nv_inference_pending_request_count", **labels) == 0
    assert value(after, "tritonactor_inference_batch_executions", batch_size="1") == 3
    assert value(after, "tritonactor_inference_batch_executions", batch_size="2") == 1
    # Types and names as Triton's (the parser names a counter's samples <family>_total).
    assert after["nv_inference_request_success"].type == "counter"
    assert after["nv_inference_pending_request_count"].type == "gauge"
    assert after["nv_inference_first_response_histogram_ms"].type == "histogram"
    # Loaded versions only, from the journal; and the journal's events by type.
    assert [s.labels["model"] for s in after["nv_model_load_duration_secs"].samples] == ["echo"]
    assert value(after, "nv_model_load_duration_secs", **labels) == 0.25
    assert value(after, "tritonactor_journal_events", type="ModelLoaded") == 2
    assert value(after, "tritonactor_actor_mailbox_depth", actor="scheduler", **labels) == 0
    assert value(after, "tritonactor_actor_mailbox_depth", actor="version", **labels) == 0
    assert value(after, "tritonactor_actor_mailbox_depth", actor="model-manager") == 0
    assert 0.0 <= value(after, "nv_cpu_utilization") <= 1.0
    assert value(after, "nv_cpu_memory_total_bytes") >= value(after, "nv_cpu_memory_used_bytes") > 0
    assert value(after, "process_resident_memory_bytes") > 0
    assert not any(name.startswith("nv_gpu") for name in after)  # no NVML on this machine


async def test_a_cancelled_request_is_canceled(system: ActorSystem, tmp_path: Path) -> None:
    # One instance held by the first request; the second, cancelled while it waits, never runs.
    backend = EchoBackend(barrier=threading.Barrier(2))
    assert backend.barrier is not None
    ctx = context(1)
    actor = ModelVersionActor(backend, ctx)
    await system.spawn(actor)
    assert actor.scheduler is not None
    server = Server(settings(tmp_path))
    signature = ModelSignature.from_config(ctx.config)
    server.router.add(
        ModelHandle("echo", 1, ctx.config, signature, actor.scheduler, actor.statistics)
    )
    first = server.router.submit(request(1))
    waiting = request(2)
    second = server.router.submit(waiting)
    waiting.cancel()
    await anyio.to_thread.run_sync(backend.barrier.wait, WAIT)
    with anyio.fail_after(WAIT):
        await first.wait()
        with pytest.raises(TritonError, match="cancelled"):
            await second.wait()
    found = families((await ServerMetrics(server).render()).decode())
    assert value(found, "nv_inference_request_failure", reason="CANCELED") == 1
    assert value(found, "nv_inference_request_success", model="echo") == 1


async def test_the_journal_is_read_a_page_at_a_time_from_where_it_stopped(tmp_path: Path) -> None:
    journal, _ = open_journal(tmp_path / "journal.jsonl")
    tally = JournalTally()
    tally.PAGE = 2
    for version in (1, 2, 3):
        journal.append(ev.ModelLoaded(model="m", version=version, load_seconds=float(version)))
    tally.catch_up(journal)
    journal.append(ev.ModelLoaded(model="m", version=1, load_seconds=7.0))
    journal.append(ev.ModelUnloaded(model="m", version=2))
    tally.catch_up(journal)
    assert tally.counts == {"ModelLoaded": 4, "ModelUnloaded": 1}
    assert tally.load_seconds == {("m", 1): 7.0, ("m", 2): 2.0, ("m", 3): 3.0}
    journal.close()


# -- the text format -------------------------------------------------------------------------------


def test_counters_keep_tritons_names_and_labels_are_escaped() -> None:
    class Source:
        def versions(self) -> list[Any]:
            stats = VersionStatistics(batching=False)
            return [stats.sample('we"ird\nname', 3)]

        def load_seconds(self) -> dict[tuple[str, int], float]:
            return {}

        def journal_events(self) -> dict[str, int]:
            return {"ServerStarted": 1}

        def mailboxes(self) -> list[Any]:
            return []

    registry = CollectorRegistry(auto_describe=False)
    registry.register(MetricsCollector(Source()))
    text = render(registry).decode()
    assert "# TYPE nv_inference_request_success counter\n" in text
    assert "# TYPE tritonactor_journal_events_total counter\n" in text
    assert 'nv_inference_request_success{model="we\\"ird\\nname",version="3"} 0\n' in text
    found = families(text)
    assert value(found, "nv_inference_request_success", model='we"ird\nname') == 0
    assert value(found, "tritonactor_journal_events", type="ServerStarted") == 1


@pytest.mark.parametrize(
    ("value", "written"),
    [
        (4.0, "4"),
        (3001479.0, "3001479"),
        (25276182528.0, "25276182528"),
        (0.25, "0.25"),
        (0.1, "0.1"),
        (1e20, "1e+20"),
        (1e-5, "1e-05"),
        (float("inf"), "+Inf"),
        (float("nan"), "NaN"),
    ],
)
def test_values_are_written_as_tritons_prometheus_library_writes_them(
    value: float, written: str
) -> None:
    class One:
        def collect(self) -> list[Any]:
            family = GaugeMetricFamily("nv_example", "an example")
            family.add_metric([], value)
            return [family]

    registry = CollectorRegistry(auto_describe=False)
    registry.register(One())  # type: ignore[arg-type]
    assert render(registry).decode().splitlines()[-1] == f"nv_example {written}"


# -- /proc and NVML --------------------------------------------------------------------------------


def test_cpu_utilization_is_the_busy_share_between_two_readings(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 100 700 100 0 0 0 0 0\ncpu0 1 2 3 4\n")
    usage = CpuUsage(tmp_path)
    # 400 more ticks, 100 of them idle or waiting on I/O.
    stat.write_text("cpu  300 0 200 750 150 0 0 0 0 0\n")
    assert usage.utilization() == pytest.approx(0.75)
    assert usage.utilization() == 0.0  # nothing moved
    stat.unlink()
    assert usage.utilization() is None


def test_memory_in_use_is_what_is_not_available(tmp_path: Path) -> None:
    (tmp_path / "meminfo").write_text(
        "MemTotal:       1000 kB\nMemFree:         100 kB\nMemAvailable:    600 kB\n"
    )
    assert read_memory(tmp_path) == (1000 * 1024, 400 * 1024)
    assert read_memory(tmp_path / "nowhere") is None


def test_without_pynvml_there_are_no_gpu_metrics() -> None:
    try:
        import pynvml  # noqa: F401
    except ImportError:
        assert GpuMetrics.open() is None
    else:
        pytest.skip("pynvml is installed here")


def test_nvml_readings_become_tritons_gpu_metrics() -> None:
    # No GPU on this machine: a stand-in for pynvml's functions, to check units and labels.
    class Unsupported(Exception):
        pass

    class FakeNvml:
        energy = 5_000

        def nvmlInit(self) -> None: ...

        def nvmlShutdown(self) -> None: ...

        def nvmlDeviceGetCount(self) -> int:
            return 1

        def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
            return "h0"

        def nvmlDeviceGetUUID(self, handle: str) -> bytes:
            return b"GPU-0000"

        def nvmlDeviceGetUtilizationRates(self, handle: str) -> Any:
            return SimpleNamespace(gpu=42)

        def nvmlDeviceGetMemoryInfo(self, handle: str) -> Any:
            return SimpleNamespace(total=80, used=20)

        def nvmlDeviceGetPowerUsage(self, handle: str) -> int:
            return 150_500  # milliwatts

        def nvmlDeviceGetEnforcedPowerLimit(self, handle: str) -> int:
            raise Unsupported

        def nvmlDeviceGetTotalEnergyConsumption(self, handle: str) -> int:
            return self.energy  # millijoules

    nvml = FakeNvml()
    gpu = GpuMetrics.open(nvml)
    assert gpu is not None
    nvml.energy = 8_000
    found = {family.name: family.samples for family in gpu.collect()}
    assert found["nv_gpu_utilization"][0].value == 0.42
    assert found["nv_gpu_utilization"][0].labels == {"gpu_uuid": "GPU-0000"}
    assert found["nv_gpu_memory_total_bytes"][0].value == 80
    assert found["nv_gpu_memory_used_bytes"][0].value == 20
    assert found["nv_gpu_power_usage"][0].value == 150.5
    assert found["nv_gpu_power_limit"] == []  # unsupported: left out, no error
    assert found["nv_energy_consumption"][0].value == 3.0  # joules since the server started


# -- serving ---------------------------------------------------------------------------------------


async def test_the_http_route_serves_the_text_format(system: ActorSystem, tmp_path: Path) -> None:
    server = await serving_server(system, tmp_path)
    app = Starlette(routes=[metrics_route(server)])
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://t"
    ) as client:
        response = await client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"] == CONTENT_TYPE
    assert "nv_inference_request_success" in families(response.text)


async def test_the_http_route_is_not_found_when_metrics_are_disabled(tmp_path: Path) -> None:
    server = Server(settings(tmp_path, metrics_enabled=False))
    app = Starlette(routes=[metrics_route(server)])
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://t"
    ) as client:
        assert (await client.get("/metrics")).status_code == 404


async def test_the_listener_answers_on_the_port_the_os_chose(
    system: ActorSystem, tmp_path: Path
) -> None:
    server = await serving_server(system, tmp_path, metrics_host="127.0.0.1", metrics_port=0)
    async with metrics_listener(server) as port, httpx.AsyncClient() as client:
        assert port
        base = f"http://127.0.0.1:{port}"
        response = await client.get(f"{base}/metrics")
        assert response.status_code == 200
        assert response.headers["content-type"] == CONTENT_TYPE
        assert value(families(response.text), "nv_inference_request_success", model="echo") == 0
        assert (await client.get(f"{base}/")).status_code == 404
        assert (await client.post(f"{base}/metrics")).status_code == 405
        with anyio.fail_after(WAIT):
            stream = await anyio.connect_tcp("127.0.0.1", port)
            await stream.send(b"nonsense\r\n\r\n")
            assert (await stream.receive()).startswith(b"HTTP/1.1 400 ")
            await stream.aclose()
    with pytest.raises(OSError):
        await anyio.connect_tcp("127.0.0.1", port)


async def test_no_listener_when_metrics_are_disabled(tmp_path: Path) -> None:
    server = Server(settings(tmp_path, metrics_enabled=False))
    async with metrics_listener(server) as port:
        assert port is None
