"""The sequence batcher's iterative sequences (`iterative_sequence: true`): a request the model
hands back with RESCHEDULE runs again next in its sequence's slot, as a continuation, and the
sequence ends when its last request is answered. `IterativeSequences` is mixed into
`SequenceBatcher` (sequence.py), whose state it works on: the requests in flight, the slots,
the model's name and whether its sequences are iterative."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio

from tritonactor.actors import ActorStopped, Reply
from tritonactor.core.errors import cancelled, internal, unavailable
from tritonactor.core.types import InferenceResponse
from tritonactor.scheduling.default import refuse_rescheduled
from tritonactor.scheduling.messages import Rescheduled
from tritonactor.scheduling.sequence_slots import RunningSequence, Waiting

if TYPE_CHECKING:
    from tritonactor.actors import ActorRef

__all__ = ["Answered", "IterativeSequences"]


@dataclass(frozen=True, slots=True)
class Answered:
    """An iterative sequence's request has its final answer (from a reply callback): its
    sequence may end."""

    entry: Waiting


class IterativeSequences:
    """How an iterative sequence's requests run again and end; mixed into the batcher."""

    name: str
    ref: ActorRef[Any]
    _iterative: bool
    _in_flight: dict[int, Waiting]

    # (the batcher's and the actor's: annotations only, no attribute that would shadow them)
    _end: Callable[[RunningSequence], None]
    now: Callable[[], float]
    start_soon: Callable[..., Any]

    def _watch(self, entry: Waiting) -> None:
        """An iterative sequence's request went to its instance: it comes back either answered
        (`Answered`) or handed back to run again (`Rescheduled`)."""
        entry.sequence.running += 1
        self._in_flight[id(entry.item.request)] = entry
        if not entry.watched:
            entry.watched = True
            entry.item.reply.add_done_callback(partial(self._on_answer, entry))

    def _on_answer(self, entry: Waiting, _: Reply[InferenceResponse]) -> None:
        # A reply callback, outside `receive`: the actor learns of it by a message (handled on
        # the answerer's turn when the actor is idle, queued otherwise).
        message = Answered(entry)
        with contextlib.suppress(ActorStopped):
            try:
                self.ref.tell_nowait(message)
            except anyio.WouldBlock:
                self.start_soon(self._tell_self, message)

    async def _tell_self(self, message: Answered) -> None:
        with contextlib.suppress(ActorStopped):
            await self.ref.tell(message)

    def _request_answered(self, entry: Waiting) -> None:
        """A request of an iterative sequence has its answer: the sequence ends with its last
        request (its ID may START a new one, its slot goes to the backlog)."""
        sequence = entry.sequence
        if self._in_flight.pop(id(entry.item.request), None) is not None:
            sequence.running -= 1
        if not sequence.running and not sequence.queue:
            self._end(sequence)

    def _rerun(self, message: Rescheduled) -> None:
        """The model released a request with RESCHEDULE: with `iterative_sequence` it runs
        again next in its sequence's slot, as a continuation (START and END false); otherwise
        it fails."""
        if not self._iterative:
            refuse_rescheduled(message, self.name)
            return
        entry = self._in_flight.pop(id(message.item.request), None)
        if entry is None:
            message.item.reply.fail(
                internal(f"model '{self.name}' rescheduled a request that it was not running")
            )
            return
        sequence = entry.sequence
        sequence.running -= 1
        if sequence.cancelled:  # ended by a cancelled request of it meanwhile (`_heads`)
            entry.item.reply.fail(
                cancelled(
                    f"sequence {sequence.correlation_id} of model '{self.name}' was cancelled "
                    "by a later request of it"
                )
            )
            if not sequence.running:
                self._end(sequence)
            return
        if sequence.lane is None:  # its instance stopped meanwhile: its state went with it
            entry.item.reply.fail(
                unavailable(
                    f"sequence {sequence.correlation_id} of model '{self.name}' was lost: its "
                    "instance stopped"
                )
            )
            return
        # Its flags were for its first run (Triton's rerun has none).
        entry.start = entry.end = False
        parameters = entry.item.request.parameters
        parameters["sequence_start"] = parameters["sequence_end"] = False
        sequence.queue.appendleft(entry)
        sequence.last = self.now()
