"""What the control plane's state says to the outside: the repository index and readiness. Pure
functions of the fold (`events.State`)."""

from __future__ import annotations

from dataclasses import dataclass

from tritonactor.control import events as ev


@dataclass(frozen=True, slots=True)
class IndexEntry:
    name: str
    version: str
    state: str
    reason: str


def index(state: ev.State) -> list[IndexEntry]:
    """The repository index: one entry per model version (or per model, when no version loaded)."""
    entries: list[IndexEntry] = []
    for name in sorted(state):
        status = state[name]
        if status.state is not None:
            entries.append(IndexEntry(name, "", status.state.value, status.reason))
        for version, version_status in sorted(status.versions.items()):
            entries.append(
                IndexEntry(name, str(version), version_status.state.value, version_status.reason)
            )
        if status.state is None and not status.versions:
            entries.append(IndexEntry(name, "", "", ""))
    return entries


def ready(state: ev.State) -> bool:
    """Strict readiness, Triton's default: every model that should be loaded is, and every
    version it should serve is READY (versions unloaded on purpose do not count)."""
    for status in state.values():
        if not status.wanted:
            continue
        if status.state is not None:
            return False
        for version in status.versions.values():
            if not version.unloaded and version.state != ev.VersionState.READY:
                return False
    return True
