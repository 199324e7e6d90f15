"""Triton's sequence batcher (strategy `direct`; `oldest` is served the same way for now): each
sequence of requests, named by its correlation ID, is bound to one instance from its START
request to its END request, so that a stateful model sees the whole sequence in order. The
rules are written down in docs/scheduling.md ("The sequence batcher")."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import anyio
import numpy as np

from tritonactor._proto.inference import ModelConfig, ModelSequenceBatchingControlKind
from tritonactor.actors import Actor, ActorRef, ActorStopped
from tritonactor.core.datatypes import config_to_wire, to_numpy_dtype
from tritonactor.core.errors import cancelled, invalid_arg, unavailable, unsupported
from tritonactor.core.types import InferenceRequest, Tensor
from tritonactor.scheduling.messages import Execute, Infer, InstanceGone, InstanceIdle

# Triton's default for `max_sequence_idle_microseconds`.
DEFAULT_IDLE_MICROSECONDS = 1_000_000

CorrelationId = int | str


@dataclass(frozen=True, slots=True)
class Tick:
    """From the batcher's own timer: some sequence may have been idle too long."""

    at: float


SequenceMessage = Infer | InstanceIdle | InstanceGone | Tick


@dataclass(eq=False, slots=True)
class _Sequence:
    correlation_id: CorrelationId
    last: float  # when a request of it last arrived or was sent to its instance
    instance: ActorRef[Any] | None = None  # bound on its first dispatch
    queued: int = 0  # requests of it waiting in the batcher


@dataclass(eq=False, slots=True)
class _Waiting:
    item: Infer
    sequence: _Sequence
    start: bool
    end: bool


@dataclass(frozen=True, slots=True)
class _Control:
    """One control input: its tensor's wire data type and the values for false and true (for
    CORRID, `values` is empty: the tensor holds the correlation ID)."""

    name: str
    kind: ModelSequenceBatchingControlKind
    datatype: str
    values: tuple[Any, Any] | tuple[()] = field(default=())


def _controls(name: str, config: ModelConfig) -> list[_Control]:
    batching = config.sequence_batching
    assert batching is not None
    inputs = {tensor.name for tensor in config.input}
    controls: list[_Control] = []
    for control_input in batching.control_input:
        if control_input.name in inputs:
            raise invalid_arg(
                f"model '{name}': control input '{control_input.name}' is also a model input"
            )
        if len(control_input.control) != 1:
            raise invalid_arg(
                f"model '{name}': control input '{control_input.name}' must have exactly one "
                f"control, not {len(control_input.control)}"
            )
        control = control_input.control[0]
        kind = control.kind
        if kind == ModelSequenceBatchingControlKind.CONTROL_SEQUENCE_CORRID:
            if control.data_type.name in ("TYPE_INVALID", None):
                raise invalid_arg(
                    f"model '{name}': CORRID control input '{control_input.name}' must "
                    "specify a data_type"
                )
            datatype = config_to_wire(str(control.data_type.name))
            if datatype not in ("UINT64", "INT64", "UINT32", "INT32", "BYTES"):
                raise invalid_arg(
                    f"model '{name}': CORRID control input '{control_input.name}' has "
                    f"unsupported data_type {control.data_type.name}"
                )
            controls.append(_Control(control_input.name, kind, datatype))
            continue
        options = [
            ("INT32", list(control.int32_false_true)),
            ("FP32", list(control.fp32_false_true)),
            ("BOOL", list(control.bool_false_true)),
        ]
        given = [(datatype, values) for datatype, values in options if values]
        if len(given) != 1 or len(given[0][1]) != 2:
            raise invalid_arg(
                f"model '{name}': control input '{control_input.name}' must give exactly two "
                "values (false, true) in one of int32_false_true, fp32_false_true, "
                "bool_false_true"
            )
        datatype, values = given[0]
        controls.append(_Control(control_input.name, kind, datatype, (values[0], values[1])))
    return controls


