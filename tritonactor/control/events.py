"""Control-plane events and the state they fold into.

Events are facts about the repository and its models. The manager records each one (in the
journal, see `journal`) and derives its state by folding them (`apply`), so the state can always
be rebuilt from the record: after a restart, `ServerStarted` forgets what was loaded but keeps
what was asked for, which is what explicit mode loads again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from enum import StrEnum


class Source(StrEnum):
    STARTUP = "startup"
    POLL = "poll"
    API = "api"
    REQUEST = "request"  # lazy loading: an inference request for a model not loaded yet


class VersionState(StrEnum):
    LOADING = "LOADING"
    READY = "READY"
    UNLOADING = "UNLOADING"
    UNAVAILABLE = "UNAVAILABLE"


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    model: str
    time: float = field(default_factory=time.time)


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerStarted(Event):
    """A server began with this journal (`model` is ""): nothing is loaded any more."""

    mode: str
    repositories: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelDiscovered(Event):
    repository: str
    versions: tuple[int, ...]
    config_digest: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadRequested(Event):
    """`config_override` (ModelConfig JSON) and `override_repository` (the folder holding the
    override files) are what an API load asked for, kept so a restart can ask again."""

    versions: tuple[int, ...]
    source: Source
    config_digest: str = ""
    reason: str = ""
    config_override: str = ""
    override_repository: str = ""
    options_digest: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelLoaded(Event):
    version: int
    config_digest: str = ""
    load_seconds: float = 0.0
    memory_bytes: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadFailed(Event):
    """`version` is None when the model failed before any version was tried (bad config).
    `serving`: a reload failed, and what was loaded before goes on serving. `versionless`: its
    config was read and its version policy selects no version (Triton then has the model, with
    no version to serve: strict readiness waits for it)."""

    version: int | None
    reason: str
    serving: bool = False
    versionless: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class UnloadRequested(Event):
    """Versions are to leave. `reason` empty: the unload was asked (by the API, the watcher);
    else why they leave unasked: a load whose version policy no longer selects them (`source`
    is that load's), the model's folder gone. Only an asked API unload ends what the API asked
    for the model."""

    versions: tuple[int, ...]
    source: Source
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelUnloaded(Event):
    version: int
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class VersionReplaced(Event):
    """The copy of a version that a reload replaced has finished its requests and stopped (its
    successor was serving since its ModelLoaded)."""

    version: int
    drain_seconds: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelRemoved(Event):
    """The model's folder left every repository: it is no longer listed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class InstanceFailed(Event):
    """An instance of a loaded version died; the version is UNAVAILABLE until it is replaced."""

    version: int
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class InstanceRestarted(Event):
    version: int


@dataclass(frozen=True, slots=True, kw_only=True)
class JournalLineSkipped(Event):
    """Never recorded: what a journal line that cannot be read replays as, at its place (see
    `journal`). `models`: the model names the line still shows; `kind`: its event type, if
    that can be read. What the line said of those models' API loads is lost, so a restart does
    not know whether to restore them (`ModelStatus.unsure`). `model` is the first name, or ""."""

    line: int
    reason: str
    models: tuple[str, ...] = ()
    kind: str = ""


# The `kind` of a line that holds nothing but white space (a stray edit): no record was lost.
BLANK_LINE = "(blank line)"

# Events that say nothing of what the API asked for: a line of one of these types that cannot be
# read leaves no doubt about what to restore.
_NO_REQUEST_KINDS = frozenset(
    {
        BLANK_LINE,
        "ModelDiscovered",
        "ModelUnloaded",
        "VersionReplaced",
        "InstanceFailed",
        "InstanceRestarted",
        "JournalLineSkipped",
        "ServerStarted",
    }
)


def asks_nothing(kind: str) -> bool:
    """Whether a line of this event type, unreadable, can have lost nothing the API asked."""
    return kind in _NO_REQUEST_KINDS


# Where the fold keeps the doubt a bad line leaves when it names no model that can be read (cut
# short, or its "model" is not a string): no model's name, so no folder's. A restart in explicit
# mode reports it as not restored (`index.unrestored`), which keeps strict readiness false
# until an API load or unload, of any model, after that report settles it.
UNNAMED = ""


@dataclass(frozen=True, slots=True)
class VersionStatus:
    state: VersionState
    reason: str = ""
    # Unloaded on purpose (unload request, version policy, model removed): readiness skips it.
    unloaded: bool = False


@dataclass(frozen=True, slots=True)
class Requested:
    """An explicit load in force: what a restarted server in explicit mode loads again."""

    config_override: str = ""
    override_repository: str = ""
    options_digest: str = ""


@dataclass(frozen=True, slots=True)
class ModelStatus:
    """What the repository index reports for one model, and what was asked of it."""

    versions: dict[int, VersionStatus] = field(default_factory=dict)
    # A failure that belongs to no version (a config that does not parse, a duplicate name).
    reason: str = ""
    state: VersionState | None = None
    # Whether the model should be loaded now (readiness waits for it).
    wanted: bool = False
    requested: Requested | None = None
    # An API load not yet loaded: it replaces `requested` once a version of it loads, and is
    # dropped when it fails (a failed reload leaves the request in force as it was).
    pending: Requested | None = None
    # Why what the API asked of this model is not known for sure: a journal line about it could
    # not be read (`JournalLineSkipped`). Kept across restarts until an API load or unload of
    # the model settles it.
    unsure: str = ""
    # Its failure (`state`) is that its version policy selects no version (`versionless`).
    versionless: bool = False
    # A repository holds it (since this start): `ModelDiscovered`.
    discovered: bool = False


State = dict[str, ModelStatus]


def apply(state: State, event: Event) -> State:
    """The state after `event`: a pure function, `state` is not changed."""
    if isinstance(event, ServerStarted):
        return {
            name: ModelStatus(requested=status.requested, unsure=status.unsure)
            for name, status in state.items()
            if status.requested is not None or status.unsure
        }
    if isinstance(event, JournalLineSkipped):
        if asks_nothing(event.kind):
            return state
        doubt = f"line {event.line} of the journal could not be read ({event.reason})"
        changed = dict(state)
        # A line that names no model may have been any model's API load or unload.
        for name in event.models or (UNNAMED,):
            changed[name] = replace(state.get(name, ModelStatus()), unsure=doubt)
        return changed
    if isinstance(event, ModelRemoved):
        return {name: status for name, status in state.items() if name != event.model}
    status = state.get(event.model, ModelStatus())
    versions = dict(status.versions)
    match event:
        case ModelDiscovered():
            return {**state, event.model: replace(status, discovered=True)}
        case LoadRequested(versions=wanted, source=source):
            for version in wanted:
                # A reload leaves a serving version READY: it serves until its successor does.
                if versions.get(version, _NONE).state != VersionState.READY:
                    versions[version] = VersionStatus(VersionState.LOADING)
            pending = None
            requested = status.requested
            if source == Source.API:
                asked = Requested(
                    event.config_override, event.override_repository, event.options_digest
                )
                if wanted:
                    pending = asked  # in force once a version of it loads
                else:
                    # Nothing to load (the versions serve as asked, or only leave): nothing
                    # after this record can fail it, so it is in force now.
                    requested = asked
            # An API load settles what a line that could not be read left in doubt.
            unsure = "" if source == Source.API else status.unsure
            status = ModelStatus(
                versions,
                wanted=True,
                requested=requested,
                pending=pending,
                unsure=unsure,
                discovered=status.discovered,  # (lost, each load recorded it again)
            )
        case ModelLoaded(version=version):
            versions[version] = VersionStatus(VersionState.READY)
            requested = status.requested if status.pending is None else status.pending
            status = replace(status, versions=versions, requested=requested, pending=None)
        case LoadFailed(serving=True, version=version, reason=reason) if (
            version is not None and versions.get(version, _NONE).state != VersionState.READY
        ):
            # A version that did not serve failed; those that serve go on (the index lists
            # both, as Triton's: a broken version 2 beside version 1 serving).
            versions[version] = VersionStatus(VersionState.UNAVAILABLE, reason)
            status = replace(status, versions=versions, pending=None)
        case LoadFailed(serving=True):
            status = replace(status, pending=None)
        case LoadFailed(version=None, reason=reason, versionless=versionless):
            status = replace(
                status,
                versions=versions,
                reason=reason,
                state=VersionState.UNAVAILABLE,
                wanted=True,
                versionless=versionless,
            )
        case LoadFailed(version=version, reason=reason) if version is not None:
            versions[version] = VersionStatus(VersionState.UNAVAILABLE, reason)
            status = replace(status, versions=versions, wanted=True)
        case InstanceFailed(version=version, reason=reason):
            versions[version] = VersionStatus(VersionState.UNAVAILABLE, reason)
            status = replace(status, versions=versions)
        case InstanceRestarted(version=version):
            versions[version] = VersionStatus(VersionState.READY)
            status = replace(status, versions=versions)
        case UnloadRequested(versions=leaving, source=source, reason=reason):
            for version in leaving:
                if version in versions:
                    versions[version] = VersionStatus(VersionState.UNLOADING)
            status = replace(status, versions=versions)
            # (A load's version policy dropping a version is no unload of the model: before
            # 2026-12-07 such a record, API-sourced, made the next restart forget the model.)
            if source == Source.API and not reason:
                if status.unsure:  # its failure was the report of the doubt: settled now
                    status = replace(status, state=None, reason="")
                status = replace(status, wanted=False, requested=None, pending=None, unsure="")
        case ModelUnloaded(version=version, reason=reason):
            versions[version] = VersionStatus(
                VersionState.UNAVAILABLE, reason or "unloaded", unloaded=True
            )
            status = replace(status, versions=versions)
    changed = {**state, event.model: status}
    if isinstance(event, LoadRequested | UnloadRequested) and event.source == Source.API:
        # A doubt that names no model is settled by what the API asks once a restart has
        # reported it (`LoadFailed` gave it a state), not by the requests that came after the
        # bad line before that restart.
        nameless = changed.get(UNNAMED)
        if nameless is not None and nameless.state is not None:
            del changed[UNNAMED]
    return changed


_NONE = VersionStatus(VersionState.UNAVAILABLE)


def fold(events: list[Event], state: State | None = None) -> State:
    current: State = {} if state is None else state
    for event in events:
        current = apply(current, event)
    return current
