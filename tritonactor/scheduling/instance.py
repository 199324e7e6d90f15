"""The instance actor: one `instance_group` instance, executing one batch at a time off the loop
(on its worker thread; a backend that allows it runs a batch on the loop itself when its last
execute was shorter than the hop to the thread, see ON_LOOP_NS).

Most requests are answered when their execute returns. Two kinds are not: a request the model
released with Triton's RESCHEDULE flag goes back to the scheduler (`Rescheduled`), and one whose
answer the backend gives later (`Deferred`, e.g. a python model answering through its response
sender after execute returned) is answered when that answer comes, while the instance already
runs its next batch.

An instance that can die on its own (`backends.lifetime.WatchedInstance`: a python model's
process) tells the actor when it dies, idle or not: the actor closes its mailbox at once (the
scheduler then hands its next batch to another instance, or keeps it queued) and fails, so that
its model-version actor replaces it without waiting for a request to meet the dead instance.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from time import perf_counter_ns
from typing import Any

import anyio

from tritonactor.actors import Actor, ActorRef, ActorStopped
from tritonactor.actors.loop import on_loop
from tritonactor.actors.worker import WorkerThread
from tritonactor.backends.base import (
    RESCHEDULE,
    BackendInstance,
    Deferred,
    InstanceDied,
    Result,
)
from tritonactor.backends.lifetime import BatchNotRun, WatchedInstance
from tritonactor.core.cork import cork
from tritonactor.core.errors import TritonError, internal, unavailable
from tritonactor.core.offload import OFF_LOOP_BYTES
from tritonactor.core.types import OUTPUTS_IN_PLACE, InferenceRequest, InferenceResponse
from tritonactor.observability.tracing import BatchTrace
from tritonactor.scheduling.messages import Execute, Infer, InstanceIdle, Rescheduled
from tritonactor.scheduling.statistics import ExecutionTimes, VersionStatistics

log = logging.getLogger(__name__)

# A backend that may run on the event loop (`BackendInstance.may_run_on_loop`) runs a batch there
# when its previous execute took less than ON_LOOP_NS and the batch's inputs are at most
# ON_LOOP_BYTES, or twice those of the previous batch when it was larger: the hop to the worker
# thread and back costs the loop about as much CPU (measured: 100-120 us, bench/request_path.py)
# as such an execute. A batch that takes longer sends the next one back to the worker thread.
ON_LOOP_NS = 100_000
ON_LOOP_BYTES = 64 * 1024
# An execute that wrote outputs straight into the client's shared memory they are due in did
# the copy the loop would have made after it (below OFF_LOOP_BYTES, core/offload.py): that
# much of its time counts as the copy's, not as the execute's. A copy of 1 MiB costs the loop
# 60-120 µs in a serving process (docs/benchmarks.md).
IN_PLACE_NS_PER_BYTE = 0.1


@dataclass(frozen=True, slots=True)
class _Died:
    """The backend instance reported its death (from its own thread, hopped onto the loop)."""

    reason: str


class InstanceActor(Actor[Execute | _Died]):
    """`requeue`: whether requests of a batch that never reached a dead instance may go back to
    the scheduler as new requests (not for a sequence batcher, whose batches are rows of
    sequences bound to this instance, nor for a batcher that preserves the order of answers)."""

    _loop: asyncio.AbstractEventLoop  # the actor's own, from `started` on

    mailbox_size = 4  # the scheduler sends a batch only to an idle instance

    def __init__(
        self,
        name: str,
        backend: BackendInstance,
        scheduler: ActorRef[Any],
        statistics: VersionStatistics | None = None,
        requeue: bool = False,
    ) -> None:
        super().__init__(name)
        self._backend = backend
        self._scheduler = scheduler
        self._statistics = statistics
        self._requeue = requeue
        self._released = False
        self._is_async = inspect.iscoroutinefunction(backend.execute)
        self._may_run_on_loop = backend.may_run_on_loop and not self._is_async
        # The input bytes the next batch may have to run on the loop: those of the last execute
        # when it was short enough (0: it was not); the first runs on the worker thread, and
        # every one is timed again.
        self._short_bytes = 0
        # One thread of its own: the backend runs one batch at a time, off the event loop.
        self._worker = WorkerThread(name)
        # Batches the backend answered: a replacement that answered one works (its owner's
        # back-off after a death starts again from nothing).
        self.answered = 0
        self._waited = False  # set by `_note_wait`: an async execute waited

    async def started(self) -> None:
        self._loop = asyncio.get_running_loop()
        if isinstance(self._backend, WatchedInstance):
            self._backend.on_death(on_loop(self._died))
        await self._scheduler.tell(InstanceIdle(self.ref))

    def _died(self, reason: str) -> None:
        """On the loop, when the backend reports its death: a `_Died` for the actor to fail on,
        and no batch after it (the scheduler's `tell_nowait` meets a closed mailbox and gives
        the batch to another instance, or keeps it queued for the replacement). Also before the
        actor's loop runs (it died while starting), and a no-op once the actor has stopped."""
        with contextlib.suppress(ActorStopped, anyio.WouldBlock):
            # A full mailbox holds a batch, which fails the actor as well.
            self.ref.tell_nowait(_Died(reason))
        self.ref.stop()

    async def receive(self, message: Execute | _Died) -> None:
        if isinstance(message, _Died):
            await self.release()
            raise InstanceDied(message.reason)
        started = perf_counter_ns()
        ran_here = False  # the execute ran without letting anything else on the loop run
        requests = [item.request for item in message.batch]
        trace: BatchTrace | None = None
        for request in requests:  # tracing off: one `is None` check per request
            if request.trace is not None:
                trace = BatchTrace(requests, self._batch_size(message))
                break
        try:
            if self._is_async:
                # An async execute may answer without ever waiting: a callback the loop runs
                # only if it waited tells which (`_waited`).
                self._waited = False
                self._loop.call_soon(self._note_wait)
                backend_started = perf_counter_ns()
                try:
                    results = await self._backend.execute(requests)  # type: ignore[misc]
                except asyncio.CancelledError:
                    # Stopped in the middle (its model failed, the exit timeout): unlike one on
                    # the worker thread, an async execute is cut short, and its batch is
                    # answered here (counted and traced as failed) or by no one.
                    failure = self.stopped_error()
                    self._finish(
                        message, [failure] * len(requests), started, trace=trace, error=failure
                    )
                    raise
                backend_finished = perf_counter_ns()
                ran_here = not self._waited
            else:
                size = _input_bytes(requests) if self._may_run_on_loop else 0
                if size and size <= self._short_bytes:
                    ran_here = True
                    results, backend_started, backend_finished = self._timed_execute(requests)
                else:
                    results, backend_started, backend_finished = await self._worker.run(
                        self._timed_execute, requests
                    )
                if self._may_run_on_loop:
                    took = backend_finished - backend_started
                    short = took < ON_LOOP_NS + _in_place_ns(requests)
                    self._short_bytes = max(ON_LOOP_BYTES, 2 * size) if short else 0
            if len(results) != len(requests):
                raise internal(
                    f"instance '{self.name}' returned {len(results)} responses "
                    f"for {len(requests)} requests"
                )
        except InstanceDied as death:
            # The instance itself is gone: its batch fails with the reason (or, when the batch
            # never reached it, goes back to the scheduler), and so does this actor, so that
            # the model-version actor can put a new instance in its place.
            failure = unavailable(str(death))
            if isinstance(death, BatchNotRun) and self._requeue:
                if trace is not None:
                    trace.end(None, None, failure)
                await self._send_back(message, failure)
            else:
                self._finish(
                    message, [failure] * len(requests), started, trace=trace, error=failure
                )
            await self.release()
            raise
        except Exception as error:  # a backend bug fails this batch, not the instance
            log.exception("instance '%s' failed to execute a batch", self.name)
            failure = error if isinstance(error, TritonError) else internal(str(error))
            self._finish(message, [failure] * len(requests), started, trace=trace, error=failure)
        else:
            self.answered += 1
            self._finish(message, results, started, backend_started, backend_finished, trace)
            await self._hand_back(message, results)
        # The scheduler may have stopped first (the model is unloading): nothing more will come.
        # (try, not contextlib.suppress: three calls fewer on every execute's path.)
        try:  # noqa: SIM105
            await self._scheduler.tell(InstanceIdle(self.ref))
        except ActorStopped:
            pass
        if ran_here and self._receive.messages:
            # The scheduler, idle, may have put the next batch in this mailbox already (it
            # handles a message on its sender's turn), which the loop would take at once: a
            # batch that let nothing else run lets the loop turn before the next, so that a
            # backlog of them never holds up everything else on it.
            await asyncio.sleep(0)

    def stopped_error(self) -> Exception:
        return unavailable(f"model instance '{self.name}' stopped before answering")

    async def release(self) -> None:
        """Finalize the backend instance if it is not yet, logging a failure: when it died,
        and for an owner whose instance was cancelled with it (its `stopped` hook does not
        run then)."""
        try:
            await self._release()
        except Exception:
            log.exception("instance '%s' failed to finalize", self.name)

    def _note_wait(self) -> None:
        self._waited = True

    async def _hand_back(self, message: Execute, results: list[Result]) -> None:
        """Requests the model released with RESCHEDULE go back to the scheduler, which runs them
        again (before this instance says it is idle, so that it may be the one to run them)."""
        for item, result in zip(message.batch, results, strict=True):
            if result is not RESCHEDULE:
                continue
            try:
                await self._scheduler.tell(Rescheduled(item))
            except ActorStopped:
                item.reply.fail(
                    unavailable(f"model instance '{self.name}' stopped before rerunning a request")
                )

    async def _send_back(self, message: Execute, failure: TritonError) -> None:
        """A batch the dead instance never ran: its requests queue again at the scheduler, which
        runs them on another instance or the replacement (this one no longer says it is idle)."""
        for item in message.batch:
            try:
                await self._scheduler.tell(item)
            except ActorStopped:
                item.reply.fail(failure)

    async def _release(self) -> None:
        """Finalize the backend instance and end the worker thread (once): when it died, and
        at a stop (its `stopped` hook, which a failed actor runs too)."""
        if self._released:
            return
        self._released = True
        try:
            await self._worker.run(self._backend.finalize)
        finally:
            self._worker.close()

    def _timed_execute(self, requests: list[InferenceRequest]) -> tuple[list[Result], int, int]:
        # On the worker thread: the backend's own time, without the hops to and from it.
        backend_started = perf_counter_ns()
        results = self._backend.execute(requests)
        return results, backend_started, perf_counter_ns()

    def _finish(
        self,
        message: Execute,
        results: list[Result],
        started: int,
        backend_started: int | None = None,
        backend_finished: int | None = None,
        trace: BatchTrace | None = None,
        error: TritonError | None = None,
    ) -> None:
        """Close the batch's spans (before any answer leaves: a request's own span, which
        ends once it is answered, outlasts its stages), answer every request, then account
        for the batch (a failed execute has no compute times: only its failures count). A
        deferred request counts in this batch, and as a success or failure when its answer
        comes; a rescheduled one counts when it finally runs to its end."""
        if trace is not None:
            trace.end(backend_started, backend_finished, error)
        times = ExecutionTimes(
            started,
            started if backend_started is None else backend_started,
            started if backend_finished is None else backend_finished,
            started,
        )
        _answer(message, results, functools.partial(self._answer_later, times=times))
        if self._statistics is not None:
            times.answered = perf_counter_ns()
            batch: list[Infer] = message.batch
            if RESCHEDULE in results:
                kept = [(i, r) for i, r in zip(batch, results, strict=True) if r is not RESCHEDULE]
                batch, results = [i for i, _ in kept], [r for _, r in kept]
            if batch:
                self._statistics.record_execution(batch, results, times)

    def _answer_later(self, item: Infer, deferred: Deferred, times: ExecutionTimes) -> None:
        """Answer `item` when the backend resolves `deferred` (from any thread), and count it
        then: replies and statistics belong to the event loop, so the answer hops onto it."""
        statistics = self._statistics

        def answer(result: InferenceResponse | TritonError) -> None:
            if statistics is not None:
                statistics.record_outcome(item, result, times)
            _answer_one(item, result)

        deferred.on_resolved(on_loop(answer))

    def _batch_size(self, message: Execute) -> int:
        """The batch the model runs with: its requests' batch sizes summed (with batching)."""
        if self._statistics is None:
            return len(message.batch)
        return sum(self._statistics.batch_size(item) for item in message.batch)

    async def stopped(self) -> None:
        await self._release()


