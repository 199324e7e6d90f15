"""What the sequence batcher keeps track of — running sequences, their waiting requests, the
instances and their slots — and how it forms one instance's next batch from the first waiting
request of each of its slots (`direct_rows`, `oldest_rows`). Plain data and pure functions: the
actor (`sequence.py`) owns them and decides when to use them."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tritonactor.actors import ActorRef
from tritonactor.core.types import RequestedOutput, Tensor
from tritonactor.scheduling.dynamic import batch_cut
from tritonactor.scheduling.messages import Infer
from tritonactor.scheduling.sequence_controls import CorrelationId
from tritonactor.scheduling.sequence_state import SavedState

__all__ = [
    "Lane",
    "RunningSequence",
    "Waiting",
    "direct_rows",
    "free_slot",
    "oldest_rows",
    "zeros_like",
]


@dataclass(eq=False, slots=True)
class RunningSequence:
    correlation_id: CorrelationId
    last: float  # when a request of it last arrived or was sent to its instance
    queue: deque[Waiting] = field(default_factory=deque)
    lane: Lane | None = None  # the instance whose slot it holds; None while in the backlog
    slot: int = -1
    saved: SavedState | None = None  # implicit state for its next request; None: initial
    # Iterative sequences: its requests sent to the instance and not answered yet (the
    # sequence ends when the last one is answered rather than rescheduled).
    running: int = 0
    # Ended by a cancelled request while one of it still ran: it ends, its slot freed, once
    # that request is answered (a request of it handed back to run again then fails).
    cancelled: bool = False


@dataclass(eq=False, slots=True)
class Waiting:
    item: Infer
    sequence: RunningSequence
    start: bool
    end: bool
    arrived: float
    order: int  # arrival order across sequences
    # The client's own inputs and outputs: each preparation for a batch starts from them.
    inputs: list[Tensor]
    outputs: list[RequestedOutput]
    # Iterative sequences: the batcher watches for its answer (once, however often it runs).
    watched: bool = False


@dataclass(eq=False, slots=True)
class Lane:
    """One instance and its slots (a slot holds the sequence bound to it, or None)."""

    ref: ActorRef[Any]
    slots: list[RunningSequence | None]
    order: int
    idle: bool = True

    def free_slot(self) -> int | None:
        return next((index for index, held in enumerate(self.slots) if held is None), None)

    @property
    def bound(self) -> int:
        return sum(held is not None for held in self.slots)


def free_slot(lanes: Iterable[Lane]) -> tuple[Lane, int] | None:
    """The lowest free slot of any instance (so sequences spread over instances before they
    share one), among equals on the instance with the fewest sequences, idle first."""
    best: tuple[tuple[int, int, bool, int], Lane, int] | None = None
    for lane in lanes:
        index = lane.free_slot()
        if index is None:
            continue
        key = (index, lane.bound, not lane.idle, lane.order)
        if best is None or key < best[0]:
            best = (key, lane, index)
    return None if best is None else (best[1], best[2])


def direct_rows(
    slots: int, heads: dict[int, Waiting], now: float, delay: float, min_utilization: float
) -> tuple[list[Waiting | None] | None, float | None]:
    """Slot i's request at row i; empty slots below the last ready one become null rows (None).
    With a queue delay and a minimum slot utilization, a batch whose share of ready slots is
    below the minimum waits for more, up to the delay since its oldest request: then None and
    when it is due."""
    if delay and min_utilization:
        due = min(entry.arrived for entry in heads.values()) + delay
        if len(heads) / slots < min_utilization and now < due:
            return None, due
    return [heads.get(index) for index in range(max(heads) + 1)], None


def oldest_rows(
    heads: dict[int, Waiting], now: float, limit: int, delay: float, preferred: set[int]
) -> tuple[list[Waiting | None] | None, float | None]:
    """One request per sequence, oldest first, up to `limit` of them, cut by the dynamic
    batcher's rule (`batch_cut`: Triton's Oldest strategy batches with a dynamic batcher): else
    None and when it is due."""
    ordered = sorted(heads.values(), key=lambda entry: entry.order)
    batch: list[Waiting | None] = list(ordered[:limit])
    count = len(batch)
    best = max((size for size in preferred if size <= count), default=0)
    grown = len(ordered) > limit or count >= max(preferred, default=0)
    taken, due = batch_cut(count, best, grown, delay, heads.values(), now)
    return (batch[:taken] if taken else None), due


def zeros_like(tensor: Tensor) -> Tensor:
    if tensor.datatype == "BYTES":
        data = np.full(tensor.data.shape, b"", dtype=object)
    else:
        data = np.zeros_like(tensor.data)
    return Tensor(tensor.name, tensor.datatype, tensor.shape, data)
