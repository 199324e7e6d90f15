"""What the model manager keeps of each loaded version, and what it takes to let one go: the
memory budget's check and the wait for a retiring version's requests."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import anyio

from tritonactor.actors import ActorRef
from tritonactor.control import events as ev
from tritonactor.scheduling.router import ModelHandle

log = logging.getLogger(__name__)

# How long a retiring version may take to finish its requests before it is stopped anyway.
DRAIN_TIMEOUT_SECONDS = 30.0


class EventLog(Protocol):
    """Where recorded events go besides memory: the durable journal."""

    def append(self, event: ev.Event) -> None: ...


@dataclass(eq=False, slots=True)
class Serving:
    """A loaded version and what it was loaded from, to tell whether a load changes it."""

    ref: ActorRef[Any]
    handle: ModelHandle
    config_digest: str
    files: str  # folder_signature of the version folder
    override: str  # the override's digest, "" without one
    memory: int  # bytes charged against the memory budget
    # The file override's folder it was loaded from, held while it runs (override_folders).
    folder: Path | None = None


@dataclass(eq=False, slots=True)
class Starting:
    """A version up and waiting for the other versions of its load to come up, before any of
    them joins the router (`Loading._start_versions`): what happened to it meanwhile."""

    serving: Serving
    failed: str | None = None  # why its actor failed (the version then failed to load)
    unhealthy: str | None = None  # its latest health news, where it was a failure


def over_budget(serving: dict[str, dict[int, Serving]], budget: int, name: str, extra: int) -> str:
    """Why loading `extra` more bytes of model `name` breaks the memory `budget` (0: none), or
    "" when it does not. Versions being replaced still count: old and new are loaded together
    for a while."""
    if not budget:
        return ""
    used = sum(s.memory for versions in serving.values() for s in versions.values())
    if used + extra <= budget:
        return ""
    return (
        f"loading model '{name}' needs an estimated {extra} bytes (its files) while loaded "
        f"models take {used}: that exceeds TRITONACTOR_MEMORY_BUDGET={budget} bytes"
        if extra
        else f"loaded models take {used} bytes, over TRITONACTOR_MEMORY_BUDGET={budget} bytes"
    )


async def drain(serving: Serving) -> None:
    """Wait until the version has answered every request it was given, a decoupled model's
    final responses included (a retiring version finishes its work), at most
    DRAIN_TIMEOUT_SECONDS."""
    statistics = serving.handle.statistics
    with anyio.move_on_after(DRAIN_TIMEOUT_SECONDS) as scope:
        while statistics.busy > 0:
            await anyio.sleep(0.01)
    if scope.cancelled_caught:
        log.warning(
            "model '%s' version %d still owed answers after %.0fs; stopping it anyway",
            serving.handle.name,
            serving.handle.version,
            DRAIN_TIMEOUT_SECONDS,
        )
