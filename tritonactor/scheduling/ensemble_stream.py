"""The responses of a decoupled ensemble step, carried from whichever thread its model sends them
on to the ensemble's task that starts the next steps, with the back-pressure of
`max_inflight_requests`."""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

from tritonactor.actors import Reply
from tritonactor.actors.loop import on_loop
from tritonactor.actors.mailbox import Mailbox, MailboxClosed
from tritonactor.core.errors import TritonError
from tritonactor.core.types import InferenceRequest, InferenceResponse, ResponseSender


class ResponseStream:
    """The responses of one request of a decoupled step, from whichever thread its model sends
    them on to the task that starts the next steps. With a `capacity`, a model thread that sends
    while that many responses wait is held up until one is taken (a model sending on the event
    loop cannot be held up: its responses wait however many they are). 0: no capacity limit."""

    def __init__(self, capacity: int, ensemble_request: InferenceRequest) -> None:
        self._answers: Mailbox[tuple[InferenceResponse | None, TritonError | None, bool]] = (
            Mailbox.for_stream()
        )
        self._capacity = capacity or math.inf
        self._room = threading.Condition()
        self._waiting = 0
        self._closed = False
        self._loop_thread = threading.get_ident()
        # Whether the response `responses` gave last came with the final flag.
        self.ended = False
        self._put_from_thread = on_loop(self._put)
        self.sender = StepSender(self._deliver, ensemble_request, holds_up=capacity > 0)

    def _deliver(
        self, response: InferenceResponse | None, error: TritonError | None, final: bool
    ) -> None:
        answer = (response, error, final)
        on_loop = threading.get_ident() == self._loop_thread
        with self._room:
            while (
                not on_loop
                and response is not None
                and self._waiting >= self._capacity
                and not self._closed
            ):
                self._room.wait()
            if self._closed:
                return
            self._waiting += 1
        if on_loop:
            self._put(answer)
        else:
            self._put_from_thread(answer)

    def _put(self, answer: tuple[InferenceResponse | None, TritonError | None, bool]) -> None:
        with contextlib.suppress(MailboxClosed):
            self._answers.put_nowait(answer)

    def execute_over(self, reply: Reply[Any]) -> None:
        """The step's execute is over: if it failed before the model sent its final response,
        that failure ends the stream."""
        self.sender.end_if_failed(reply.result)

    async def responses(self) -> AsyncIterator[InferenceResponse]:
        """The model's responses, until its final one; raises the error it ended with."""
        while True:
            response, error, final = await self._answers.get()
            with self._room:
                self._waiting -= 1
                self._room.notify()
            if error is not None:
                raise error
            self.ended = final
            if response is not None:
                yield response
            if final:
                return

    def close(self) -> None:
        """No more responses are taken: a model thread held up is let go, and what it sends
        from now on is dropped."""
        with self._room:
            self._closed = True
            self._room.notify_all()
        self._answers.leave()


class StepSender(ResponseSender):
    """A decoupled step's sender, cancelled too when the ensemble's request is: a model that
    polls `is_cancelled()` stops early when the ensemble's client goes away."""

    __slots__ = ("_ensemble_request",)

    def __init__(
        self,
        deliver: Callable[[InferenceResponse | None, TritonError | None, bool], None],
        ensemble_request: InferenceRequest,
        holds_up: bool = False,
    ) -> None:
        super().__init__(deliver, holds_up)
        self._ensemble_request = ensemble_request

    def is_cancelled(self) -> bool:
        return self._ensemble_request.cancelled or super().is_cancelled()
