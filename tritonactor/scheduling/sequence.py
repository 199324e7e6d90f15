"""Triton's sequence batcher: each sequence of requests, named by its correlation ID, holds a
slot of one instance from its first request until its END request is sent, so that a stateful
model sees the whole sequence, in order, on one instance. Strategy `direct` gives each slot its
own batch row; `oldest` batches the oldest ready sequences of an instance together. With
`iterative_sequence` each request is a sequence of its own, which the model may run over several
executions (it releases the request with RESCHEDULE until it is done). The rules are written down
in docs/scheduling.md ("The sequence batcher")."""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tritonactor._proto.inference import ModelConfig, ModelSequenceBatchingControlKind
from tritonactor.actors import ActorRef, ActorStopped
from tritonactor.backends.batching import batch_size
from tritonactor.core.errors import (
    TritonError,
    cancelled,
    invalid_arg,
    refused,
    unavailable,
    unsupported,
)
from tritonactor.core.types import InferenceRequest
from tritonactor.scheduling.default import Scheduler
from tritonactor.scheduling.messages import Execute, Infer, InstanceGone, InstanceIdle, Rescheduled
from tritonactor.scheduling.sequence_controls import (
    CorrelationId,
    check_correlation_id,
    parse_controls,
)
from tritonactor.scheduling.sequence_iterative import Answered, IterativeSequences
from tritonactor.scheduling.sequence_rows import NULL_REQUEST, STATE_ERROR, RowBuilder
from tritonactor.scheduling.sequence_slots import (
    Lane,
    RunningSequence,
    Waiting,
    direct_rows,
    free_slot,
    oldest_rows,
)
from tritonactor.scheduling.sequence_state import parse_states

__all__ = ["DEFAULT_IDLE_MICROSECONDS", "NULL_REQUEST", "STATE_ERROR", "SequenceBatcher", "Tick"]

# Triton's default for `max_sequence_idle_microseconds`.
DEFAULT_IDLE_MICROSECONDS = 1_000_000


@dataclass(frozen=True, slots=True)
class Tick:
    """From the batcher's own timer: a sequence may have been idle too long, or a batch's
    queue delay may have run out."""

    at: float


SequenceMessage = Infer | InstanceIdle | InstanceGone | Rescheduled | Tick | Answered


