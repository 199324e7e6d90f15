"""The time from a request's arrival to its first response (Triton's
nv_inference_first_response_histogram_ms): a histogram kept per model version, and the sender of
a decoupled request, which times its first response and counts the request among its version's
`streaming` ones until its final response."""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from tritonactor.core.errors import TritonError
from tritonactor.core.types import InferenceResponse, ResponseSender
from tritonactor.observability.metrics import HistogramSample

if TYPE_CHECKING:
    from tritonactor.actors import Reply

__all__ = ["FIRST_RESPONSE_BUCKETS_MS", "FirstResponseHistogram", "FirstResponseTimer"]


class Streaming(Protocol):
    """What counts a version's requests still streaming (`VersionStatistics.streaming`)."""

    streaming: int


# Triton's default buckets for nv_inference_first_response_histogram_ms (milliseconds).
FIRST_RESPONSE_BUCKETS_MS = (100.0, 500.0, 2000.0, 5000.0)


class FirstResponseHistogram:
    """Times from a request's arrival to its first response, in fixed buckets: one list index
    bumped per request, turned into a Prometheus histogram only when scraped."""

    __slots__ = ("_counts", "_lock", "_sum_ms", "bounds_ms")

    def __init__(self, bounds_ms: Sequence[float] = FIRST_RESPONSE_BUCKETS_MS) -> None:
        self.bounds_ms = tuple(bounds_ms)
        self._counts = [0] * (len(self.bounds_ms) + 1)  # the last one: above every bound
        self._sum_ms = 0.0
        # A decoupled model's first response may be sent from a backend's own thread.
        self._lock = threading.Lock()

    def observe_ns(self, ns: int) -> None:
        ms = ns / 1e6
        index = bisect.bisect_left(self.bounds_ms, ms)  # a bucket holds what is <= its bound
        with self._lock:
            self._counts[index] += 1
            self._sum_ms += ms

    def sample(self) -> HistogramSample:
        with self._lock:
            return HistogramSample(self.bounds_ms, tuple(self._counts), self._sum_ms)


# Guards every version's `streaming` count: a decoupled model's sender may end a request from
# any thread. (One lock for all: the statistics are copied to the front ends, and a lock does not
# pickle.)
_STREAMING = threading.Lock()


class FirstResponseTimer(ResponseSender):
    """A decoupled request's sender, timing the first response it passes on, and counted in
    its version's `streaming` from the request's arrival until its final response is sent,
    its execute failed, or its client cancelled it (an unload waits for it meanwhile, as
    Triton's does)."""

    __slots__ = ("_arrival_ns", "_histogram", "_inner", "_statistics", "_timed")

    def __init__(
        self,
        inner: ResponseSender,
        arrival_ns: int,
        histogram: FirstResponseHistogram,
        statistics: Streaming,
    ) -> None:
        super().__init__(self._forward)
        self._inner = inner
        self._arrival_ns = arrival_ns
        self._histogram = histogram
        self._timed = False
        with _STREAMING:
            statistics.streaming += 1
        self._statistics: Streaming | None = statistics

    def _forward(
        self, response: InferenceResponse | None, error: TritonError | None, final: bool
    ) -> None:
        if response is not None and not self._timed:
            self._timed = True
            self._histogram.observe_ns(time.perf_counter_ns() - self._arrival_ns)
        if final:  # (before it is passed on: whoever hears of it finds the request over)
            self._over()
        self._inner.send(response, error=error, final=final)

    def answered(self, reply: Reply[Any]) -> None:
        """The request's execute is over: a failed one sends no more responses (its client
        has the failure as the last answer)."""
        if reply.error is not None:
            self._over()

    def cancel(self) -> None:
        super().cancel()
        self._inner.cancel()
        self._over()

    def _over(self) -> None:
        # (Once, from any thread: a model's sender may send its final response from its own.)
        statistics = self._statistics
        if statistics is None:
            return
        with _STREAMING:
            if self._statistics is not None:
                self._statistics = None
                statistics.streaming -= 1

    def is_cancelled(self) -> bool:
        return super().is_cancelled() or self._inner.is_cancelled()

    def holds_up(self) -> bool:
        return self._inner.holds_up()
