"""Triton's statistics extension: what a model version has served, accumulated by its instance
actors as each batch finishes and by the router as each request is answered, and read by the
front ends and the metrics collector.

Every update happens on the event loop (an instance actor's `receive`, a reply's done callback),
and every read in a handler on the same loop, without an await in between: no lock is needed.
The one exception is the first-response histogram, which a decoupled model's sender may reach
from any thread. Times come from `time.perf_counter_ns` (one monotonic clock shared by every
thread)."""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tritonactor.actors import ActorStopped
from tritonactor.backends.base import Deferred
from tritonactor.backends.batching import batch_size as request_batch_size
from tritonactor.core.errors import ErrorCode, TritonError
from tritonactor.core.types import InferenceRequest, InferenceResponse
from tritonactor.observability.metrics import CacheCounts, VersionSample
from tritonactor.observability.summaries import LatencySummaries
from tritonactor.scheduling.first_response import FirstResponseHistogram, FirstResponseTimer
from tritonactor.scheduling.messages import Infer
from tritonactor.scheduling.sequence_rows import NULL_REQUEST, STATE_ERROR
from tritonactor.scheduling.step_times import (
    ENSEMBLE_TIMES,
    add_step_times,
)

if TYPE_CHECKING:
    from tritonactor.actors import Reply

# Triton's reasons for a failed request (the `reason` label of nv_inference_request_failure).
FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")


@dataclass(slots=True)
class Duration:
    """Triton's StatisticDuration: how many times, and how many nanoseconds in all."""

    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        """`count` more, taking `ns` in all."""
        self.count += count
        self.ns += ns


@dataclass(slots=True)
class BatchStatistics:
    """The compute durations of every execution of one batch size."""

    batch_size: int
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


@dataclass(slots=True)
class ExecutionTimes:
    """When one execute went through its stages (`perf_counter_ns`)."""

    started: int  # the instance took the batch: the requests stopped queueing
    backend_started: int
    backend_finished: int
    answered: int  # every request of the batch was answered

    def compute(self) -> tuple[int, int, int]:
        """compute_input, compute_infer, compute_output (ns) of the batch."""
        return (
            self.backend_started - self.started,
            self.backend_finished - self.backend_started,
            # A deferred answer may come while the batch is still being answered.
            max(0, self.answered - self.backend_finished),
        )