class SequenceBatcher(IterativeSequences, Scheduler[SequenceMessage]):
    def __init__(self, name: str, config: ModelConfig, model_dir: Path | None = None) -> None:
        super().__init__(name)
        batching = config.sequence_batching
        assert batching is not None
        self._controls = parse_controls(config)
        states = parse_states(name, config, model_dir)
        policy = config.model_transaction_policy
        if states and policy is not None and policy.decoupled:
            raise unsupported(
                f"model '{name}': implicit state needs one response per request; a decoupled "
                "model cannot keep it"
            )
        idle = batching.max_sequence_idle_microseconds or DEFAULT_IDLE_MICROSECONDS
        self._idle_timeout = idle / 1e6
        self._batching = config.max_batch_size > 0
        self._rows = RowBuilder(
            name,
            self._controls,
            states,
            tuple(tensor.name for tensor in config.output),
            (1, 1) if self._batching else (1,),
        )
        model_batch = self._model_batch = max(1, config.max_batch_size)
        oldest = batching.oldest
        self._oldest = oldest is not None
        if oldest is not None:
            self._slot_count = oldest.max_candidate_sequences or model_batch
            preferred = {size for size in oldest.preferred_batch_size if 0 < size <= model_batch}
            self._preferred = preferred
            self._delay = oldest.max_queue_delay_microseconds / 1e6
            self._min_utilization = 0.0
        else:
            direct = batching.direct
            self._slot_count = model_batch
            self._preferred = set()
            self._delay = direct.max_queue_delay_microseconds / 1e6 if direct else 0.0
            self._min_utilization = direct.minimum_slot_utilization if direct else 0.0
        # Running sequences (not ended nor released), by correlation ID.
        self._sequences: dict[CorrelationId, RunningSequence] = {}
        self._lanes: dict[ActorRef[Any], Lane] = {}
        self._backlog: deque[RunningSequence] = deque()  # sequences waiting for a slot
        self._order = itertools.count()
        self._armed: float | None = None
        self._iterative = batching.iterative_sequence
        # Iterative sequences: the correlation IDs given to requests that have none (from 1, as
        # Triton), and the requests sent to an instance, by id(request), until answered or
        # handed back.
        self._string_ids = any(
            control.datatype == "BYTES"
            for control in self._controls
            if control.kind == ModelSequenceBatchingControlKind.CONTROL_SEQUENCE_CORRID
        )
        self._given_ids = itertools.count(1)
        self._in_flight: dict[int, Waiting] = {}

    # -- messages ------------------------------------------------------------------------------

    def handle_now(self, message: SequenceMessage) -> None:
        if isinstance(message, Infer):
            self._enqueue(message)
        elif isinstance(message, InstanceIdle):
            lane = self._lanes.get(message.instance)
            if lane is None:
                slots: list[RunningSequence | None] = [None] * self._slot_count
                lane = self._lanes[message.instance] = Lane(
                    message.instance, slots, next(self._order)
                )
            lane.idle = True
        elif isinstance(message, InstanceGone):
            self._lose(message.instance)
        elif isinstance(message, Rescheduled):
            self._rerun(message)
        elif isinstance(message, Answered):
            self._request_answered(message.entry)
        elif message.at == self._armed:
            self._armed = None
        now = self.now()
        self._release_idle(now)
        wake = self._dispatch(now)
        self._arm(now, wake)

    def _enqueue(self, item: Infer) -> None:
        request = item.request
        try:
            correlation_id, start, end = self._flags(request)
        except TritonError as error:
            item.reply.fail(refused(error))
            return
        now = self.now()
        sequence = self._sequences.get(correlation_id)
        if sequence is None:
            if not start:
                item.reply.fail(
                    refused(
                        invalid_arg(
                            f"inference request for sequence {correlation_id} to model "
                            f"'{self.name}' must specify the START flag on the first request "
                            "of the sequence"
                        )
                    )
                )
                return
            sequence = RunningSequence(correlation_id, now)
            self._sequences[correlation_id] = sequence
            self._backlog.append(sequence)
        # A START for a running sequence restarts it: the model sees START again, on the same
        # slot, after the sequence's earlier requests (and its state starts over).
        sequence.last = now
        sequence.queue.append(
            Waiting(
                item, sequence, start, end, now, next(self._order), request.inputs, request.outputs
            )
        )
        if end:
            # Ended: a later request for this ID must START a new sequence. The requests
            # already queued keep their slot through `sequence`.
            del self._sequences[correlation_id]

    def _flags(self, request: InferenceRequest) -> tuple[CorrelationId, bool, bool]:
        parameters = request.parameters
        prefix = f"[request id: {request.id or '<id_unknown>'}] "
        correlation_id = parameters.get("sequence_id")
        if correlation_id is None or correlation_id == 0 or correlation_id == "":
            if not self._iterative:
                raise invalid_arg(
                    f"inference request to model '{self.name}' must specify a non-zero or "
                    "non-empty correlation ID"
                )
            # An iterative sequence is one request: without an ID it gets one, and starts. The
            # request carries them, as Triton's does (a model reads its correlation_id()).
            correlation_id = self._new_correlation_id()
            parameters["sequence_id"] = correlation_id
            parameters["sequence_start"] = True
        if isinstance(correlation_id, bool) or not isinstance(correlation_id, int | str):
            raise invalid_arg(
                f"{prefix}parameter 'sequence_id' must be an unsigned integer or a string, "
                f"not {correlation_id!r}"
            )
        if isinstance(correlation_id, int) and not 0 < correlation_id < 2**64:
            raise invalid_arg(
                f"{prefix}parameter 'sequence_id' must be an unsigned 64-bit integer, "
                f"not {correlation_id}"
            )
        flags = []
        for key in ("sequence_start", "sequence_end"):
            value = parameters.get(key, False)
            if not isinstance(value, bool):
                raise invalid_arg(f"{prefix}parameter '{key}' must be a boolean, not {value!r}")
            flags.append(value)
        check_correlation_id(self.name, self._controls, correlation_id)
        if self._batching and batch_size(request) != 1:
            raise invalid_arg(
                f"inference request to model '{self.name}' must specify batch-size 1 due to "
                "requirements of sequence batcher"
            )
        return correlation_id, flags[0], flags[1]

    def _new_correlation_id(self) -> CorrelationId:
        while True:
            number = next(self._given_ids)
            correlation_id: CorrelationId = str(number) if self._string_ids else number
            if correlation_id not in self._sequences:
                return correlation_id

    # -- slots ---------------------------------------------------------------------------------

    def _assign(self) -> bool:
        """Give free slots to backlogged sequences, in arrival order; whether any got one."""
        assigned = False
        while self._backlog:
            place = free_slot(self._lanes.values())
            if place is None:
                break
            sequence = self._backlog.popleft()
            lane, index = place
            lane.slots[index] = sequence
            sequence.lane, sequence.slot = lane, index
            assigned = True
        return assigned

    def _end(self, sequence: RunningSequence) -> None:
        """The sequence is over: its ID may START a new one, its slot is free."""
        if self._sequences.get(sequence.correlation_id) is sequence:
            del self._sequences[sequence.correlation_id]
        self._free(sequence)

    def _free(self, sequence: RunningSequence) -> None:
        """The sequence ended or was released: its slot is free and its state dropped."""
        lane = sequence.lane
        if lane is not None and lane.slots[sequence.slot] is sequence:
            lane.slots[sequence.slot] = None
        sequence.lane, sequence.slot = None, -1
        sequence.saved = None

    # -- dispatch ------------------------------------------------------------------------------

    def _dispatch(self, now: float) -> float | None:
        """Send a batch to every idle instance that has one ready; when to look again (None:
        when something arrives)."""
        self._assign()
        while True:
            wake: float | None = None
            freed = False
            for lane in list(self._lanes.values()):
                if not lane.idle:
                    continue
                heads, dropped_end = self._heads(lane)
                freed |= dropped_end
                if not heads:
                    continue
                if self._oldest:
                    rows, due = oldest_rows(
                        heads, now, self._model_batch, self._delay, self._preferred
                    )
                else:
                    slots = len(lane.slots)
                    rows, due = direct_rows(slots, heads, now, self._delay, self._min_utilization)
                if rows is not None:
                    freed |= self._send(lane, rows, now)
                elif due is not None:
                    wake = due if wake is None else min(wake, due)
            # A slot freed by an END sent (or dropped) goes to the backlog at once: its next
            # request may be ready for an instance still idle.
            if not (freed and self._assign()):
                return wake

    def _heads(self, lane: Lane) -> tuple[dict[int, Waiting], bool]:
        """The first waiting request of each slot's sequence, by slot; and whether dropping
        cancelled requests ended a sequence (freeing its slot)."""
        heads: dict[int, Waiting] = {}
        freed = False
        for index, sequence in enumerate(list(lane.slots)):
            if sequence is None:
                continue
            queue = sequence.queue
            if queue and queue[0].item.request.cancelled:
                # The client gave up while the request waited: run nothing for nobody, and end
                # the sequence, as Triton 2.51 does: its other waiting requests fail CANCELLED
                # too, its slot is free, and its next request must START again.
                queue.popleft().item.reply.fail(
                    cancelled(f"request for model '{self.name}' was cancelled")
                )
                behind = cancelled(
                    f"sequence {sequence.correlation_id} of model '{self.name}' was cancelled "
                    "by an earlier request of it"
                )
                while queue:
                    queue.popleft().item.reply.fail(behind)
                if sequence.running:
                    # an iterative sequence's request still runs in the slot: it ends as that
                    # request is answered (`_request_answered`, `_rerun`)
                    sequence.cancelled = True
                    if self._sequences.get(sequence.correlation_id) is sequence:
                        del self._sequences[sequence.correlation_id]
                else:
                    self._end(sequence)
                    freed = True
                continue
            if queue and sequence.lane is lane:
                heads[index] = queue[0]
        return heads, freed

    def _send(self, lane: Lane, rows: list[Waiting | None], now: float) -> bool:
        """Execute `rows` on the lane's instance; whether an END sent freed a slot."""
        rows_of = self._rows
        prepared = [None if entry is None else rows_of.prepared(entry) for entry in rows]
        first = next(item.request for item in prepared if item is not None)
        batch = [rows_of.null(first) if item is None else item for item in prepared]
        try:
            lane.ref.tell_nowait(Execute(batch))
        except ActorStopped:
            # Its instance is gone (an InstanceGone is on its way); the requests stay queued.
            lane.idle = False
            return False
        lane.idle = False
        freed = False
        for entry in rows:
            if entry is None:
                continue
            sequence = entry.sequence
            sequence.queue.popleft()
            sequence.last = now
            if self._iterative:
                self._watch(entry)  # its slot stays bound until the request is answered
            elif entry.end:
                self._free(sequence)
                freed = True
        return freed

    # -- instances that stop -------------------------------------------------------------------

    def _lose(self, instance: ActorRef[Any]) -> None:
        """The sequences bound to a stopped instance lost their state with it: they are released,
        and their queued requests fail (a later request of them must START again)."""
        lane = self._lanes.pop(instance, None)
        if lane is None:
            return
        for sequence in lane.slots:
            if sequence is None:
                continue
            error = unavailable(
                f"sequence {sequence.correlation_id} of model '{self.name}' was lost: its "
                f"instance '{instance.name}' stopped"
            )
            while sequence.queue:
                sequence.queue.popleft().item.reply.fail(error)
            if self._sequences.get(sequence.correlation_id) is sequence:
                del self._sequences[sequence.correlation_id]
            self._free(sequence)

    # -- idle sequences ------------------------------------------------------------------------

    def _release_idle(self, now: float) -> None:
        """Release every sequence with nothing queued whose last request is older than
        max_sequence_idle_microseconds."""
        for correlation_id, sequence in list(self._sequences.items()):
            if sequence.queue or sequence.running:
                continue
            if now - sequence.last >= self._idle_timeout:
                del self._sequences[correlation_id]
                self._free(sequence)

    def _arm(self, now: float, wake: float | None) -> None:
        """Make sure a timer ticks by `wake` and when the first running sequence could become
        idle."""
        idle = [s.last for s in self._sequences.values() if not (s.queue or s.running)]
        if idle:
            first = min(idle) + self._idle_timeout
            wake = first if wake is None else min(wake, first)
        if wake is None or (self._armed is not None and self._armed <= wake):
            return
        self._armed = wake
        self.tell_later(Tick(wake), wake - now)

    # -- state ---------------------------------------------------------------------------------

    def _waiting(self) -> list[RunningSequence]:
        bound = [s for lane in self._lanes.values() for s in lane.slots if s is not None]
        return [*bound, *self._backlog]

    @property
    def queue_depth(self) -> int:
        return sum(len(sequence.queue) for sequence in self._waiting())

    @property
    def active_sequences(self) -> int:
        return len(self._sequences)

    @property
    def backlog(self) -> int:
        """Sequences waiting for a slot."""
        return len(self._backlog)

    @property
    def idle_instances(self) -> int:
        """Instances ready for a batch that were sent none."""
        return sum(lane.idle for lane in self._lanes.values())

    async def stopped(self) -> None:
        error = self.stopped_error()
        for sequence in self._waiting():
            while sequence.queue:
                sequence.queue.popleft().item.reply.fail(error)
