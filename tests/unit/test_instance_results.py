"""The instance actor with results that are not answered when execute returns: a Deferred (the
backend answers later, from any thread, while the instance runs its next batch) and RESCHEDULE
(the request goes back to the scheduler, before the instance says it is idle)."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from typing import Any

import anyio
import numpy as np
import pytest

from tritonactor.actors import Actor, ActorSystem, Reply
from tritonactor.backends.base import RESCHEDULE, BackendInstance, Deferred, Result
from tritonactor.core.errors import TritonError, unavailable
from tritonactor.core.types import InferenceRequest, InferenceResponse, Tensor
from tritonactor.scheduling.instance import InstanceActor
from tritonactor.scheduling.messages import Execute, Infer, InstanceIdle, Rescheduled
from tritonactor.scheduling.statistics import VersionStatistics

pytestmark = pytest.mark.anyio

PATIENCE_S = 60


@pytest.fixture
async def system() -> AsyncIterator[ActorSystem]:
    async with ActorSystem() as actors:
        yield actors


class Scheduler(Actor[Any]):
    """Stands in for a scheduler: records what it hears, in order."""

    def __init__(self) -> None:
        super().__init__("scheduler")
        self.heard: list[Any] = []
        self.changed = anyio.Event()

    async def receive(self, message: Any) -> None:
        self.heard.append(message)
        self.changed.set()
        self.changed = anyio.Event()

    async def until(self, count: int) -> list[Any]:
        with anyio.fail_after(PATIENCE_S):
            while len(self.heard) < count:
                await self.changed.wait()
        return self.heard


class Scripted(BackendInstance):
    """Answers each request as its `kind` input says: now, deferred, rescheduled or failed."""

    def __init__(self) -> None:
        self.deferred: list[Deferred] = []

    def execute(self, requests: list[InferenceRequest]) -> list[Result]:
        results: list[Result] = []
        for request in requests:
            kind = request.id
            if kind == "now":
                results.append(InferenceResponse("m", "1", id=kind))
            elif kind == "later":
                deferred = Deferred()
                self.deferred.append(deferred)
                results.append(deferred)
            elif kind == "again":
                results.append(RESCHEDULE)
            else:
                results.append(unavailable("no"))
        return results


def item(kind: str) -> Infer:
    data = np.zeros((1,), dtype=np.int32)
    request = InferenceRequest("m", id=kind, inputs=[Tensor("IN", "INT32", (1,), data)])
    return Infer(request, Reply())


async def test_deferred_answer_comes_from_another_thread_after_the_batch(
    system: ActorSystem,
) -> None:
    probe = Scheduler()
    scheduler = await system.spawn(probe)
    backend = Scripted()
    stats = VersionStatistics(batching=False)
    instance = await system.spawn(InstanceActor("m_0", backend, scheduler, stats))
    await probe.until(1)  # idle at start
    later, now = item("later"), item("now")
    await instance.tell(Execute([later, now]))
    with anyio.fail_after(PATIENCE_S):
        assert (await now.reply.wait()).id == "now"
    heard = await probe.until(2)
    assert isinstance(heard[1], InstanceIdle)  # idle again while `later` is outstanding
    assert not later.reply.done
    # In its batch at once; a success only once its answer comes.
    assert stats.success.count == 1 and stats.execution_count == 1
    assert [b.batch_size for b in stats.batch_stats] == [2]
    answer = InferenceResponse("m", "1", id="late")
    thread = threading.Thread(target=backend.deferred[0].resolve, args=(answer,))
    thread.start()
    with anyio.fail_after(PATIENCE_S):
        assert await later.reply.wait() is answer
    thread.join()
    assert backend.deferred[0].resolve(InferenceResponse("m", "1")) is False  # once only
    assert stats.success.count == 2 and stats.execution_count == 1
    assert stats.queue.count == stats.compute_infer.count == 2


async def test_deferred_error_fails_the_request(system: ActorSystem) -> None:
    probe = Scheduler()
    scheduler = await system.spawn(probe)
    backend = Scripted()
    stats = VersionStatistics(batching=False)
    instance = await system.spawn(InstanceActor("m_0", backend, scheduler, stats))
    later = item("later")
    stats.admit(later.request, later.reply, later.arrival_ns)  # as the router does
    await instance.tell(Execute([later]))
    await probe.until(2)
    backend.deferred[0].resolve(unavailable("the process died"))
    with anyio.fail_after(PATIENCE_S), pytest.raises(TritonError, match="the process died"):
        await later.reply.wait()
    # A failure of the backend, counted once, and no success.
    assert stats.success.count == 0 and stats.fail.count == 1
    assert stats.failures() == {"REJECTED": 0, "CANCELED": 0, "BACKEND": 1, "OTHER": 0}
    assert stats.pending == 0


async def test_rescheduled_request_goes_back_before_idle(system: ActorSystem) -> None:
    probe = Scheduler()
    scheduler = await system.spawn(probe)
    stats = VersionStatistics(batching=False)
    instance = await system.spawn(InstanceActor("m_0", Scripted(), scheduler, stats))
    again, now = item("again"), item("now")
    await instance.tell(Execute([again, now]))
    heard = await probe.until(3)
    assert isinstance(heard[1], Rescheduled) and heard[1].item is again
    assert isinstance(heard[2], InstanceIdle)
    assert not again.reply.done  # the scheduler answers it, once it ran to its end
    assert (await now.reply.wait()).id == "now"
    # Only the request that finished counts.
    assert stats.success.count == 1 and stats.execution_count == 1


async def test_batch_of_only_a_rescheduled_request_counts_nothing(system: ActorSystem) -> None:
    probe = Scheduler()
    scheduler = await system.spawn(probe)
    stats = VersionStatistics(batching=False)
    instance = await system.spawn(InstanceActor("m_0", Scripted(), scheduler, stats))
    await instance.tell(Execute([item("again")]))
    await probe.until(3)
    assert stats.success.count == stats.fail.count == stats.execution_count == 0