class VersionStatistics:
    """The statistics of one model version, in Triton's terms.

    Per request (`inference_stats`): success and fail count requests and the time from their
    arrival at the router to their answer; queue and compute_* count successful requests only,
    each carrying the whole duration of the batch it ran in. compute_input is the time from the
    instance taking the batch to the backend starting on it, compute_infer the backend's execute,
    compute_output the time from the backend's return to every request being answered.

    A request the backend answers after its execute (a `Deferred` result) counts in its batch
    at the execute, and as a success or a failure (BACKEND) when its answer comes.

    Per execution: an execute in which at least one request succeeded (or was deferred) counts
    once in
    execution_count and in `batch_stats` under its batch size (the requests' batch sizes summed),
    and adds that batch size to inference_count, as Triton does; last_inference is the wall
    clock (ms since the epoch) at the end of the latest such execute. The sequence batcher's
    null requests (empty slots of a batch) are not requests: they count nowhere.

    An ensemble (`counted_when_answered`) has no execute of its own: as in Triton, each request
    answered without an error is one execution of its own batch size, its queue time the wait
    for the ensemble to take it, its compute times the sums of its successful steps' (each
    step's batch's, `STEP_TIMES`; a step answered from the response cache adds none).

    For the metrics: failures by Triton's reason (`failures()`), from every routed request's
    answer, the time to each request's first response (`first_response`), and with
    `--metrics-config summary_latencies=true` each successful request's durations in
    `summaries` (observability/summaries.py; the engine's alone: a copy sent to a front end
    leaves them behind)."""

    INFERENCE_STATS = (
        "success",
        "fail",
        "queue",
        "compute_input",
        "compute_infer",
        "compute_output",
        "cache_hit",
        "cache_miss",
    )

    def __init__(
        self,
        batching: bool,
        counted_when_answered: bool = False,
        summaries: LatencySummaries | None = None,
    ) -> None:
        # With batching (max_batch_size > 0) a request's first dimension is its batch size.
        self.batching = batching
        # A version without instances (an ensemble) runs no execute of its own: each request
        # counts as one execution, successful when it is answered without an error.
        self.counted_when_answered = counted_when_answered
        self.last_inference_ms = 0
        self.inference_count = 0
        # Requests routed to this version and not answered yet (queued or running), and a
        # decoupled model's requests whose final response is not sent yet (from their arrival:
        # among `pending` too until their execute is over): what an unload or a reload waits
        # for (`busy`) before it stops the version.
        self.pending = 0
        self.streaming = 0
        self.execution_count = 0
        self.success = Duration()
        self.fail = Duration()
        self.queue = Duration()
        self.compute_input = Duration()
        self.compute_infer = Duration()
        self.compute_output = Duration()
        # The response cache (`record_cache_hit`, `record_cache_miss`).
        self.cache_hit = Duration()
        self.cache_miss = Duration()
        self._batches: dict[int, BatchStatistics] = {}
        self.first_response = FirstResponseHistogram()
        self.summaries = summaries
        # Failures of answered requests, by the reason their error gives (`failure_reason`),
        # and those of them that the execute returned: a backend's error may carry any code.
        self._failed = dict.fromkeys(FAILURE_REASONS, 0)
        self._failed_in_execute = dict.fromkeys(FAILURE_REASONS, 0)
        self._reported = dict.fromkeys(FAILURE_REASONS, 0)

    def admit(
        self, request: InferenceRequest, reply: Reply[InferenceResponse], arrival_ns: int
    ) -> None:
        """A request is routed to this version: count it pending until `reply` is answered, and
        time a decoupled model's first response through its sender (the router's one call per
        request)."""
        self.pending += 1
        if self.counted_when_answered:
            reply.add_done_callback(functools.partial(self._answered, request, arrival_ns))
        else:
            reply.add_done_callback(functools.partial(self.request_done, arrival_ns))
        if request.sender is not None:
            timer = FirstResponseTimer(request.sender, arrival_ns, self.first_response, self)
            request.sender = timer
            reply.add_done_callback(timer.answered)

    @property
    def busy(self) -> int:
        """Whether the version still owes answers (a count: a decoupled request still executing
        counts twice, pending and streaming)."""
        return self.pending + self.streaming

    def request_done(self, arrival_ns: int, reply: Reply[Any]) -> None:
        """A request routed to this version (at `arrival_ns`) has its answer. A failure counts
        here, whether an execute or a scheduler failed it (`fail`, and by its reason, which
        the metrics read): one count for both, as Triton's statistics and metrics have. One its
        scheduler refused as it arrived (a full queue, a sequence control it cannot take)
        counts in neither, as in Triton, which gives such a request back unrun."""
        self.pending -= 1
        try:
            reply.result()
        except BaseException as error:  # the stored answer, not an exception raised here
            if getattr(error, "refused", False):
                return
            self._failed[failure_reason(error)] += 1
            self.fail.add(time.perf_counter_ns() - arrival_ns, 1)

    def _answered(
        self, request: InferenceRequest, arrival_ns: int, reply: Reply[InferenceResponse]
    ) -> None:
        self.request_done(arrival_ns, reply)
        if reply.error is not None:
            return
        took = time.perf_counter_ns() - arrival_ns
        if request.sender is None:  # a decoupled request's first response is timed as sent
            self.first_response.observe_ns(took)
        taken, steps = request.context.get(ENSEMBLE_TIMES) or (arrival_ns, None)
        if steps is None:
            self._count_answered(request, arrival_ns, took, taken, (0, 0, 0))
        else:  # once every step's execute is over
            steps.when_over(
                lambda: self._count_answered(request, arrival_ns, took, taken, steps.compute)
            )

    def _count_answered(
        self,
        request: InferenceRequest,
        arrival_ns: int,
        took: int,
        taken: int,
        compute: Sequence[int],
    ) -> None:
        """An ensemble's request answered without an error (in `took` ns, taken at `taken`),
        its steps' compute times summed in `compute`."""
        answered = arrival_ns + took
        compute_input, compute_infer, compute_output = compute
        self.success.add(took, 1)
        self.queue.add(max(0, taken - arrival_ns))
        add_step_times(request, compute_input, compute_infer, compute_output)
        self.compute_input.add(compute_input)
        self.compute_infer.add(compute_infer)
        self.compute_output.add(compute_output)
        if self.summaries is not None:
            self.summaries.observe(
                answered,
                took,
                max(0, taken - arrival_ns),
                compute_input,
                compute_infer,
                compute_output,
            )
        size = request_batch_size(request) if self.batching else 1
        self._record_batch(size, compute_input, compute_infer, compute_output)

    def record_cache_hit(
        self, arrival_ns: int, lookup_started: int, lookup_ended: int, answered: int
    ) -> None:
        """A request answered from the response cache, without a scheduler (never `admit`ted).
        As Triton 2.51 counts one: a success, its queue time until the lookup began, its cache
        hit the lookup's time; no compute, execution or inference."""
        took = answered - arrival_ns
        self.success.add(took)
        self.queue.add(max(0, lookup_started - arrival_ns))
        self.cache_hit.add(max(0, lookup_ended - lookup_started))
        self.first_response.observe_ns(took)
        summaries = self.summaries
        if summaries is not None and summaries.cache_hit is not None:
            # As Triton 2.51: no request summary for a version using the cache
            summaries.queue.observe(max(0, lookup_started - arrival_ns) // 1000, answered)
            summaries.cache_hit.observe(max(0, lookup_ended - lookup_started) // 1000, answered)

    def record_cache_miss(self, ns: int) -> None:
        """A request the response cache missed was answered and its answer offered to the cache:
        `ns` is the lookup's and the insertion's time, added to the request's duration too (it
        was counted as a success when answered), as Triton 2.51 does."""
        self.cache_miss.add(ns)
        self.success.ns += ns
        summaries = self.summaries
        if summaries is not None and summaries.cache_miss is not None:
            summaries.cache_miss.observe(ns // 1000, time.perf_counter_ns())

    def failures(self) -> dict[str, int]:
        """Failed requests by Triton's reason: BACKEND for those the execute failed, the others
        by what their error says."""
        in_execute = self._failed_in_execute
        counts = {}
        for reason in FAILURE_REASONS:
            if reason == "BACKEND":
                counts[reason] = sum(in_execute.values())
                continue
            # An execute's failure is recorded as its answer goes out, so both counts have it;
            # with preserve_ordering an answer may be held back for a while after the execute,
            # and a counter must not go down meanwhile.
            counted = self._failed[reason] - in_execute[reason]
            counts[reason] = self._reported[reason] = max(counted, self._reported[reason])
        return counts

    def record_execution(
        self, batch: Sequence[Infer], results: Sequence[object], times: ExecutionTimes
    ) -> None:
        """Account for one execute: `results[i]` answered `batch[i]` (a TritonError: failed,
        counted as its reply fails, `request_done`; here its reason is the execute's)."""
        answered = times.answered
        batch_size = succeeded = success_ns = queue_ns = later = 0
        batching = self.batching
        first_response = self.first_response
        summaries = self.summaries
        # Every successful request of the batch took the batch's whole compute time.
        compute_input, compute_infer, compute_output = times.compute()
        # The instance checked that there is one result per request.
        for item, result in zip(batch, results):  # noqa: B905
            request = item.request
            if NULL_REQUEST in request.context:
                continue
            batch_size += self.batch_size(item) if batching else 1
            if isinstance(result, Deferred):
                later += 1  # in this batch; it counts as answered when it is (record_outcome)
                continue
            if not isinstance(result, TritonError):
                result = request.context.get(STATE_ERROR, result)
            if isinstance(result, TritonError):
                self._failed_in_execute[failure_reason(result)] += 1
            else:
                succeeded += 1
                took = answered - item.arrival_ns
                waited = max(0, times.started - item.arrival_ns)
                success_ns += took
                queue_ns += waited
                add_step_times(request, compute_input, compute_infer, compute_output)
                if summaries is not None:
                    summaries.observe(
                        answered, took, waited, compute_input, compute_infer, compute_output
                    )
                if request.sender is None:  # else its sender times its first response
                    first_response.observe_ns(answered - item.arrival_ns)
        if not succeeded and not later:
            return
        if succeeded:
            self.success.add(success_ns, succeeded)
            self.queue.add(queue_ns, succeeded)
            self.compute_input.add(compute_input * succeeded, succeeded)
            self.compute_infer.add(compute_infer * succeeded, succeeded)
            self.compute_output.add(compute_output * succeeded, succeeded)
        self._record_batch(batch_size, compute_input, compute_infer, compute_output)

    def record_outcome(self, item: Infer, result: object, times: ExecutionTimes) -> None:
        """A request whose execute gave it a `Deferred` result has its answer (`result`): it
        succeeds or fails now, with its batch's times (its batch was counted at execute)."""
        request = item.request
        took = time.perf_counter_ns() - item.arrival_ns
        if not isinstance(result, TritonError):
            result = request.context.get(STATE_ERROR, result)
        if isinstance(result, TritonError):
            self._failed_in_execute[failure_reason(result)] += 1  # (its reply counts it)
            return
        compute_input, compute_infer, compute_output = times.compute()
        self.success.add(took, 1)
        self.queue.add(max(0, times.started - item.arrival_ns), 1)
        add_step_times(request, compute_input, compute_infer, compute_output)
        if self.summaries is not None:
            self.summaries.observe(
                item.arrival_ns + took,
                took,
                max(0, times.started - item.arrival_ns),
                compute_input,
                compute_infer,
                compute_output,
            )
        self.compute_input.add(compute_input, 1)
        self.compute_infer.add(compute_infer, 1)
        self.compute_output.add(compute_output, 1)
        if request.sender is None:
            self.first_response.observe_ns(took)

    def _record_batch(
        self, batch_size: int, compute_input: int, compute_infer: int, compute_output: int
    ) -> None:
        """One successful execution of `batch_size`, with its compute durations (ns)."""
        self.last_inference_ms = time.time_ns() // 1_000_000
        self.execution_count += 1
        self.inference_count += batch_size
        stats = self._batches.get(batch_size)
        if stats is None:
            stats = self._batches[batch_size] = BatchStatistics(batch_size)
        stats.compute_input.add(compute_input)
        stats.compute_infer.add(compute_infer)
        stats.compute_output.add(compute_output)

    def batch_size(self, item: Infer) -> int:
        if not self.batching:
            return 1
        inputs = item.request.inputs
        return inputs[0].shape[0] if inputs and inputs[0].shape else 1

    def __getstate__(self) -> dict[str, Any]:
        # A copy for a front end (the statistics API): the summaries' windows stay here.
        return {**self.__dict__, "summaries": None}

    def inference_stats(self) -> dict[str, Duration]:
        """The per-request durations by Triton's field names, in Triton's order."""
        return {name: getattr(self, name) for name in self.INFERENCE_STATS}

    @property
    def batch_stats(self) -> list[BatchStatistics]:
        """One entry per executed batch size, smallest first."""
        return [self._batches[size] for size in sorted(self._batches)]

    def sample(self, model: str, version: int, response_cache: bool = False) -> VersionSample:
        """What the metrics collector reports for this version, read now (`response_cache`:
        whether its config asks for the response cache, which adds the cache's families)."""
        return VersionSample(
            model=model,
            version=version,
            success=self.success.count,
            failures=self.failures(),
            inference_count=self.inference_count,
            execution_count=self.execution_count,
            pending=self.pending,
            request_us=self.success.ns // 1000,
            queue_us=self.queue.ns // 1000,
            compute_input_us=self.compute_input.ns // 1000,
            compute_infer_us=self.compute_infer.ns // 1000,
            compute_output_us=self.compute_output.ns // 1000,
            batch_executions={b.batch_size: b.compute_infer.count for b in self.batch_stats},
            first_response_ms=self.first_response.sample(),
            cache=CacheCounts(
                self.cache_hit.count,
                self.cache_hit.ns // 1000,
                self.cache_miss.count,
                self.cache_miss.ns // 1000,
            )
            if response_cache
            else None,
            summaries=self.summaries.sample(time.perf_counter_ns())
            if self.summaries is not None
            else None,
        )


def failure_reason(error: BaseException) -> str:
    """Triton's reason for a request that failed with `error`, as far as the error tells:
    refused by a scheduler (queue full, timed out, unloading: UNAVAILABLE), or CANCELED;
    anything else is OTHER. (A failed execute is BACKEND whatever its error says; the
    statistics know which failures those are.)"""
    if isinstance(error, TritonError):
        if error.code is ErrorCode.CANCELLED:
            return "CANCELED"
        return "REJECTED" if error.code is ErrorCode.UNAVAILABLE else "OTHER"
    # A scheduler that stopped with the request still queued.
    return "REJECTED" if isinstance(error, ActorStopped) else "OTHER"
