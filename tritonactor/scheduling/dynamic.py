"""Triton's dynamic batcher: requests wait a little in priority queues so that several of them
run as one batch on whichever instance is idle. The rules are written down in docs/scheduling.md."""

from __future__ import annotations

import heapq
import itertools
import math
import operator
from collections import deque
from collections.abc import Hashable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from tritonactor._proto.inference import (
    ModelConfig,
    ModelQueuePolicy,
    ModelQueuePolicyTimeoutAction,
)
from tritonactor.actors import ActorRef, ActorStopped, Reply
from tritonactor.backends.batching import batch_size, shape_key
from tritonactor.core.errors import TritonError, cancelled, invalid_arg, refused, unavailable
from tritonactor.core.types import InferenceRequest, InferenceResponse
from tritonactor.scheduling.default import Scheduler, refuse_rescheduled
from tritonactor.scheduling.messages import Execute, Infer, InstanceGone, InstanceIdle, Rescheduled


@dataclass(frozen=True, slots=True)
class Tick:
    """From the batcher's own timer: a queue delay or a request's timeout may have run out."""

    at: float


BatcherMessage = Infer | InstanceIdle | InstanceGone | Rescheduled | Tick
_GONE = operator.attrgetter("gone")


@dataclass(slots=True, eq=False)
class _Waiting:
    item: Infer
    level: int  # index into the batcher's levels
    size: int
    shape: Hashable
    arrived: float
    deadline: float  # math.inf: no timeout
    delayed: bool = False
    # Left the queue (batched, rejected or dropped): deques drop such entries lazily.
    gone: bool = False


class _Level:
    """One priority level's queue and the policy that governs it. A request whose timeout ran
    out under DELAY moves to `delayed`, served after every request still in `queue`."""

    __slots__ = ("count", "default_timeout", "delayed", "override", "queue", "reject", "size")

    def __init__(self, policy: ModelQueuePolicy | None) -> None:
        policy = policy or ModelQueuePolicy()
        self.size = policy.max_queue_size
        self.default_timeout = policy.default_timeout_microseconds
        self.override = policy.allow_timeout_override
        self.reject = policy.timeout_action == ModelQueuePolicyTimeoutAction.REJECT
        self.queue: deque[_Waiting] = deque()
        self.delayed: deque[_Waiting] = deque()
        self.count = 0

    def waiting(self) -> Iterator[_Waiting]:
        for entry in itertools.chain(self.queue, self.delayed):
            if not entry.gone:
                yield entry

    def trim(self) -> None:
        for waiting in (self.queue, self.delayed):
            while waiting and waiting[0].gone:
                waiting.popleft()


def batch_cut(
    scanned: int,
    best: int,
    grown: bool,
    delay: float,
    waiting: Iterable[Any],
    now: float,
) -> tuple[int, float | None]:
    """Triton's rule (its `GetDynamicBatch`) once the queue is scanned: how many of the
    `scanned` requests go now, or 0 and when to look again. `best`: the prefix to send while the
    queue delay runs (0: none); `grown`: the scanned requests can grow no more, or reached the
    largest preferred size; `waiting`: the scanned requests (their `arrived`, for the delay).
    With no delay to wait the best prefix goes, else all of them; while the delay of the oldest
    runs, the best prefix goes (or all, grown), else none; once it has run out, all."""
    if not delay:
        return best or scanned, None
    if not best and grown:
        return scanned, None
    due = min(entry.arrived for entry in waiting) + delay
    if now < due:
        return best, (None if best else due)
    return scanned, None


