"""What the control plane's state says to the outside: the repository index and readiness. Pure
functions of the fold (`events.State`)."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from tritonactor.control import events as ev


@dataclass(frozen=True, slots=True)
class IndexEntry:
    name: str
    version: str
    state: str
    reason: str


def index(state: ev.State, away: Collection[tuple[str, int]] = ()) -> list[IndexEntry]:
    """The repository index: one entry per model version (or per model, when no version loaded),
    and one named "" when a restart could not vouch for what the API had loaded
    (`unrestored`). `away`: (name, version) of the loaded ensemble versions a step model of
    which does not serve (`Router.hidden`): UNAVAILABLE, "unloaded", as Triton lists them."""
    entries: list[IndexEntry] = []
    for name in sorted(state):
        status = state[name]
        if name == ev.UNNAMED and status.state is None:
            continue  # a doubt no restart has reported (yet): nothing to list
        if status.state is not None:
            entries.append(IndexEntry(name, "", status.state.value, status.reason))
        for version, version_status in sorted(status.versions.items()):
            state_name, reason = version_status.state.value, version_status.reason
            if (name, version) in away and version_status.state == ev.VersionState.READY:
                state_name, reason = ev.VersionState.UNAVAILABLE.value, "unloaded"
            entries.append(IndexEntry(name, str(version), state_name, reason))
        if status.state is None and not status.versions and status.discovered:
            # (a model that is only what an earlier start's API load asked, in no repository
            # now and not loaded: not listed, as Triton lists its repositories' folders)
            entries.append(IndexEntry(name, "", "", ""))
    return entries


def ready(state: ev.State) -> bool:
    """Strict readiness, Triton's default: every version a model that should be loaded should
    serve is READY (versions unloaded on purpose do not count). A model that failed before any
    version was tried (a config that does not parse, a name in two repositories, a name no
    repository holds) has no version to wait for: as in Triton, it does not hold readiness
    back; one whose version policy selects no version does (Triton has it, with no version),
    and so does one a restart could not restore, until the API settles it (`unrestored`)."""
    for status in state.values():
        if not status.wanted:
            continue
        if status.state is not None and (status.unsure or status.versionless):
            return False
        for version in status.versions.values():
            if not version.unloaded and version.state != ev.VersionState.READY:
                return False
    return True


def unrestored(state: ev.State, loading: Iterable[str]) -> list[tuple[str, str]]:
    """(model, reason) for each model a restart in explicit mode cannot restore for sure: a
    journal line about it could not be read (`ModelStatus.unsure`), and the rest of the journal
    does not say to load it (nor does the startup list: `loading`). The manager records each as
    a failed load, so that the index shows it UNAVAILABLE with the reason and strict readiness
    waits until an API load or unload settles it. A bad line that names no model is reported
    under the name "" (`events.UNNAMED`): any API load or unload settles that one."""
    skip = set(loading)
    return [
        (name, _unrestored_reason(name, status.unsure))
        for name, status in sorted(state.items())
        if status.unsure and name not in skip
    ]


def _unrestored_reason(name: str, doubt: str) -> str:
    if name == ev.UNNAMED:  # the line named no model: its index entry has no name either
        return (
            f"not fully restored: {doubt} and names no model; a model loaded or unloaded "
            "through the API before this start may not be restored as it was. Any load through "
            "the API, or unload of a model this server knows, settles this"
        )
    return (
        f"not restored: {doubt}; it may have been loaded through the API before this start. "
        "Load or unload it to settle this"
    )
