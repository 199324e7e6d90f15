"""Triton's default scheduler: each request is a batch of one, run by whichever instance is idle.

`Scheduler` is what it shares with the dynamic and sequence batchers."""

from __future__ import annotations

from abc import abstractmethod
from collections import deque
from typing import Any, TypeVar

from tritonactor.actors import Actor, ActorRef, ActorStopped
from tritonactor.core.errors import TritonError, cancelled, internal, unavailable
from tritonactor.scheduling.messages import Execute, Infer, InstanceGone, InstanceIdle, Rescheduled

SchedulerMessage = Infer | InstanceIdle | InstanceGone | Rescheduled
M = TypeVar("M")


def refuse_rescheduled(message: Rescheduled, model: str) -> None:
    """Only a sequence batcher with `iterative_sequence` runs a request again: elsewhere the
    model's RESCHEDULE fails the request, with Triton's words for it (Triton itself only logs
    them and never answers the request) and what the model's config lacks."""
    message.item.reply.fail(
        internal(
            "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model "
            f"'{model}' is not configured to handle such a flag "
            "(sequence_batching { iterative_sequence: true })."
        )
    )


class Scheduler(Actor[M]):
    """What the default scheduler and the batchers share: nothing they do waits, so a message
    that finds one idle is handled on its sender's turn (an instance that says it is idle gets
    its next batch without a loop turn); a request still queued when one stops is answered
    UNAVAILABLE (`stopped_error`): the model is unloading, or (`failure` set) it failed."""

    mailbox_size = 1024
    handles_now = True
    # Why its model gave up on it (its instances died and could not be made again), told before
    # the model fails: the scheduler is then cancelled, not failed, and its queued requests
    # are told this rather than that the model is unloading.
    given_up: str | None = None

    async def receive(self, message: M) -> None:
        self.handle_now(message)

    @abstractmethod
    def handle_now(self, message: M) -> None: ...

    def stopped_error(self) -> TritonError:
        failure = self.failure if self.failure is not None else self.given_up
        if failure is not None:
            return unavailable(f"model '{self.name}' failed ({failure}); the request was not run")
        return unavailable(f"model '{self.name}' is unloading; the request was not run")


class DefaultScheduler(Scheduler[SchedulerMessage]):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self._queue: deque[Infer] = deque()
        self._idle: deque[ActorRef[Any]] = deque()

    def handle_now(self, message: SchedulerMessage) -> None:
        if isinstance(message, Infer):
            self._queue.append(message)
        elif isinstance(message, InstanceIdle):
            self._idle.append(message.instance)
        elif isinstance(message, Rescheduled):
            refuse_rescheduled(message, self.name)
        else:
            if message.instance in self._idle:
                self._idle.remove(message.instance)
        self._dispatch()

    def _dispatch(self) -> None:
        while self._queue and self._idle:
            item = self._queue.popleft()
            if item.request.cancelled:
                # The client gave up while the request waited: run nothing for nobody.
                item.reply.fail(cancelled(f"request for model '{self.name}' was cancelled"))
                continue
            instance = self._idle.popleft()
            try:
                instance.tell_nowait(Execute([item]))
            except ActorStopped:
                self._queue.appendleft(item)  # that instance is gone; another takes the request

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    async def stopped(self) -> None:
        error = self.stopped_error()
        while self._queue:
            self._queue.popleft().reply.fail(error)
