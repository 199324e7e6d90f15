"""Triton's sequence batcher: each sequence of requests, named by its correlation ID, holds a
slot of one instance from its first request until its END request is sent, so that a stateful
model sees the whole sequence, in order, on one instance. Strategy `direct` gives each slot its
own batch row; `oldest` batches the oldest ready sequences of an instance together. The rules
are written down in docs/scheduling.md ("The sequence batcher")."""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import numpy as np

from tritonactor._proto.inference import ModelConfig
from tritonactor.actors import Actor, ActorRef, ActorStopped, Reply
from tritonactor.backends.batching import batch_size
from tritonactor.core.errors import TritonError, cancelled, invalid_arg, unavailable, unsupported
from tritonactor.core.types import InferenceRequest, InferenceResponse, RequestedOutput, Tensor
from tritonactor.scheduling.messages import Execute, Infer, InstanceGone, InstanceIdle
from tritonactor.scheduling.sequence_controls import (
    NULL_ROW,
    CorrelationId,
    Row,
    check_correlation_id,
    parse_controls,
)
from tritonactor.scheduling.sequence_state import (
    SavedState,
    parse_states,
    requested_outputs,
    take_states,
)

# Triton's default for `max_sequence_idle_microseconds`.
DEFAULT_IDLE_MICROSECONDS = 1_000_000

# Set in the context of the requests that fill an empty slot of a direct batch: they answer
# nobody, and statistics should not count them.
NULL_REQUEST = "sequence_null_request"
# Set on a request whose response the batcher refused (no state output): its execute failed,
# though the instance saw a response.
STATE_ERROR = "sequence_state_error"


@dataclass(frozen=True, slots=True)
class Tick:
    """From the batcher's own timer: a sequence may have been idle too long, or a batch's
    queue delay may have run out."""

    at: float


SequenceMessage = Infer | InstanceIdle | InstanceGone | Tick


@dataclass(eq=False, slots=True)
class _Sequence:
    correlation_id: CorrelationId
    last: float  # when a request of it last arrived or was sent to its instance
    queue: deque[_Waiting] = field(default_factory=deque)
    lane: _Lane | None = None  # the instance whose slot it holds; None while in the backlog
    slot: int = -1
    saved: SavedState | None = None  # implicit state for its next request; None: initial


@dataclass(eq=False, slots=True)
class _Waiting:
    item: Infer
    sequence: _Sequence
    start: bool
    end: bool
    arrived: float
    order: int  # arrival order across sequences
    # The client's own inputs and outputs: each preparation for a batch starts from them.
    inputs: list[Tensor]
    outputs: list[RequestedOutput]


@dataclass(eq=False, slots=True)
class _Lane:
    """One instance and its slots (a slot holds the sequence bound to it, or None)."""

    ref: ActorRef[Any]
    slots: list[_Sequence | None]
    order: int
    idle: bool = True

    def free_slot(self) -> int | None:
        return next((index for index, held in enumerate(self.slots) if held is None), None)

    @property
    def bound(self) -> int:
        return sum(held is not None for held in self.slots)


