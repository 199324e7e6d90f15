"""The model manager: the control-plane actor that turns the repository into loaded models.

Every step is an event (see `events`), appended to the journal and folded into the state the
repository index reports. The manager owns one `ModelVersionActor` per loaded version and tells
the router which versions serve. A (re)load brings the new version to READY before the router
switches to it; the version it replaces is retired in the background: it finishes what it was
given, then stops. Work on one model is serialised by a lock of its own, so the mailbox stays
free (an index or a readiness probe is answered during a long load) and models load in parallel.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Iterable
from pathlib import Path
from typing import Any

import anyio

from tritonactor._proto.inference import ModelConfig
from tritonactor.actors import Actor, ActorRef, Reply
from tritonactor.backends.base import Backend
from tritonactor.backends.registry import BackendRegistry
from tritonactor.cache import check_model_config
from tritonactor.config.model_config import ConfigError
from tritonactor.control import events as ev
from tritonactor.control.budget import files_size, process_tree_rss
from tritonactor.control.index import unrestored
from tritonactor.control.load_plan import (
    load_failed,
    load_requested,
    override_of,
    step_cycle,
    versions_to_load,
    with_config,
)
from tritonactor.control.messages import Discover, GetState, Load, Override, Startup, Unload
from tritonactor.control.model_control import ManagerControl
from tritonactor.control.operations import OperationTraces
from tritonactor.control.override_folders import hold, release
from tritonactor.control.prepare import (
    failure_reason,
    missing_model_file,
    model_context,
    prepare_config,
)
from tritonactor.control.repository import (
    ModelSource,
    config_digest,
    folder_signature,
    scan_repositories,
    version_path,
)
from tritonactor.control.retiring import Retiring
from tritonactor.control.serving import EventLog, Serving, over_budget
from tritonactor.control.watcher import RepositoryChanged
from tritonactor.core.devices import gpu_count
from tritonactor.core.errors import TritonError, internal, invalid_arg
from tritonactor.observability.tracing import Tracing
from tritonactor.scheduling.messages import VersionHealth
from tritonactor.scheduling.model import ModelVersionActor
from tritonactor.scheduling.router import ModelHandle, Router
from tritonactor.scheduling.signature import ModelSignature, label_stamp

log = logging.getLogger(__name__)


class ModelManager(Retiring, Actor[Any]):
    def __init__(
        self,
        repositories: tuple[Path, ...],
        registry: BackendRegistry,
        router: Router,
        *,
        strict_model_config: bool = False,
        journal: EventLog | None = None,
        history: Iterable[ev.Event] = (),
        mode: str = "none",
        lazy: bool = False,
        memory_budget: int = 0,
        tracing: Tracing | None = None,
    ) -> None:
        super().__init__("model-manager")
        self._repositories = repositories
        self._registry = registry
        self._router = router
        self._strict = strict_model_config
        self._journal = journal
        self._mode = mode
        self._lazy = lazy
        self._budget = memory_budget
        # The record itself is the journal's; only its fold is kept here.
        self.state: ev.State = ev.fold(history)
        self._serving: dict[str, dict[int, Serving]] = {}
        self._owners: dict[ActorRef[Any], tuple[str, int]] = {}
        self._locks: dict[str, anyio.Lock] = {}
        self._operations = OperationTraces(tracing)
        # The traced operation in progress on each model (one at a time: the model's lock).

    async def started(self) -> None:
        self._record(
            ev.ServerStarted(
                model="", mode=self._mode, repositories=tuple(map(str, self._repositories))
            )
        )

    def _record(self, event: ev.Event) -> None:
        if self._journal is not None:
            try:
                self._journal.append(event)
            except OSError as error:
                # The record is lost, the model is not: serving goes on, loudly.
                log.error("could not append to the journal: %s (event %r)", error, event)
        self.state = ev.apply(self.state, event)
        self._operations.saw(event)
        if isinstance(event, ev.LoadFailed):
            kept = " (the loaded version goes on serving)" if event.serving else ""
            log.error("failed to load '%s': %s%s", event.model, event.reason, kept)
        elif isinstance(event, ev.InstanceFailed):
            log.error("model '%s' version %d: %s", event.model, event.version, event.reason)
        elif isinstance(event, ev.ModelLoaded):
            log.info(
                "loaded '%s' version %d in %.2fs", event.model, event.version, event.load_seconds
            )
        elif isinstance(event, ev.ModelUnloaded):
            log.info("unloaded '%s' version %d", event.model, event.version)

    # -- messages ------------------------------------------------------------------------------

    async def receive(self, message: Any) -> None:
        match message:
            case Startup():
                self.start_soon(self._answer, message.reply, self._startup(message))
            case Load(reply, name, override, source):
                self.start_soon(self._answer, reply, self._load(name, override, source))
            case Unload(reply, name, dependents, source, wait=True):
                self.start_soon(self._answer, reply, self._unload(name, dependents, source))
            case Unload(reply, name, dependents, source):
                self.start_soon(self._answer_early, reply, name, dependents, source)
            case RepositoryChanged(names):
                # The watcher's report: each model is loaded, reloaded or unloaded to match.
                for name in sorted(names):
                    self.start_soon(self._quietly, self._load(name, None, ev.Source.POLL))
            case Discover(reply):
                self.start_soon(self._answer, reply, self._discover())
            case GetState(reply):
                reply.set(self.state)
            case VersionHealth(model, version, ready, reason, sender):
                serving = self._serving.get(model, {}).get(version)
                if serving is None or serving.ref is not sender:
                    return  # a copy that no longer serves (retiring after a reload)
                if ready:
                    self._record(ev.InstanceRestarted(model=model, version=version))
                else:
                    self._record(ev.InstanceFailed(model=model, version=version, reason=reason))

    @staticmethod
    async def _answer(reply: Reply[None], work: Awaitable[None]) -> None:
        try:
            await work
        except TritonError as error:
            reply.fail(error)
        except Exception as error:
            log.exception("control-plane operation failed")
            reply.fail(internal(failure_reason(error)))
        else:
            reply.set(None)

    async def _answer_early(
        self, reply: Reply[None], name: str, dependents: bool, source: ev.Source
    ) -> None:
        """An unload answered as soon as the model left the router (`Unload.wait` False)."""

        def left() -> None:
            if not reply.done:
                reply.set(None)

        try:
            await self._unload(name, dependents, source, left)
        except TritonError as error:
            if not reply.done:
                reply.fail(error)
        except Exception as error:
            log.exception("control-plane operation failed")
            if not reply.done:
                reply.fail(internal(failure_reason(error)))
        left()

    @staticmethod
    async def _quietly(work: Awaitable[None]) -> None:
        try:
            await work
        except TritonError:
            pass  # recorded as an event already
        except Exception:
            log.exception("control-plane operation failed")

    def _forget_lock(self, name: str) -> None:
        """Drop the lock of a name the manager knows nothing of (a load of an unknown model):
        clients choose names, and the table must not grow with every one they try."""
        lock = self._locks.get(name)
        if (
            lock is not None
            and not lock.locked()
            and not lock.statistics().tasks_waiting
            and name not in self.state
            and name not in self._serving
        ):
            del self._locks[name]

    def _lock(self, name: str) -> anyio.Lock:
        lock = self._locks.get(name)
        if lock is None:
            lock = self._locks[name] = anyio.Lock()
        return lock

    # -- startup -------------------------------------------------------------------------------

    async def _startup(self, message: Startup) -> None:
        found = await self._scan()
        for model in found.values():
            self._discovered(model)
        wanted: dict[str, Override | None] = {}
        if message.names is None:
            if not self._lazy:
                wanted = dict.fromkeys(found)
        else:
            wanted = dict.fromkeys(message.names)
        if message.restore:
            # What the API loaded, with its overrides (also for a model the startup list names:
            # the list says to load it, the journal how it was last loaded).
            for name, status in self.state.items():
                if status.requested is not None:
                    wanted[name] = override_of(status.requested)
            # What an unreadable journal line leaves in doubt is said, not guessed.
            for name, reason in unrestored(self.state, wanted):
                self._record(ev.LoadFailed(model=name, version=None, reason=reason))
        async with anyio.create_task_group() as group:
            for name, override in wanted.items():
                source = ev.Source.STARTUP
                group.start_soon(self._quietly, self._load(name, override, source))

    async def _discover(self) -> None:
        found = await self._scan()
        for model in found.values():
            self._discovered(model)
        # A folder gone from every repository leaves the index, unless a version of it still
        # serves or a load asked for it (its failure stays listed with the reason).
        for name, status in list(self.state.items()):
            kept = status.wanted or status.unsure or name in self._serving
            if name and name not in found and not kept:
                self._record(ev.ModelRemoved(model=name))

    async def _scan(self) -> dict[str, ModelSource]:
        found = await anyio.to_thread.run_sync(scan_repositories, self._repositories)
        self._router.known = set(found) | set(self._serving)
        return found

    def _discovered(self, model: ModelSource) -> None:
        if model.name not in self.state:
            self._record(
                ev.ModelDiscovered(
                    model=model.name,
                    repository=str(model.repository),
                    versions=model.versions,
                    # Of config.pbtxt as written (LoadRequested has the completed config's).
                    config_digest=config_digest(model.config) if model.config is not None else "",
                )
            )

    # -- load ------------------------------------------------------------------------------------

    async def _load(
        self,
        name: str,
        override: Override | None,
        source: ev.Source,
        loading: frozenset[str] = frozenset(),
    ) -> None:
        try:
            async with self._lock(name):
                with self._operations.traced(
                    "reload" if name in self._serving else "load", name, source
                ):
                    try:
                        await self._sync(name, override, source, loading | {name})
                    finally:  # the API's load held its override folder until now
                        if source == ev.Source.API and override is not None:
                            await anyio.to_thread.run_sync(release, override.repository, name)
        finally:
            self._forget_lock(name)

    async def _sync(
        self, name: str, override: Override | None, source: ev.Source, loading: frozenset[str]
    ) -> None:
        found = await self._scan()
        model = found.get(name)
        if override is not None and override.repository is not None:
            model = (await anyio.to_thread.run_sync(scan_repositories, (override.repository,))).get(
                name
            )
        current = self._serving.get(name, {})
        if model is None:
            await self._vanished(name, source)
            if source == ev.Source.STARTUP:
                reason = f"model '{name}' is not in any model repository"
                self._record(ev.LoadFailed(model=name, version=None, reason=reason))
            if source in (ev.Source.API, ev.Source.REQUEST):
                # Triton's words for a model no repository holds.
                raise internal(f"failed to load '{name}', failed to poll from model repository")
            return
        self._discovered(model)
        if source == ev.Source.POLL and self._lazy and not current:
            return  # a lazily loaded model is loaded by its first request, not by the watcher
        serving = bool(current)
        # The config a config override replaces, when it is the repository's (a file
        # override's folder is the caller's): names it gives keep the operator's trust in links.
        repository_config = model.config if override is None or not override.repository else None
        if override is not None and override.config_json:
            model = with_config(model, override.config_json)
        try:
            if model.error is not None or model.config is None:
                raise ConfigError(str(model.error))
            versions = versions_to_load(model)
        except ConfigError as error:
            reason = failure_reason(error)
            self._record(ev.LoadFailed(model=name, version=None, reason=reason, serving=serving))
            raise invalid_arg(f"load failed for model '{name}': {reason}") from None
        try:
            backend, config = await anyio.to_thread.run_sync(
                functools.partial(
                    prepare_config,
                    model,
                    model.config,
                    self._registry,
                    strict=self._strict,
                    latest=versions[-1],
                    gpus=gpu_count(),
                    # An API caller's config: names it changes may not leave the folder at all.
                    caller_config=override is not None and bool(override.config_json),
                    repository_config=repository_config,
                )
            )
        except Exception as error:
            reason = failure_reason(error)
            for version in versions:
                self._record(
                    ev.LoadFailed(model=name, version=version, reason=reason, serving=serving)
                )
            raise load_failed(name, [(version, reason) for version in versions]) from None
        digest = config_digest(config)
        override_digest = override.digest if override is not None else ""
        # The label files are beside config.pbtxt: a change there changes every version.
        labels = await anyio.to_thread.run_sync(label_stamp, config, model.path)
        files = {
            version: await anyio.to_thread.run_sync(folder_signature, version_path(model, version))
            + labels
            for version in versions
        }
        changed = [
            version
            for version in versions
            if version not in current
            or (current[version].config_digest, current[version].files, current[version].override)
            != (digest, files[version], override_digest)
        ]
        leaving = [version for version in current if version not in versions]
        if not changed and not leaving:
            if source == ev.Source.API and (override is not None or self._in_doubt(name)):
                # Same request as the one in force: nothing to do, but keep it on record (it
                # also settles what an unreadable journal line left in doubt).
                self._record(load_requested(name, (), source, digest, override))
            return
        if config.ensemble_scheduling is not None:
            cycle = step_cycle(name, config, found)
            if cycle:
                reason = f"ensemble '{name}' depends on itself: {' -> '.join(cycle)}"
                self._record(
                    ev.LoadFailed(model=name, version=None, reason=reason, serving=serving)
                )
                raise invalid_arg(f"load failed for model '{name}': {reason}")
            if source != ev.Source.POLL:
                await self._load_steps(name, config, source, loading)
        try:  # Triton's rule: no response cache for a decoupled or sequence model
            check_model_config(config, self._router.step_configs(config))
        except ConfigError as error:
            reason = str(error)
            self._record(ev.LoadFailed(model=name, version=None, reason=reason, serving=serving))
            raise invalid_arg(f"load failed for model '{name}': {reason}") from None
        self._record(load_requested(name, tuple(changed), source, digest, override))
        failures = await self._start_versions(
            model, backend, config, changed, digest, files, override_digest
        )
        for version in leaving:
            self._record(
                ev.UnloadRequested(
                    model=name,
                    versions=(version,),
                    source=source,
                    reason="no longer selected by the version policy",
                )
            )
            await self._retire(name, version, "no longer selected by the version policy")
        if failures:
            raise load_failed(name, failures)

    async def _load_steps(
        self, name: str, config: ModelConfig, source: ev.Source, loading: frozenset[str]
    ) -> None:
        """An ensemble needs its steps: load those not serving (Triton does the same)."""
        assert config.ensemble_scheduling is not None
        steps = {step.model_name for step in config.ensemble_scheduling.step}
        for step in sorted(steps - loading):
            # Not serving yet (an empty entry: its load is under way, so its lock is held and
            # this waits for it).
            if not self._serving.get(step):
                try:
                    await self._load(step, None, source, loading)
                except TritonError as error:
                    log.warning("ensemble '%s': step model '%s': %s", name, step, error.message)

    async def _start_versions(
        self,
        model: ModelSource,
        backend: Backend,
        config: ModelConfig,
        versions: list[int],
        digest: str,
        files: dict[int, str],
        override_digest: str,
    ) -> list[tuple[int, str]]:
        """Load `versions` concurrently; each one that comes up replaces its predecessor in the
        router at once. Returns (version, reason) for each that failed."""
        name = model.name
        current = self._serving.setdefault(name, {})
        estimate = await anyio.to_thread.run_sync(
            files_size, [version_path(model, version) for version in versions]
        )
        reason = self._over_budget(name, estimate)
        if reason:
            for version in versions:
                self._record(
                    ev.LoadFailed(
                        model=name, version=version, reason=reason, serving=version in current
                    )
                )
            return [(version, reason) for version in versions]
        failures: list[tuple[int, str]] = []
        rss_before = await anyio.to_thread.run_sync(process_tree_rss)

        async def start(version: int) -> None:
            started = time.perf_counter()
            try:
                serving = await self._start_version(model, backend, config, version)
            except Exception as error:
                reason = failure_reason(error)
                failures.append((version, reason))
                self._record(
                    ev.LoadFailed(
                        model=name, version=version, reason=reason, serving=version in current
                    )
                )
                return
            # The config as prepared: the ensemble scheduler may mark the actor's copy decoupled.
            serving.config_digest = digest
            serving.files = files[version]
            serving.override = override_digest
            serving.folder = hold(model.repository, name)
            serving.memory = estimate // max(len(versions), 1)
            # Looked up again: the dict may have been replaced while the version loaded.
            serving_now = self._serving.setdefault(name, {})
            old = serving_now.get(version)
            serving_now[version] = serving
            self._router.add(serving.handle)
            self._router.known.add(name)
            self._record(
                ev.ModelLoaded(
                    model=name,
                    version=version,
                    config_digest=digest,
                    load_seconds=time.perf_counter() - started,
                    memory_bytes=serving.memory,
                )
            )
            if old is not None:
                replaced[version] = old

        replaced: dict[int, Serving] = {}
        async with anyio.create_task_group() as group:
            for version in versions:
                group.start_soon(start, version)
        grown = await anyio.to_thread.run_sync(process_tree_rss) - rss_before
        loaded = [v for v in versions if v not in dict(failures)]
        if loaded and grown > estimate:
            for version in loaded:
                self._serving[name][version].memory = grown // len(loaded)
            reason = self._over_budget(name, 0)
            if reason:
                reason = f"model '{name}' took {grown} bytes once loaded; {reason}; it was unloaded"
                for version in loaded:
                    await self._undo(name, version, replaced.pop(version, None), reason)
                    failures.append((version, reason))
        # Only now do the copies a reload replaced go: a reload undone above needed them back.
        for old in replaced.values():
            self.start_soon(self._replace, old)
        if not self._serving.get(name):
            self._serving.pop(name, None)
        return failures

    async def _undo(self, name: str, version: int, old: Serving | None, reason: str) -> None:
        """Take back a version just loaded: the copy it replaced serves again, if there was one;
        else the version is unloaded."""
        if old is None:
            await self._retire(name, version, reason)
            self._record(ev.LoadFailed(model=name, version=version, reason=reason))
            return
        new = self._serving[name][version]
        self._serving[name][version] = old
        self._router.add(old.handle)
        self._record(ev.LoadFailed(model=name, version=version, reason=reason, serving=True))
        await self._drain_and_stop(new)

    def _over_budget(self, name: str, extra: int) -> str:
        return over_budget(self._serving, self._budget, name, extra)

    async def _start_version(
        self, model: ModelSource, backend: Backend, config: ModelConfig, version: int
    ) -> Serving:
        context = model_context(model, config, version)
        missing = missing_model_file(model, config, version)
        if missing:
            raise ConfigError(missing)
        # Before the actor: a label file that cannot be read fails the load, as in Triton.
        signature = ModelSignature.from_config(  # an ensemble takes its steps' labels
            config, model.path, lambda step, v: self._router.resolve(step, v).signature
        )
        actor = ModelVersionActor(
            backend,
            context,
            infer=self._router.infer,
            submit=self._router.submit,
            control=ManagerControl(self.ref, self._router, self._mode),
        )
        ref = await self.spawn(actor)
        assert actor.scheduler is not None
        self._owners[ref] = (model.name, version)
        handle = ModelHandle(
            model.name,
            version,
            config,
            signature,
            actor.scheduler,
            actor.statistics,
        )
        return Serving(ref, handle, config_digest="", files="", override="", memory=0)

    def _in_doubt(self, name: str) -> bool:
        """Whether an unreadable journal line left `name`, or the whole restore, in doubt."""
        status = self.state.get(name)
        nameless = self.state.get(ev.UNNAMED)
        return bool(status is not None and status.unsure) or (
            nameless is not None and nameless.state is not None
        )

    # -- failures --------------------------------------------------------------------------------

    async def on_child_failed(self, child: ActorRef[Any], error: BaseException) -> None:
        owner = self._owners.pop(child, None)
        if owner is None:
            return  # already retired
        name, version = owner
        serving = self._serving.get(name, {}).get(version)
        if serving is None or serving.ref is not child:
            return
        del self._serving[name][version]
        if not self._serving[name]:
            del self._serving[name]
        self._router.remove(name, version)
        reason = f"model version stopped serving: {failure_reason(error)}"
        self._record(ev.LoadFailed(model=name, version=version, reason=reason))
