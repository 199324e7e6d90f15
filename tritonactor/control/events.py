"""Control-plane events and the state they fold into.

Events are facts about the repository and its models. The manager records each one and derives
its state by folding them (`apply`), so the state can always be rebuilt from the record.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from enum import StrEnum


class Source(StrEnum):
    STARTUP = "startup"
    POLL = "poll"
    API = "api"


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
class ModelDiscovered(Event):
    repository: str
    versions: tuple[int, ...]
    config_digest: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadRequested(Event):
    versions: tuple[int, ...]
    source: Source
    config_digest: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelLoaded(Event):
    version: int
    config_digest: str = ""
    load_seconds: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadFailed(Event):
    """`version` is None when the model failed before any version was tried (bad config)."""

    version: int | None
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class UnloadRequested(Event):
    versions: tuple[int, ...]
    source: Source


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelUnloaded(Event):
    version: int
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class InstanceFailed(Event):
    """An instance of a loaded version died; the version is UNAVAILABLE until it is replaced."""

    version: int
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class InstanceRestarted(Event):
    version: int


@dataclass(frozen=True, slots=True)
class VersionStatus:
    state: VersionState
    reason: str = ""


@dataclass(frozen=True, slots=True)
class ModelStatus:
    """What the repository index reports for one model."""

    versions: dict[int, VersionStatus] = field(default_factory=dict)
    # A failure that belongs to no version (a config that does not parse, a duplicate name).
    reason: str = ""
    state: VersionState | None = None


State = dict[str, ModelStatus]


def apply(state: State, event: Event) -> State:
    """The state after `event`: a pure function, `state` is not changed."""
    status = state.get(event.model, ModelStatus())
    versions = dict(status.versions)
    match event:
        case ModelDiscovered():
            return {**state, event.model: status}
        case LoadRequested(versions=wanted):
            for version in wanted:
                versions[version] = VersionStatus(VersionState.LOADING)
            status = ModelStatus(versions)
        case ModelLoaded(version=version):
            versions[version] = VersionStatus(VersionState.READY)
            status = replace(status, versions=versions)
        case LoadFailed(version=None, reason=reason):
            status = ModelStatus(versions, reason, VersionState.UNAVAILABLE)
        case LoadFailed(version=version, reason=reason) if version is not None:
            versions[version] = VersionStatus(VersionState.UNAVAILABLE, reason)
            status = replace(status, versions=versions)
        case InstanceFailed(version=version, reason=reason):
            versions[version] = VersionStatus(VersionState.UNAVAILABLE, reason)
            status = replace(status, versions=versions)
        case InstanceRestarted(version=version):
            versions[version] = VersionStatus(VersionState.READY)
            status = replace(status, versions=versions)
        case UnloadRequested(versions=leaving):
            for version in leaving:
                if version in versions:
                    versions[version] = VersionStatus(VersionState.UNLOADING)
            status = replace(status, versions=versions)
        case ModelUnloaded(version=version, reason=reason):
            versions[version] = VersionStatus(VersionState.UNAVAILABLE, reason or "unloaded")
            status = replace(status, versions=versions)
    return {**state, event.model: status}


def fold(events: list[Event], state: State | None = None) -> State:
    current: State = {} if state is None else state
    for event in events:
        current = apply(current, event)
    return current