class SequenceBatcher(Actor[SequenceMessage]):
    mailbox_size = 1024

    def __init__(self, name: str, config: ModelConfig, model_dir: Path | None = None) -> None:
        super().__init__(name)
        batching = config.sequence_batching
        assert batching is not None
        self._controls = parse_controls(name, config)
        self._control_names = {control.name for control in self._controls}
        self._states = parse_states(name, config, model_dir)
        policy = config.model_transaction_policy
        if self._states and policy is not None and policy.decoupled:
            raise unsupported(
                f"model '{name}': implicit state needs one response per request; a decoupled "
                "model cannot keep it"
            )
        self._config_outputs = tuple(tensor.name for tensor in config.output)
        idle = batching.max_sequence_idle_microseconds or DEFAULT_IDLE_MICROSECONDS
        self._idle_timeout = idle / 1e6
        self._batching = config.max_batch_size > 0
        self._row_shape: tuple[int, ...] = (1, 1) if self._batching else (1,)
        model_batch = max(1, config.max_batch_size)
        oldest = batching.oldest
        self._oldest = oldest is not None
        if oldest is not None:
            self._slot_count = oldest.max_candidate_sequences or model_batch
            preferred = {size for size in oldest.preferred_batch_size if 0 < size <= model_batch}
            self._preferred = preferred
            # As the dynamic batcher: never past the largest preferred size.
            self._cap = max(preferred) if preferred else model_batch
            self._delay = oldest.max_queue_delay_microseconds / 1e6
            self._min_utilization = 0.0
        else:
            direct = batching.direct
            self._slot_count = model_batch
            self._preferred = set()
            self._cap = model_batch
            self._delay = direct.max_queue_delay_microseconds / 1e6 if direct else 0.0
            self._min_utilization = direct.minimum_slot_utilization if direct else 0.0
        self._sequences: dict[CorrelationId, _Sequence] = {}  # running: not ended nor released
        self._lanes: dict[ActorRef[Any], _Lane] = {}
        self._backlog: deque[_Sequence] = deque()  # sequences waiting for a slot
        self._order = itertools.count()
        self._armed: float | None = None

    # -- messages ------------------------------------------------------------------------------

    async def receive(self, message: SequenceMessage) -> None:
        if isinstance(message, Infer):
            self._enqueue(message)
        elif isinstance(message, InstanceIdle):
            lane = self._lanes.get(message.instance)
            if lane is None:
                slots: list[_Sequence | None] = [None] * self._slot_count
                lane = self._lanes[message.instance] = _Lane(
                    message.instance, slots, next(self._order)
                )
            lane.idle = True
        elif isinstance(message, InstanceGone):
            self._lose(message.instance)
        elif message.at == self._armed:
            self._armed = None
        now = anyio.current_time()
        self._release_idle(now)
        wake = self._dispatch(now)
        self._arm(now, wake)

    def _enqueue(self, item: Infer) -> None:
        request = item.request
        try:
            correlation_id, start, end = self._flags(request)
        except TritonError as error:
            item.reply.fail(error)
            return
        now = anyio.current_time()
        sequence = self._sequences.get(correlation_id)
        if sequence is None:
            if not start:
                item.reply.fail(
                    invalid_arg(
                        f"inference request for sequence {correlation_id} to model "
                        f"'{self.name}' must specify the START flag on the first request of "
                        "the sequence"
                    )
                )
                return
            sequence = _Sequence(correlation_id, now)
            self._sequences[correlation_id] = sequence
            self._backlog.append(sequence)
        # A START for a running sequence restarts it: the model sees START again, on the same
        # slot, after the sequence's earlier requests (and its state starts over).
        sequence.last = now
        sequence.queue.append(
            _Waiting(
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
            raise invalid_arg(
                f"inference request to model '{self.name}' must specify a non-zero or "
                "non-empty correlation ID"
            )
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

    # -- slots ---------------------------------------------------------------------------------

    def _assign(self) -> bool:
        """Give free slots to backlogged sequences, in arrival order; whether any got one."""
        assigned = False
        while self._backlog:
            place = self._free_slot()
            if place is None:
                break
            sequence = self._backlog.popleft()
            lane, index = place
            lane.slots[index] = sequence
            sequence.lane, sequence.slot = lane, index
            assigned = True
        return assigned

    def _free_slot(self) -> tuple[_Lane, int] | None:
        """The lowest free slot of any instance (so sequences spread over instances before
        they share one), among equals on the instance with the fewest sequences, idle first."""
        best: tuple[tuple[int, int, bool, int], _Lane, int] | None = None
        for lane in self._lanes.values():
            index = lane.free_slot()
            if index is None:
                continue
            key = (index, lane.bound, not lane.idle, lane.order)
            if best is None or key < best[0]:
                best = (key, lane, index)
        return None if best is None else (best[1], best[2])

    def _free(self, sequence: _Sequence) -> None:
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
                    rows, due = self._oldest_rows(heads, now)
                else:
                    rows, due = self._direct_rows(lane, heads, now)
                if rows is not None:
                    freed |= self._send(lane, rows, now)
                elif due is not None:
                    wake = due if wake is None else min(wake, due)
            # A slot freed by an END sent (or dropped) goes to the backlog at once: its next
            # request may be ready for an instance still idle.
            if not (freed and self._assign()):
                return wake

    def _heads(self, lane: _Lane) -> tuple[dict[int, _Waiting], bool]:
        """The first waiting request of each slot's sequence, by slot; and whether dropping
        cancelled requests ended a sequence (freeing its slot)."""
        heads: dict[int, _Waiting] = {}
        freed = False
        for index, sequence in enumerate(list(lane.slots)):
            if sequence is None:
                continue
            queue = sequence.queue
            while queue and queue[0].item.request.cancelled:
                # The client gave up while the request waited: run nothing for nobody. The
                # sequence goes on (a later request of it still finds its slot).
                entry = queue.popleft()
                entry.item.reply.fail(cancelled(f"request for model '{self.name}' was cancelled"))
                if entry.end:
                    self._free(sequence)
                    freed = True
            if queue and sequence.lane is lane:
                heads[index] = queue[0]
        return heads, freed

    def _direct_rows(
        self, lane: _Lane, heads: dict[int, _Waiting], now: float
    ) -> tuple[list[_Waiting | None] | None, float | None]:
        """Slot i's request at row i; empty slots below the last ready one become null rows.
        With a queue delay and a minimum slot utilization, a batch whose share of ready slots
        is below the minimum waits for more, up to the delay since its oldest request."""
        if self._delay and self._min_utilization:
            oldest = min(entry.arrived for entry in heads.values())
            due = oldest + self._delay
            if len(heads) / len(lane.slots) < self._min_utilization and now < due:
                return None, due
        return [heads.get(index) for index in range(max(heads) + 1)], None

    def _oldest_rows(
        self, heads: dict[int, _Waiting], now: float
    ) -> tuple[list[_Waiting | None] | None, float | None]:
        """One request per sequence, oldest first, up to the cap; sent when full, else once
        the oldest has waited max_queue_delay (cut to the largest preferred size that fits)."""
        batch: list[_Waiting | None] = list(
            sorted(heads.values(), key=lambda entry: entry.order)[: self._cap]
        )
        if len(batch) >= self._cap:
            return batch, None
        due = min(entry.arrived for entry in heads.values()) + self._delay
        if now < due:
            return None, due
        preferred = max((size for size in self._preferred if size <= len(batch)), default=0)
        return (batch[:preferred] if preferred else batch), None

    def _send(self, lane: _Lane, rows: list[_Waiting | None], now: float) -> bool:
        """Execute `rows` on the lane's instance; whether an END sent freed a slot."""
        prepared = [None if entry is None else self._prepared(entry) for entry in rows]
        first = next(item.request for item in prepared if item is not None)
        batch = [self._null(first) if item is None else item for item in prepared]
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
            if entry.end:
                self._free(sequence)
                freed = True
        return freed

    def _prepared(self, entry: _Waiting) -> Infer:
        """The request as the model sees it: its inputs, its row's controls, and its states."""
        request = entry.item.request
        sequence = entry.sequence
        row = Row(entry.start, entry.end, True, sequence.correlation_id)
        # Built from the client's tensors each time: a batch that could not be sent is built
        # again later without doubling them.
        request.inputs = [*entry.inputs, *row.tensors(self._controls, self._row_shape)]
        if not self._states:
            return entry.item
        if entry.start:
            sequence.saved = None  # a (re)start begins from the initial state
        saved = sequence.saved or {}
        for spec in self._states:
            state = saved.get(spec.input_name)
            request.inputs.append(spec.initial_tensor() if state is None else state)
        request.outputs, hidden = requested_outputs(
            self._states, entry.outputs, self._config_outputs
        )
        inner: Reply[InferenceResponse] = Reply()
        inner.add_done_callback(
            partial(self._answered, request, entry.item.reply, sequence, hidden)
        )
        return replace(entry.item, reply=inner)

    def _answered(
        self,
        request: InferenceRequest,
        outer: Reply[InferenceResponse],
        sequence: _Sequence,
        hidden: frozenset[str],
        inner: Reply[InferenceResponse],
    ) -> None:
        """Keep the state the model output, then answer the client. Runs on the event loop when
        the instance answers, before it reports idle: the sequence's next request, which only
        that instance runs, is built after this."""
        try:
            response = inner.result()
        except BaseException as error:
            outer.fail(error)
            return
        try:
            response, saved = take_states(self.name, self._states, response, hidden)
        except TritonError as error:
            # Seen by the statistics, which account for the execute after this answer.
            request.context[STATE_ERROR] = error
            outer.fail(error)
            return
        if sequence.lane is not None:  # not ended or released meanwhile
            sequence.saved = saved
        outer.set(response)

    def _null(self, like: InferenceRequest) -> Infer:
        """A request for an empty slot: zeros of the shapes of `like` (a real request of the
        batch, states included), not ready; its answer goes nowhere."""
        inputs = [_zeros_like(t) for t in like.inputs if t.name not in self._control_names]
        inputs += NULL_ROW.tensors(self._controls, self._row_shape)
        request = InferenceRequest(
            model_name=like.model_name,
            model_version=like.model_version,
            inputs=inputs,
            outputs=[RequestedOutput(output.name) for output in like.outputs],
            resolved_version=like.resolved_version,
            context={NULL_REQUEST: True},
        )
        return Infer(request, Reply())

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
            if not sequence.queue and now - sequence.last >= self._idle_timeout:
                del self._sequences[correlation_id]
                self._free(sequence)

    def _arm(self, now: float, wake: float | None) -> None:
        """Make sure a timer ticks by `wake` and when the first running sequence could become
        idle."""
        idle = [s.last for s in self._sequences.values() if not s.queue]
        if idle:
            first = min(idle) + self._idle_timeout
            wake = first if wake is None else min(wake, first)
        if wake is None or (self._armed is not None and self._armed <= wake):
            return
        self._armed = wake
        self.tell_later(Tick(wake), wake - now)

    # -- state ---------------------------------------------------------------------------------

    def _waiting(self) -> list[_Sequence]:
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

    async def stopped(self) -> None:
        error = unavailable(f"model '{self.name}' is unloading; the request was not run")
        for sequence in self._waiting():
            while sequence.queue:
                sequence.queue.popleft().item.reply.fail(error)


def _zeros_like(tensor: Tensor) -> Tensor:
    if tensor.datatype == "BYTES":
        data = np.full(tensor.data.shape, b"", dtype=object)
    else:
        data = np.zeros_like(tensor.data)
    return Tensor(tensor.name, tensor.datatype, tensor.shape, data)
