"""Triton's statistics extension: what a model version has served, accumulated by its instance
actors as each batch finishes and read by the front ends.

Every update happens in an instance actor's `receive`, on the event loop, and every read in a
front-end handler on the same loop, without an await in between: no lock is needed. Times come
from `time.perf_counter_ns` (one monotonic clock shared by every thread)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tritonactor.core.errors import ErrorCode, TritonError, invalid_arg
from tritonactor.scheduling.messages import Infer

if TYPE_CHECKING:
    from tritonactor.actors import Reply
    from tritonactor.scheduling.router import ModelHandle, Router


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


@dataclass(frozen=True, slots=True)
class ExecutionTimes:
    """When one execute went through its stages (`perf_counter_ns`)."""

    started: int  # the instance took the batch: the requests stopped queueing
    backend_started: int
    backend_finished: int
    answered: int  # every request of the batch was answered


class VersionStatistics:
    """The statistics of one model version, in Triton's terms.

    Per request (`inference_stats`): success and fail count requests and the time from their
    arrival at the router to their answer; queue and compute_* count successful requests only,
    each carrying the whole duration of the batch it ran in. compute_input is the time from the
    instance taking the batch to the backend starting on it, compute_infer the backend's execute,
    compute_output the time from the backend's return to every request being answered.

    Per execution: an execute in which at least one request succeeded counts once in
    execution_count and in `batch_stats` under its batch size (the requests' batch sizes summed),
    and adds that batch size to inference_count, as Triton does; last_inference is the wall
    clock (ms since the epoch) at the end of the latest such execute."""

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

    def __init__(self, batching: bool) -> None:
        # With batching (max_batch_size > 0) a request's first dimension is its batch size.
        self.batching = batching
        self.last_inference_ms = 0
        self.inference_count = 0
        # Requests routed to this version and not answered yet (queued or running): what an
        # unload or a reload waits to reach zero before it stops the version.
        self.pending = 0
        self.execution_count = 0
        self.success = Duration()
        self.fail = Duration()
        self.queue = Duration()
        self.compute_input = Duration()
        self.compute_infer = Duration()
        self.compute_output = Duration()
        self.cache_hit = Duration()  # no response cache: always zero
        self.cache_miss = Duration()
        self._batches: dict[int, BatchStatistics] = {}

    def request_done(self, reply: Reply[Any]) -> None:
        """A request routed to this version has its answer (the router calls this)."""
        self.pending -= 1

    def record_execution(
        self, batch: Sequence[Infer], results: Sequence[object], times: ExecutionTimes
    ) -> None:
        """Account for one execute: `results[i]` answered `batch[i]` (a TritonError: failed)."""
        answered = times.answered
        batch_size = succeeded = success_ns = queue_ns = failed = fail_ns = 0
        batching = self.batching
        # The instance checked that there is one result per request.
        for item, result in zip(batch, results):  # noqa: B905
            batch_size += self.batch_size(item) if batching else 1
            if isinstance(result, TritonError):
                failed += 1
                fail_ns += answered - item.arrival_ns
            else:
                succeeded += 1
                success_ns += answered - item.arrival_ns
                queue_ns += max(0, times.started - item.arrival_ns)
        if failed:
            self.fail.add(fail_ns, failed)
        if not succeeded:
            return
        self.success.add(success_ns, succeeded)
        self.queue.add(queue_ns, succeeded)
        # Every successful request of the batch took the batch's whole compute time.
        compute_input = times.backend_started - times.started
        compute_infer = times.backend_finished - times.backend_started
        compute_output = answered - times.backend_finished
        self.compute_input.add(compute_input * succeeded, succeeded)
        self.compute_infer.add(compute_infer * succeeded, succeeded)
        self.compute_output.add(compute_output * succeeded, succeeded)
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

    def inference_stats(self) -> dict[str, Duration]:
        """The per-request durations by Triton's field names, in Triton's order."""
        return {name: getattr(self, name) for name in self.INFERENCE_STATS}

    @property
    def batch_stats(self) -> list[BatchStatistics]:
        """One entry per executed batch size, smallest first."""
        return [self._batches[size] for size in sorted(self._batches)]


def select(router: Router, name: str = "", version: str = "") -> list[ModelHandle]:
    """The ready versions whose statistics were asked for: every one (no name), every one of a
    model (no version), or one. Anything else is Triton's INVALID_ARG."""
    if not name:
        return router.handles()
    if version:
        try:
            return [router.resolve(name, version)]
        except TritonError as error:
            if error.code is ErrorCode.INVALID_ARG:  # not a version number
                raise
            if router.ready_versions(name):
                raise invalid_arg(
                    f"requested model version is not available for model '{name}'"
                ) from None
    versions = router.ready_versions(name)
    if not versions:
        raise invalid_arg(f"requested model '{name}' is not available")
    return [router.resolve(name, str(number)) for number in versions]
