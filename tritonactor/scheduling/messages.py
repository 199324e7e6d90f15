"""Messages of the data plane: what the router, schedulers and instances tell each other."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from tritonactor.actors import ActorRef, Reply
from tritonactor.core.types import InferenceRequest, InferenceResponse


@dataclass(frozen=True, slots=True)
class Infer:
    """A request for a scheduler; answered with the response or failed with a TritonError.
    `arrival_ns` (`time.perf_counter_ns`) is when it reached the router: the statistics measure
    queueing and the whole request from there."""

    request: InferenceRequest
    reply: Reply[InferenceResponse]
    arrival_ns: int = field(default_factory=time.perf_counter_ns)


@dataclass(frozen=True, slots=True)
class Execute:
    """A batch for an instance: each request is answered through its own reply."""

    batch: list[Infer]

    @property
    def replies(self) -> list[Reply[InferenceResponse]]:
        """Its requests' replies (an actor that stops with it queued fails them)."""
        return [item.reply for item in self.batch]


@dataclass(frozen=True, slots=True)
class InstanceIdle:
    """An instance is ready for its next batch (sent once at start and after every batch)."""

    instance: ActorRef[Any]


@dataclass(frozen=True, slots=True)
class Rescheduled:
    """The model released a request with Triton's RESCHEDULE flag (`backends.base.RESCHEDULE`):
    the instance hands it back to its scheduler to run again. A sequence batcher with
    `iterative_sequence` runs it next in its sequence's slot; other schedulers fail it."""

    item: Infer

    @property
    def replies(self) -> tuple[Reply[InferenceResponse]]:
        """Its request's reply (a scheduler that stops with it queued fails it)."""
        return (self.item.reply,)


@dataclass(frozen=True, slots=True)
class InstanceGone:
    """An instance stopped or failed: the scheduler must not hand it work again."""

    instance: ActorRef[Any]


@dataclass(frozen=True, slots=True)
class VersionHealth:
    """A model-version actor tells its owner that an instance died (ready False, with the
    reason) or that a replacement is serving again (ready True)."""

    model: str
    version: int
    ready: bool
    reason: str = ""
    # The model-version actor that sent it: after a reload, the old copy still draining may
    # report too, and its health is not the version's.
    sender: ActorRef[Any] | None = None
