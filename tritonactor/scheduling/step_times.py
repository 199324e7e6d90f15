"""An ensemble's statistics from its steps', as Triton keeps them: an ensemble request's compute
times are its successful steps' summed (each step's batch's), and it is counted once every step
request is over. The ensemble marks the requests (`ENSEMBLE_TIMES`, `STEP_TIMES`); a step's
statistics add to them (`add_step_times`, `StepTimes.add`); the ensemble's wait for them
(`StepTimes.when_over`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tritonactor.actors import Reply
    from tritonactor.core.types import InferenceRequest

__all__ = ["ENSEMBLE_TIMES", "STEP_TIMES", "StepTimes", "add_step_times"]

# Set by the ensemble scheduler in the context of a request it answers: when it took the
# request (`perf_counter_ns`) and its steps' `StepTimes`, for its own statistics.
ENSEMBLE_TIMES = "ensemble_times"
# Set by the ensemble in the context of each step request it sends: the ensemble request's
# `StepTimes`, to which a step that succeeds adds its compute times (its batch's), as Triton's
# step requests report theirs to their ensemble's statistics.
STEP_TIMES = "ensemble_step_times"


class StepTimes:
    """An ensemble request's compute times (ns: `compute` is input, infer, output), its
    successful steps' summed; and the steps whose execute may outlast their last response (a
    decoupled step's), which the ensemble's statistics wait for, as Triton reports an ensemble
    request once all its step requests are released. On the event loop."""

    __slots__ = ("_loop", "_open", "_then", "compute")

    def __init__(self) -> None:
        self.compute = [0, 0, 0]
        self._open = 0
        self._then: Callable[[], None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def add(self, compute_input: int, compute_infer: int, compute_output: int) -> None:
        compute = self.compute
        compute[0] += compute_input
        compute[1] += compute_infer
        compute[2] += compute_output

    def running(self, reply: Reply[Any]) -> None:
        """A step whose execute is over when `reply` is answered (its model records its times
        in the same turn of the loop, just after)."""
        self._open += 1
        self._loop = asyncio.get_running_loop()
        reply.add_done_callback(self._over_soon)

    def _over_soon(self, _reply: Reply[Any]) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._over)

    def _over(self) -> None:
        self._open -= 1
        if not self._open and self._then is not None:
            then, self._then = self._then, None
            then()

    def when_over(self, then: Callable[[], None]) -> None:
        """Call `then` once no step is running (at once if none is)."""
        if self._open:
            self._then = then
        else:
            then()


def add_step_times(
    request: InferenceRequest, compute_input: int, compute_infer: int, compute_output: int
) -> None:
    """A step of an ensemble's request succeeded: its compute times count in the ensemble's."""
    step = request.context.get(STEP_TIMES)
    if step is not None:
        step.add(compute_input, compute_infer, compute_output)