def _in_place_ns(requests: list[InferenceRequest]) -> float:
    """The share of an execute's time that wrote outputs where they are due (see
    IN_PLACE_NS_PER_BYTE): the bytes its backend says it wrote so (`OUTPUTS_IN_PLACE`), up to
    OFF_LOOP_BYTES, at a copy's cost."""
    written = 0
    for request in requests:
        written += request.context.pop(OUTPUTS_IN_PLACE, 0)
    return min(written, OFF_LOOP_BYTES) * IN_PLACE_NS_PER_BYTE


def _input_bytes(requests: list[InferenceRequest]) -> int:
    """The bytes of the batch's inputs (at least 1)."""
    size = 1
    for request in requests:
        for tensor in request.inputs:
            size += getattr(tensor.data, "nbytes", ON_LOOP_BYTES)
    return size


def _answer(
    message: Execute,
    results: list[Result],
    later: Callable[[Infer, Deferred], None],
) -> None:
    # None: a decoupled model answered (or will answer) through the request's sender; its reply
    # then only says that execute is over.
    if len(results) == 1:
        _answer_each(message, results, later)
        return
    # A batch's answers to a front end (the engine's connection to it) in one write.
    writes = cork()
    gathering = writes.gather()
    try:
        _answer_each(message, results, later)
    finally:
        if gathering:
            writes.end_gather()


def _answer_each(
    message: Execute,
    results: list[Result],
    later: Callable[[Infer, Deferred], None],
) -> None:
    for item, result in zip(message.batch, results, strict=True):
        if result is RESCHEDULE:
            continue  # handed back to the scheduler
        if isinstance(result, Deferred):
            later(item, result)
            continue
        _answer_one(item, result)  # type: ignore[arg-type]


def _answer_one(item: Infer, result: InferenceResponse | TritonError | None) -> None:
    if isinstance(result, TritonError):
        item.reply.fail(result)
        return
    sender = item.request.sender
    if result is not None and sender is not None and not sender.finished:
        # A backend that knows nothing of decoupling answered with one response: that is
        # the request's only, and final, response.
        sender.send(result, final=True)
    item.reply.set(result)  # type: ignore[arg-type]