class SequenceBatcher(Actor[SequenceMessage]):
    mailbox_size = 1024

    def __init__(self, name: str, config: ModelConfig) -> None:
        super().__init__(name)
        batching = config.sequence_batching
        assert batching is not None
        if batching.state:
            raise unsupported(
                f"model '{name}': implicit state is not supported yet (sequence_batching.state)"
            )
        self._controls = _controls(name, config)
        idle = batching.max_sequence_idle_microseconds or DEFAULT_IDLE_MICROSECONDS
        self._idle_timeout = idle / 1e6
        self._batch_dims: tuple[int, ...] = (1, 1) if config.max_batch_size > 0 else (1,)
        self._queue: deque[_Waiting] = deque()
        self._sequences: dict[CorrelationId, _Sequence] = {}
        # Every instance serving (idle or busy), with how many sequences are bound to it.
        self._bound: dict[ActorRef[Any], int] = {}
        self._idle: deque[ActorRef[Any]] = deque()
        self._armed: float | None = None

    # -- messages ------------------------------------------------------------------------------

    async def receive(self, message: SequenceMessage) -> None:
        if isinstance(message, Infer):
            self._enqueue(message)
        elif isinstance(message, InstanceIdle):
            self._bound.setdefault(message.instance, 0)
            self._idle.append(message.instance)
        elif isinstance(message, InstanceGone):
            self._lose(message.instance)
        elif message.at == self._armed:
            self._armed = None
        now = anyio.current_time()
        self._release_idle(now)
        self._dispatch(now)
        self._arm(now)

    def _enqueue(self, item: Infer) -> None:
        request = item.request
        try:
            correlation_id, start, end = self._flags(request)
        except Exception as error:
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
        # A START for a running sequence restarts it: the model sees START again, on the same
        # instance (so its earlier requests still run first).
        sequence.last = now
        sequence.queued += 1
        if end:
            # Ended: a later request for this ID must START a new sequence. The requests
            # already queued keep their binding through `sequence`.
            del self._sequences[correlation_id]
        self._queue.append(_Waiting(item, sequence, start, end))

    def _flags(self, request: InferenceRequest) -> tuple[CorrelationId, bool, bool]:
        parameters = request.parameters
        correlation_id = parameters.get("sequence_id")
        if correlation_id is None or correlation_id == 0 or correlation_id == "":
            raise invalid_arg(
                f"inference request to model '{self.name}' must specify a non-zero or "
                "non-empty correlation ID"
            )
        if isinstance(correlation_id, bool) or not isinstance(correlation_id, int | str):
            raise invalid_arg(
                f"[request id: {request.id or '<id_unknown>'}] parameter 'sequence_id' must be "
                f"an unsigned integer or a string, not {correlation_id!r}"
            )
        if isinstance(correlation_id, int) and not 0 < correlation_id < 2**64:
            raise invalid_arg(
                f"[request id: {request.id or '<id_unknown>'}] parameter 'sequence_id' must be "
                f"an unsigned 64-bit integer, not {correlation_id}"
            )
        flags = []
        for key in ("sequence_start", "sequence_end"):
            value = parameters.get(key, False)
            if not isinstance(value, bool):
                raise invalid_arg(
                    f"[request id: {request.id or '<id_unknown>'}] parameter '{key}' must be "
                    f"a boolean, not {value!r}"
                )
            flags.append(value)
        for control in self._controls:
            if control.kind == ModelSequenceBatchingControlKind.CONTROL_SEQUENCE_CORRID:
                if isinstance(correlation_id, str) and control.datatype != "BYTES":
                    raise invalid_arg(
                        f"inference request to model '{self.name}' has the string correlation "
                        f"ID '{correlation_id}', but the model expects a {control.datatype} one"
                    )
                if isinstance(correlation_id, int) and control.datatype != "BYTES":
                    info = np.iinfo(to_numpy_dtype(control.datatype))
                    if not info.min <= correlation_id <= info.max:
                        raise invalid_arg(
                            f"inference request to model '{self.name}': correlation ID "
                            f"{correlation_id} does not fit the model's {control.datatype} "
                            "CORRID control"
                        )
        return correlation_id, flags[0], flags[1]

    # -- dispatch ------------------------------------------------------------------------------

    def _dispatch(self, now: float) -> None:
        """Walk the queue in arrival order; send each request whose sequence's instance is idle,
        skipping (for now) every later request of a sequence that had to wait."""
        if not self._idle or not self._queue:
            return
        waiting: set[int] = set()  # ids of sequences with an earlier request still queued
        kept: deque[_Waiting] = deque()
        while self._queue:
            entry = self._queue.popleft()
            sequence = entry.sequence
            if id(sequence) in waiting or not self._idle:
                waiting.add(id(sequence))
                kept.append(entry)
                continue
            if entry.item.request.cancelled:
                # The client gave up while the request waited: run nothing for nobody. The
                # sequence goes on (a later request of it still finds its instance).
                self._done(entry)
                entry.item.reply.fail(cancelled(f"request for model '{self.name}' was cancelled"))
                continue
            if sequence.instance is None and not self._bind(sequence):
                waiting.add(id(sequence))
                kept.append(entry)
                continue
            instance = sequence.instance
            if instance not in self._idle:
                waiting.add(id(sequence))
                kept.append(entry)
                continue
            self._with_controls(entry)
            try:
                instance.tell_nowait(Execute([entry.item]))
            except ActorStopped:
                # Its instance is gone (an InstanceGone is on its way): wait for it.
                waiting.add(id(sequence))
                kept.append(entry)
                continue
            self._idle.remove(instance)
            sequence.last = now
            self._done(entry)
        self._queue = kept

    def _bind(self, sequence: _Sequence) -> bool:
        """Bind a new sequence to the serving instance with the fewest sequences (an idle one
        first among equals)."""
        if not self._bound:
            return False
        idle = set(self._idle)
        instance = min(self._bound, key=lambda ref: (self._bound[ref], ref not in idle))
        sequence.instance = instance
        self._bound[instance] += 1
        return True

    def _done(self, entry: _Waiting) -> None:
        """`entry` left the queue; an ended sequence frees its slot once nothing of it waits."""
        sequence = entry.sequence
        sequence.queued -= 1
        if (
            entry.end
            and sequence.queued == 0
            and self._sequences.get(sequence.correlation_id) is not sequence
        ):
            self._unbind(sequence)

    def _unbind(self, sequence: _Sequence) -> None:
        instance = sequence.instance
        if instance is not None and instance in self._bound:
            self._bound[instance] -= 1
        sequence.instance = None

    def _with_controls(self, entry: _Waiting) -> None:
        request = entry.item.request
        if not self._controls:
            return
        tensors = [self._control_tensor(control, entry) for control in self._controls]
        # A new list: the caller's request object keeps its own inputs untouched.
        request.inputs = [*request.inputs, *tensors]

    def _control_tensor(self, control: _Control, entry: _Waiting) -> Tensor:
        kind = control.kind
        if kind == ModelSequenceBatchingControlKind.CONTROL_SEQUENCE_CORRID:
            value: Any = entry.sequence.correlation_id
            if control.datatype == "BYTES":
                data = np.array([str(value).encode()], dtype=object).reshape(self._batch_dims)
                return Tensor(control.name, "BYTES", self._batch_dims, data)
        else:
            if kind == ModelSequenceBatchingControlKind.CONTROL_SEQUENCE_START:
                flag = entry.start
            elif kind == ModelSequenceBatchingControlKind.CONTROL_SEQUENCE_END:
                flag = entry.end
            else:  # READY: the request sent is always ready
                flag = True
            value = control.values[1 if flag else 0]
        dtype = to_numpy_dtype(control.datatype)
        data = np.full(self._batch_dims, value, dtype=dtype)
        return Tensor(control.name, control.datatype, self._batch_dims, data)

    # -- instances that stop -------------------------------------------------------------------

    def _lose(self, instance: ActorRef[Any]) -> None:
        """The sequences bound to a stopped instance lost their state with it: they are released,
        and their queued requests fail (a later request of them must START again)."""
        if instance in self._idle:
            self._idle.remove(instance)
        self._bound.pop(instance, None)
        lost = {id(s) for s in self._sequences.values() if s.instance is instance}
        lost |= {id(e.sequence) for e in self._queue if e.sequence.instance is instance}
        if not lost:
            return
        for correlation_id in [c for c, s in self._sequences.items() if id(s) in lost]:
            del self._sequences[correlation_id]
        kept: deque[_Waiting] = deque()
        for entry in self._queue:
            if id(entry.sequence) in lost:
                entry.item.reply.fail(
                    unavailable(
                        f"sequence {entry.sequence.correlation_id} of model '{self.name}' was "
                        f"lost: its instance '{instance.name}' stopped"
                    )
                )
            else:
                kept.append(entry)
        self._queue = kept

    # -- idle sequences ------------------------------------------------------------------------

    def _release_idle(self, now: float) -> None:
        """Release every sequence with nothing queued whose last request is older than
        max_sequence_idle_microseconds."""
        for correlation_id, sequence in list(self._sequences.items()):
            if sequence.queued == 0 and now - sequence.last >= self._idle_timeout:
                del self._sequences[correlation_id]
                self._unbind(sequence)

    def _arm(self, now: float) -> None:
        """Make sure a timer ticks when the first running sequence could become idle."""
        candidates = [s.last for s in self._sequences.values() if s.queued == 0]
        if not candidates:
            return
        wake = min(candidates) + self._idle_timeout
        if self._armed is not None and self._armed <= wake:
            return
        self._armed = wake
        self.tell_later(Tick(wake), wake - now)

    # -- state ---------------------------------------------------------------------------------

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    @property
    def active_sequences(self) -> int:
        return len(self._sequences)

    async def stopped(self) -> None:
        error = unavailable(f"model '{self.name}' is unloading; the request was not run")
        while self._queue:
            self._queue.popleft().item.reply.fail(error)
