"""What the model manager is asked: its messages, as the server sends them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tritonactor.actors import Reply
from tritonactor.control import events as ev


@dataclass(frozen=True, slots=True)
class Override:
    """What an explicit load asked for instead of the repository's own: a ModelConfig JSON,
    and/or a one-model repository folder holding the override files."""

    config_json: str = ""
    repository: Path | None = None
    digest: str = ""


@dataclass(frozen=True, slots=True)
class Startup:
    """Scan the repositories and load `names` (None: every model); with `restore`, also what
    the journal says was loaded through the API and not unloaded since (explicit mode)."""

    reply: Reply[None]
    names: tuple[str, ...] | None = None
    restore: bool = False


@dataclass(frozen=True, slots=True)
class Load:
    """Load `name`, or reload it when its files, config or override changed (else nothing)."""

    reply: Reply[None]
    name: str
    override: Override | None = None
    source: ev.Source = ev.Source.API


@dataclass(frozen=True, slots=True)
class Unload:
    """Unload a model. The reply comes once its versions stopped; with `wait=False` (a model
    unloading another, or itself, as Triton's non-blocking unload) once they left the router,
    while they finish their requests and stop. (No `unload_dependents`: the ensembles that run
    the model are away with it either way, `Router._show`.)"""

    reply: Reply[None]
    name: str
    source: ev.Source = ev.Source.API
    wait: bool = True


@dataclass(frozen=True, slots=True)
class Discover:
    """Scan the repositories and record the models found that the state does not know yet:
    explicit mode's index lists every model folder there is now, as Triton's does."""

    reply: Reply[None]


@dataclass(frozen=True, slots=True)
class GetState:
    reply: Reply[ev.State]
