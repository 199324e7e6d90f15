"""The model manager: the control-plane actor that turns the repository into loaded models.

It records every step as an event (see `events`), derives the repository index from them, owns
one `ModelVersionActor` per loaded version, and tells the router which versions are ready.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from tritonactor._proto.inference import ModelConfig
from tritonactor.actors import Actor, ActorRef, Reply
from tritonactor.backends.base import Backend, ModelContext
from tritonactor.backends.registry import BackendRegistry
from tritonactor.config.model_config import ConfigError
from tritonactor.config.normalize import fill_defaults
from tritonactor.control import events as ev
from tritonactor.control.repository import (
    ModelSource,
    config_digest,
    scan_repositories,
    select_versions,
    version_path,
)
from tritonactor.core.devices import gpu_count
from tritonactor.core.errors import TritonError
from tritonactor.scheduling.messages import VersionHealth
from tritonactor.scheduling.model import ModelVersionActor
from tritonactor.scheduling.router import ModelHandle, Router
from tritonactor.scheduling.signature import ModelSignature

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LoadAll:
    """Scan the repositories and load their models: all of them, or only `names` when given
    (explicit mode's startup list)."""

    reply: Reply[None]
    names: tuple[str, ...] | None = None
    source: ev.Source = ev.Source.STARTUP


@dataclass(frozen=True, slots=True)
class GetState:
    reply: Reply[ev.State]


@dataclass(frozen=True, slots=True)
class IndexEntry:
    name: str
    version: str
    state: str
    reason: str


class ModelManager(Actor[Any]):
    def __init__(
        self,
        repositories: tuple[Path, ...],
        registry: BackendRegistry,
        router: Router,
        strict_model_config: bool = False,
    ) -> None:
        super().__init__("model-manager")
        self._repositories = repositories
        self._registry = registry
        self._router = router
        self._strict = strict_model_config
        self.events: list[ev.Event] = []
        self.state: ev.State = {}
        self._versions: dict[ActorRef[Any], tuple[str, int]] = {}

    def _record(self, event: ev.Event) -> None:
        self.events.append(event)
        self.state = ev.apply(self.state, event)
        if isinstance(event, ev.LoadFailed):
            log.error("failed to load '%s': %s", event.model, event.reason)
        elif isinstance(event, ev.InstanceFailed):
            log.error("model '%s' version %d: %s", event.model, event.version, event.reason)
        elif isinstance(event, ev.ModelLoaded):
            log.info(
                "loaded '%s' version %d in %.2fs", event.model, event.version, event.load_seconds
            )

    async def receive(self, message: Any) -> None:
        match message:
            case LoadAll(reply, names, source):
                await self._load_all(names, source)
                reply.set(None)
            case GetState(reply):
                reply.set(self.state)
            case VersionHealth(model, version, ready, reason):
                if ready:
                    self._record(ev.InstanceRestarted(model=model, version=version))
                else:
                    self._record(ev.InstanceFailed(model=model, version=version, reason=reason))

    async def _load_all(self, names: tuple[str, ...] | None, source: ev.Source) -> None:
        found = await anyio.to_thread.run_sync(scan_repositories, self._repositories)
        self._router.known.update(found)
        for name in names or ():
            if name not in found:
                reason = f"model '{name}' is not in any model repository"
                self._record(ev.LoadFailed(model=name, version=None, reason=reason))
        wanted = [m for m in found.values() if names is None or m.name in names]
        async with anyio.create_task_group() as group:
            for model in wanted:
                group.start_soon(self._load_model, model, source)

    async def _load_model(self, model: ModelSource, source: ev.Source) -> None:
        self._record(
            ev.ModelDiscovered(
                model=model.name, repository=str(model.repository), versions=model.versions
            )
        )
        if model.error is not None or model.config is None:
            self._record(ev.LoadFailed(model=model.name, version=None, reason=str(model.error)))
            return
        try:
            versions = _versions_to_load(model)
        except ConfigError as error:
            self._record(ev.LoadFailed(model=model.name, version=None, reason=_reason(error)))
            return
        self._record(ev.LoadRequested(model=model.name, versions=versions, source=source))
        try:
            backend, config = await anyio.to_thread.run_sync(
                self._prepare, model, model.config, versions[-1]
            )
        except Exception as error:  # whatever goes wrong, only this model fails
            # Reported against each version it was to load, as Triton's index does.
            for version in versions:
                self._record(
                    ev.LoadFailed(model=model.name, version=version, reason=_reason(error))
                )
            return
        digest = config_digest(config)
        async with anyio.create_task_group() as group:
            for version in versions:
                group.start_soon(self._load_version, model, backend, config, version, digest)

    def _prepare(
        self, model: ModelSource, config: ModelConfig, latest: int
    ) -> tuple[Backend, ModelConfig]:
        """The backend and the complete config (auto-completed, Triton's defaults filled)."""
        if self._strict and not model.has_config_file:
            raise ConfigError(
                f"model '{model.name}' has no config.pbtxt, and strict model configuration "
                "is on (TRITONACTOR_STRICT_MODEL_CONFIG) so it cannot be auto-completed"
            )
        name = self._registry.backend_name(config, model.path, list(model.versions))
        backend = self._registry.get(name)
        if not self._strict:
            config = backend.auto_complete_config(config, version_path(model, latest))
        config = fill_defaults(config, gpu_count())
        config.backend = config.backend or name
        config.default_model_filename = (
            config.default_model_filename or backend.default_model_filename
        )
        return backend, config

    async def _load_version(
        self,
        model: ModelSource,
        backend: Backend,
        config: ModelConfig,
        version: int,
        digest: str,
    ) -> None:
        directory = version_path(model, version)
        filename = config.default_model_filename
        context = ModelContext(
            name=model.name,
            version=version,
            config=config,
            model_dir=model.path,
            version_dir=directory,
            model_path=directory / filename,
        )
        if filename and not context.model_path.exists():
            reason = f"unable to find '{context.model_path}' for model '{model.name}'"
            self._record(ev.LoadFailed(model=model.name, version=version, reason=reason))
            return
        started = time.perf_counter()
        actor = ModelVersionActor(backend, context, infer=self._router.infer)
        try:
            ref = await self.spawn(actor)
        except Exception as error:
            self._record(ev.LoadFailed(model=model.name, version=version, reason=_reason(error)))
            return
        assert actor.scheduler is not None
        self._versions[ref] = (model.name, version)
        self._router.add(
            ModelHandle(
                model.name,
                version,
                config,
                ModelSignature.from_config(config),
                actor.scheduler,
                actor.statistics,
            )
        )
        self._record(
            ev.ModelLoaded(
                model=model.name,
                version=version,
                config_digest=digest,
                load_seconds=time.perf_counter() - started,
            )
        )

    async def on_child_failed(self, child: ActorRef[Any], error: BaseException) -> None:
        name, version = self._versions.pop(child)
        self._router.remove(name, version)
        reason = f"model version stopped serving: {_reason(error)}"
        self._record(ev.LoadFailed(model=name, version=version, reason=reason))


def _versions_to_load(model: ModelSource) -> tuple[int, ...]:
    assert model.config is not None
    selection = select_versions(model.config, model.versions)
    for missing in selection.missing:
        log.warning(
            "version %d is specified for model '%s', but its folder is not present",
            missing,
            model.name,
        )
    if not selection.versions:
        raise ConfigError(
            f"at least one version must be available under the version policy of model "
            f"'{model.name}'"
        )
    return selection.versions


def _reason(error: BaseException) -> str:
    if isinstance(error, TritonError):
        return error.message
    if isinstance(error, ConfigError):
        return str(error)
    return f"{type(error).__name__}: {error}"


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
