"""The statistics extension in-process: the accumulator's arithmetic, the selection of versions
(with Triton's errors), and what instance actors record for batches of one and of many."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import numpy as np
import pytest

from tests.unit.test_scheduling import EchoBackend, EchoInstance, context, request
from tritonactor.actors import Actor, ActorSystem, Reply
from tritonactor.backends.base import Result
from tritonactor.core.errors import ErrorCode, TritonError, internal
from tritonactor.core.types import InferenceRequest, InferenceResponse, Tensor
from tritonactor.scheduling.instance import InstanceActor
from tritonactor.scheduling.messages import Execute, Infer
from tritonactor.scheduling.model import ModelVersionActor
from tritonactor.scheduling.router import ModelHandle, Router
from tritonactor.scheduling.signature import ModelSignature
from tritonactor.scheduling.statistics import ExecutionTimes, VersionStatistics
from tritonactor.scheduling.step_times import ENSEMBLE_TIMES, STEP_TIMES, StepTimes

pytestmark = pytest.mark.anyio


@pytest.fixture
async def system() -> AsyncIterator[ActorSystem]:
    async with ActorSystem() as actors:
        yield actors


def batched(batch_size: int, value: int = 1) -> InferenceRequest:
    data = np.full((batch_size, 2), value, dtype=np.int32)
    return InferenceRequest("echo", inputs=[Tensor("IN", "INT32", data.shape, data)])


def infer(req: InferenceRequest, arrival_ns: int) -> Infer:
    return Infer(req, Reply(), arrival_ns)


OK = InferenceResponse("echo", "1")
TIMES = ExecutionTimes(started=1_000, backend_started=1_100, backend_finished=1_600, answered=1_650)


def durations(stats: VersionStatistics) -> dict[str, tuple[int, int]]:
    return {name: (d.count, d.ns) for name, d in stats.inference_stats().items()}


# -- the accumulator ----------------------------------------------------------------------------


def admitted(stats: VersionStatistics, item: Infer, result: object) -> None:
    """`item` routed to `stats` and answered with `result`, as an instance answers it before
    it accounts for the execute (a failure counts as its reply fails)."""
    stats.admit(item.request, item.reply, time.perf_counter_ns())
    if isinstance(result, TritonError):
        item.reply.fail(result)
    else:
        item.reply.set(result)  # type: ignore[arg-type]


def test_a_batch_with_a_failure_counts_each_request_and_the_execution_once() -> None:
    stats = VersionStatistics(batching=True)
    batch = [infer(batched(2), 900), infer(batched(3), 950), infer(batched(1), 800)]
    results = [OK, internal("no"), OK]
    for item, result in zip(batch, results, strict=True):
        admitted(stats, item, result)
    stats.record_execution(batch, results, TIMES)

    fail = durations(stats).pop("fail")
    assert fail[0] == 1  # (timed by its reply)
    assert durations(stats) | {"fail": fail} == {
        "success": (2, (1_650 - 900) + (1_650 - 800)),
        "fail": fail,
        "queue": (2, (1_000 - 900) + (1_000 - 800)),
        "compute_input": (2, 2 * 100),
        "compute_infer": (2, 2 * 500),
        "compute_output": (2, 2 * 50),
        "cache_hit": (0, 0),
        "cache_miss": (0, 0),
    }
    # The execution as Triton reports a batch: its whole batch size (2 + 3 + 1).
    assert stats.execution_count == 1
    assert stats.inference_count == 6
    [entry] = stats.batch_stats
    assert entry.batch_size == 6
    assert (entry.compute_input.count, entry.compute_input.ns) == (1, 100)
    assert (entry.compute_infer.count, entry.compute_infer.ns) == (1, 500)
    assert (entry.compute_output.count, entry.compute_output.ns) == (1, 50)
    assert stats.last_inference_ms > 1_600_000_000_000  # wall clock, ms since the epoch


def test_an_ensemble_counts_its_successful_steps_compute_times() -> None:
    """As Triton's ensembles: each step request that succeeds adds its batch's compute times to
    its ensemble request's; the ensemble's own are their sums, its queue its own wait."""
    sums = StepTimes()
    other = StepTimes()
    step = VersionStatistics(batching=True)
    batch = [infer(batched(1), 900), infer(batched(1), 950)]
    batch[0].request.context[STEP_TIMES] = sums
    batch[1].request.context[STEP_TIMES] = other  # another ensemble request's step
    results = [OK, internal("no")]
    for item, result in zip(batch, results, strict=True):
        admitted(step, item, result)
    step.record_execution(batch, results, TIMES)
    assert sums.compute == [100, 500, 50]
    assert other.compute == [0, 0, 0]  # it failed: nothing added
    step.record_execution([infer(batched(1), 900)], [OK], TIMES)  # not a step: nothing added
    assert sums.compute == [100, 500, 50]

    ensemble = VersionStatistics(batching=True, counted_when_answered=True)
    request = batched(2)
    reply: Reply[InferenceResponse] = Reply()
    arrival = time.perf_counter_ns()
    ensemble.admit(request, reply, arrival)
    request.context[ENSEMBLE_TIMES] = (arrival + 7_000, sums)
    reply.set(OK)
    assert durations(ensemble)["queue"] == (1, 7_000)
    assert durations(ensemble)["compute_input"] == (1, 100)
    assert durations(ensemble)["compute_infer"] == (1, 500)
    assert durations(ensemble)["compute_output"] == (1, 50)
    [entry] = ensemble.batch_stats
    assert (entry.batch_size, entry.compute_infer.ns) == (2, 500)


async def test_an_ensemble_waits_for_a_step_whose_execute_outlasts_its_answer() -> None:
    """A decoupled step may send its last response and go on executing: the ensemble answers
    its client then, and counts the request once the step's execute is over, with its times
    (as Triton reports an ensemble request once every step request is released)."""
    sums = StepTimes()
    step_reply: Reply[InferenceResponse] = Reply()
    sums.running(step_reply)
    ensemble = VersionStatistics(batching=False, counted_when_answered=True)
    request = batched(1)
    reply: Reply[InferenceResponse] = Reply()
    arrival = time.perf_counter_ns()
    ensemble.admit(request, reply, arrival)
    request.context[ENSEMBLE_TIMES] = (arrival, sums)
    reply.set(OK)  # the client has its answer
    assert ensemble.pending == 0
    assert durations(ensemble)["success"][0] == 0  # not counted yet: its step still runs
    step_reply.set(OK)  # the step's execute is over; its model counts it in the same turn
    sums.add(10, 4_000, 20)
    assert durations(ensemble)["success"][0] == 0
    await anyio.sleep(0)  # (the next turn of the loop)
    await anyio.sleep(0)
    assert durations(ensemble)["success"][0] == 1
    assert durations(ensemble)["compute_infer"] == (1, 4_000)


def test_a_batch_that_failed_entirely_is_no_execution() -> None:
    stats = VersionStatistics(batching=True)
    error = TritonError(ErrorCode.INTERNAL, "broken")
    batch = [infer(batched(2), 900), infer(batched(1), 1_000)]
    for item in batch:
        admitted(stats, item, error)
    stats.record_execution(batch, [error] * 2, TIMES)
    assert durations(stats)["fail"][0] == 2
    assert durations(stats)["success"] == (0, 0)
    assert durations(stats)["queue"] == (0, 0)
    assert stats.execution_count == stats.inference_count == stats.last_inference_ms == 0
    assert stats.batch_stats == []


def test_batch_sizes_accumulate_per_size_smallest_first() -> None:
    stats = VersionStatistics(batching=True)
    for size in (4, 1, 4):
        stats.record_execution([infer(batched(size), 900)], [OK], TIMES)
    assert [(b.batch_size, b.compute_infer.count) for b in stats.batch_stats] == [(1, 1), (4, 2)]
    assert stats.execution_count == 3
    assert stats.inference_count == 9


def test_without_batching_every_request_is_one_inference() -> None:
    stats = VersionStatistics(batching=False)
    stats.record_execution([infer(batched(5), 900), infer(batched(3), 900)], [OK, OK], TIMES)
    assert stats.inference_count == 2
    assert [b.batch_size for b in stats.batch_stats] == [2]


def test_queue_time_is_never_negative() -> None:
    stats = VersionStatistics(batching=False)
    stats.record_execution([infer(batched(1), 1_200)], [OK], TIMES)  # stamped after "started"
    assert durations(stats)["queue"] == (1, 0)


# -- which versions --------------------------------------------------------------------------


def router_with(*versions: int) -> Router:
    router = Router()
    router.known.update({"echo", "gone"})
    config = context(1).config
    for number in versions:
        handle = ModelHandle("echo", number, config, ModelSignature.from_config(config), None)  # type: ignore[arg-type]
        router.add(handle)
    alpha = ModelHandle("alpha", 2, config, ModelSignature.from_config(config), None)  # type: ignore[arg-type]
    router.add(alpha)
    return router


def test_select_every_version_of_every_model_by_name_then_version() -> None:
    router = router_with(3, 1)
    assert [(h.name, h.version) for h in router.select()] == [
        ("alpha", 2),
        ("echo", 1),
        ("echo", 3),
    ]
    assert [h.version for h in router.select("echo")] == [1, 3]
    assert [h.version for h in router.select("echo", "3")] == [3]


@pytest.mark.parametrize(
    ("name", "version", "message"),
    [
        ("nosuch", "", "requested model 'nosuch' is not available"),
        ("gone", "", "requested model 'gone' is not available"),  # known, nothing ready
        ("nosuch", "1", "requested model 'nosuch' is not available"),
        ("echo", "2", "requested model version is not available for model 'echo'"),
        (
            "echo",
            "abc",
            "failed to get model version from specified version string 'abc' (details: stol), "
            "version should be an integral value > 0",
        ),
        (
            "echo",
            "99999999999999999999",
            "failed to get model version from specified version string '99999999999999999999' "
            "(details: stol), version should be an integral value > 0",
        ),
        (
            "echo",
            "-1",
            "invalid model version specified '-1' , version should be an integral value > 0",
        ),
    ],
)
def test_select_refuses_what_is_not_ready_as_triton_does(
    name: str, version: str, message: str
) -> None:
    with pytest.raises(TritonError) as caught:
        router_with(1, 3).select(name, version)
    assert caught.value.code is ErrorCode.INVALID_ARG
    assert caught.value.message.startswith(message)


# -- recorded by the actors ------------------------------------------------------------------


async def test_requests_through_the_router_are_counted_once_they_ran(system: ActorSystem) -> None:
    ctx = context(2)
    actor = ModelVersionActor(EchoBackend(), ctx)
    await system.spawn(actor)
    assert actor.scheduler is not None
    router = Router()
    signature = ModelSignature.from_config(ctx.config)
    router.add(ModelHandle("echo", 1, ctx.config, signature, actor.scheduler, actor.statistics))
    stats = router.select("echo")[0].statistics
    assert stats is actor.statistics

    for value in range(5):
        await router.infer(request(value))
    await router.infer(batched(3))
    for _ in range(2):
        with pytest.raises(TritonError, match="negative input"):
            await router.infer(request(-1))
    with pytest.raises(TritonError, match="data-type"):  # refused by validation: never ran
        bad = request(1)
        bad.inputs[0] = Tensor("IN", "FP32", (1, 2), np.zeros((1, 2), np.float32))
        await router.infer(bad)

    assert stats.success.count == 6
    assert stats.fail.count == 2
    assert stats.inference_count == 5 + 3
    assert stats.execution_count == 6
    assert stats.queue.count == stats.compute_infer.count == 6
    assert stats.success.ns > 0 and stats.fail.ns > 0 and stats.queue.ns > 0
    assert stats.compute_infer.ns > 0
    # The parts of a request's time never add up to more than the whole.
    parts = stats.queue.ns + stats.compute_input.ns + stats.compute_infer.ns
    assert parts + stats.compute_output.ns <= stats.success.ns
    assert [(b.batch_size, b.compute_infer.count) for b in stats.batch_stats] == [(1, 5), (3, 1)]


class Scheduler(Actor[Any]):
    """Stands in for a scheduler: it only hears that the instance is idle."""

    def __init__(self) -> None:
        super().__init__("scheduler")
        self.idle = 0

    async def receive(self, message: Any) -> None:
        self.idle += 1


class AsyncEcho(EchoInstance):
    async def execute(self, requests: list[InferenceRequest]) -> list[Result]:  # type: ignore[override]
        return super().execute(requests)


class Exploding(EchoInstance):
    def execute(self, requests: list[InferenceRequest]) -> list[Result]:
        raise RuntimeError("boom")


@pytest.mark.parametrize("instance_type", [EchoInstance, AsyncEcho])
async def test_one_execute_of_many_requests_is_one_execution(
    system: ActorSystem, instance_type: type[EchoInstance]
) -> None:
    stats = VersionStatistics(batching=True)
    scheduler = await system.spawn(Scheduler())
    backend = EchoBackend()
    instance = await system.spawn(
        InstanceActor("echo_0", instance_type(backend, "echo_0"), scheduler, stats)
    )
    batch = [Infer(batched(1, value), Reply()) for value in (1, -1, 2)]
    batch.append(Infer(batched(2, 3), Reply()))
    for item in batch:  # (as the router admits each)
        stats.admit(item.request, item.reply, item.arrival_ns)
    await instance.tell(Execute(batch))
    for item in batch:
        if item is batch[1]:
            with pytest.raises(TritonError, match="negative input"):
                await item.reply.wait()
        else:
            await item.reply.wait()
    assert (stats.success.count, stats.fail.count) == (3, 1)
    assert stats.execution_count == 1
    assert stats.inference_count == 5
    assert [(b.batch_size, b.compute_infer.count) for b in stats.batch_stats] == [(5, 1)]
    assert stats.compute_infer.count == 3
    assert stats.compute_infer.ns == 3 * stats.batch_stats[0].compute_infer.ns > 0


async def test_a_backend_that_raises_fails_its_whole_batch(system: ActorSystem) -> None:
    stats = VersionStatistics(batching=True)
    scheduler = await system.spawn(Scheduler())
    instance = await system.spawn(
        InstanceActor("echo_0", Exploding(EchoBackend(), "echo_0"), scheduler, stats)
    )
    batch = [Infer(batched(1), Reply()), Infer(batched(1), Reply())]
    for item in batch:  # (as the router admits each)
        stats.admit(item.request, item.reply, item.arrival_ns)
    await instance.tell(Execute(batch))
    for item in batch:
        with pytest.raises(TritonError, match="boom"):
            await item.reply.wait()
    assert (stats.success.count, stats.fail.count) == (0, 2)
    assert stats.fail.ns > 0
    assert stats.execution_count == stats.compute_infer.count == 0
    assert stats.batch_stats == []