class DynamicBatcher(Scheduler[BatcherMessage]):
    def __init__(self, name: str, config: ModelConfig) -> None:
        super().__init__(name)
        batching = config.dynamic_batching
        assert batching is not None
        # A model that does not batch (max_batch_size 0) still has the batcher's queues, its
        # priorities and policies, as in Triton: each request is a batch of its own.
        self._batching = config.max_batch_size > 0
        self._max_batch_size = max(1, config.max_batch_size)
        self._preferred = {s for s in batching.preferred_batch_size if s <= config.max_batch_size}
        # (0 without preferred sizes: each request is a batch of its own, as in Triton.)
        self._max_preferred = max(self._preferred, default=0)
        self._delay = batching.max_queue_delay_microseconds / 1e6
        self._levels_count = batching.priority_levels
        if self._levels_count:
            # in [1, priority_levels]: config/validate.py refuses a config where it is not
            self._default_level = batching.default_priority_level
            policies = batching.priority_queue_policy
            default = batching.default_queue_policy
            self._levels = [
                _Level(policies.get(level, default)) for level in range(1, self._levels_count + 1)
            ]
        else:
            self._default_level = 1
            self._levels = [_Level(batching.default_queue_policy)]
        # Every level's queues in service order (each level's in time first, then its delayed).
        self._queues = [queue for level in self._levels for queue in (level.queue, level.delayed)]
        self._idle: deque[ActorRef[Any]] = deque()
        self._deadlines: list[tuple[float, int, _Waiting]] = []
        self._order = itertools.count()
        self._armed: float | None = None  # when the pending timer ticks
        self._preserve_ordering = batching.preserve_ordering
        # preserve_ordering: answers held until every earlier batched request is answered.
        self._held: dict[int, tuple[Reply[InferenceResponse], Reply[InferenceResponse]]] = {}
        self._next_sent = 0
        self._next_released = 0

    # -- messages ------------------------------------------------------------------------------

    def handle_now(self, message: BatcherMessage) -> None:
        if isinstance(message, Infer):
            self._enqueue(message)
        elif isinstance(message, InstanceIdle):
            self._idle.append(message.instance)
        elif isinstance(message, InstanceGone):
            if message.instance in self._idle:
                self._idle.remove(message.instance)
        elif isinstance(message, Rescheduled):
            refuse_rescheduled(message, self.name)
        elif message.at == self._armed:
            self._armed = None
        self._dispatch()

    def _enqueue(self, item: Infer) -> None:
        request = item.request
        try:
            level = self._level_of(request)
            timeout = self._timeout_of(request, self._levels[level - 1])
        except TritonError as error:
            item.reply.fail(refused(error))
            return
        queue = self._levels[level - 1]
        if queue.size and queue.count >= queue.size:
            prefix = f"[request id: {request.id or '<id_unknown>'}] "
            item.reply.fail(refused(unavailable(f"{prefix}Exceeds maximum queue size")))
            return
        now = self.now()
        deadline = now + timeout if timeout else math.inf
        size = batch_size(request) if self._batching else 1
        entry = _Waiting(item, level - 1, size, shape_key(request), now, deadline)
        queue.queue.append(entry)
        queue.count += 1
        if timeout:
            heapq.heappush(self._deadlines, (deadline, next(self._order), entry))

    def _level_of(self, request: InferenceRequest) -> int:
        """1 is the highest priority; a missing, 0 or out-of-range priority gets the default
        level, as in Triton."""
        value = request.parameters.get("priority")
        if value is None or not self._levels_count:
            return self._default_level
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise invalid_arg(
                f"[request id: {request.id or '<id_unknown>'}] parameter 'priority' must be "
                f"an unsigned integer, not {value!r}"
            )
        return value if 1 <= value <= self._levels_count else self._default_level

    @staticmethod
    def _timeout_of(request: InferenceRequest, level: _Level) -> float:
        """Seconds the request may wait before its timeout action (0: no timeout). A request's
        own `timeout` (microseconds) counts only where the policy allows it, and may only
        shorten the default: with no default timeout there is none to shorten (Triton 2.51)."""
        timeout = level.default_timeout
        value = request.parameters.get("timeout")
        if value is not None and level.override:
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise invalid_arg(
                    f"[request id: {request.id or '<id_unknown>'}] parameter 'timeout' must be "
                    f"an unsigned integer of microseconds, not {value!r}"
                )
            if value and value < timeout:
                timeout = value
        return timeout / 1e6

    # -- batching ------------------------------------------------------------------------------

    def _dispatch(self) -> None:
        now = self.now()
        self._expire(now)
        wake: float | None = None
        while self._idle:
            batch, wake = self._next_batch(now)
            if batch is None:
                break
            instance = self._idle.popleft()
            marks = self._next_sent
            try:
                instance.tell_nowait(Execute([self._sent(entry.item) for entry in batch]))
            except ActorStopped:
                # That instance is gone; the batch stays queued for another one.
                for index in range(marks, self._next_sent):
                    self._held.pop(index, None)
                self._next_sent = marks
                continue
            for entry in batch:
                self._leave(entry)
        self._arm(wake, now)

    def _next_batch(self, now: float) -> tuple[list[_Waiting] | None, float | None]:
        """The batch to send now, or None and when to look again (None: when something
        arrives), by Triton's rules. Requests are taken in service order while they fit
        `max_batch_size` and share the first one's shape (a request that cannot join is never
        overtaken by later ones that could). While the queue delay runs, the longest prefix
        whose size is a preferred size goes at once (or, when the requests outgrow the largest
        preferred size before one was reached, those before that); once the delay has run
        out, or when the batch can grow no more, all of it goes."""
        batch: list[_Waiting] = []
        total = 0
        best = 0  # the length of the prefix to send while the delay runs (0: none yet)
        full = False
        dropped: list[_Waiting] = []
        limit, largest, preferred = self._max_batch_size, self._max_preferred, self._preferred
        for entry in self._in_order():
            if entry.item.request.cancelled:
                dropped.append(entry)
                continue
            if batch:
                grown = total + entry.size
                if grown > largest and not best:
                    best = len(batch)
                if grown > limit or entry.shape != batch[0].shape:
                    full = True
                    break
            batch.append(entry)
            total += entry.size
            if total in preferred:
                best = len(batch)
        for entry in dropped:
            # The client gave up while the request waited: run nothing for nobody.
            self._leave(entry)
            entry.item.reply.fail(cancelled(f"request for model '{self.name}' was cancelled"))
        if not batch:
            return None, None
        taken, due = batch_cut(len(batch), best, full or total >= largest, self._delay, batch, now)
        if not taken:
            return None, due
        return (batch if taken == len(batch) else batch[:taken]), None

    def _in_order(self) -> Iterator[_Waiting]:
        # (Iterated in C: a generator's frame resumed per waiting request cost two calls a
        # request each time a batch is looked for.)
        return itertools.filterfalse(_GONE, itertools.chain.from_iterable(self._queues))

    def _leave(self, entry: _Waiting) -> None:
        entry.gone = True
        level = self._levels[entry.level]
        level.count -= 1
        level.trim()

    def _expire(self, now: float) -> None:
        """Apply the timeout action to every request whose timeout ran out."""
        deadlines = self._deadlines
        while deadlines and (deadlines[0][2].gone or deadlines[0][0] <= now):
            _, _, entry = heapq.heappop(deadlines)
            if entry.gone:
                continue
            level = self._levels[entry.level]
            if level.reject:
                self._leave(entry)
                entry.item.reply.fail(unavailable("Request timeout expired"))
            else:
                # DELAY: it stays queued, behind every request of its level still in time.
                entry.gone = True
                level.delayed.append(replace(entry, delayed=True, gone=False, deadline=math.inf))
                level.trim()

    def _arm(self, wake: float | None, now: float) -> None:
        """Make sure a timer ticks by `wake` and by the earliest request timeout."""
        if self._deadlines:
            first = self._deadlines[0][0]
            wake = first if wake is None else min(wake, first)
        if wake is None or (self._armed is not None and self._armed <= wake):
            return
        self._armed = wake
        self.tell_later(Tick(wake), wake - now)

    # -- preserve_ordering ---------------------------------------------------------------------

    def _sent(self, item: Infer) -> Infer:
        if not self._preserve_ordering:
            return item
        index = self._next_sent
        self._next_sent += 1
        inner: Reply[InferenceResponse] = Reply()
        self._held[index] = (item.reply, inner)
        inner.add_done_callback(self._release)
        return replace(item, reply=inner)  # the rest (its arrival time) unchanged

    def _release(self, _: Reply[InferenceResponse]) -> None:
        # Runs on the event loop when an instance answers (no await in between): answers go
        # out in the order their requests were batched.
        while self._next_released in self._held:
            outer, inner = self._held[self._next_released]
            if not inner.done:
                return
            del self._held[self._next_released]
            self._next_released += 1
            try:
                outer.set(inner.result())
            except BaseException as error:
                outer.fail(error)

    # -- state ---------------------------------------------------------------------------------

    @property
    def queue_depth(self) -> int:
        return sum(level.count for level in self._levels)

    async def stopped(self) -> None:
        error = self.stopped_error()
        for level in self._levels:
            for entry in level.waiting():
                entry.gone = True
                entry.item.reply.fail(error)
            level.count = 0
