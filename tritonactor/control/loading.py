"""The model manager's loading part: versions coming. A load or a reload (asked by the API, the
startup list, the watcher, a first request of a lazily loaded model, an ensemble that needs its
steps) scans the model's folder, prepares its config and starts each version that changed (its
config, its version policy left out, or its files); once every one has come up each replaces its
predecessor in the router, and the copy it replaced is retired in the background (see
`retiring`); when one fails none joins, as in Triton. A load past the memory budget fails, and
one that grew past it once loaded is undone.

`Loading` is mixed into `ModelManager` (tritonactor/control/manager.py), whose state it works
on: the serving table, the router, the backend registry, the owners of the version actors, the
per-model locks, the journal's record, and the settings it was given (strict model config, lazy
loading, the control mode, the memory budget).
"""

from __future__ import annotations

import functools
import logging
import time
from typing import TYPE_CHECKING, Any, NoReturn

import anyio

from tritonactor.cache import check_model_config
from tritonactor.config.model_config import ConfigError
from tritonactor.control import events as ev
from tritonactor.control.budget import files_size, process_tree_rss
from tritonactor.control.load_plan import (
    load_failed,
    load_requested,
    step_cycle,
    unserved_step,
    versions_to_load,
    with_config,
)
from tritonactor.control.model_control import ManagerControl
from tritonactor.control.override_folders import hold, release
from tritonactor.control.prepare import (
    failure_reason,
    missing_model_file,
    model_context,
    prepare_config,
)
from tritonactor.control.repository import (
    RepositoryError,
    config_digest,
    folder_signature,
    scan_repositories,
    version_path,
)
from tritonactor.control.serving import Serving, Starting, over_budget
from tritonactor.core.devices import gpu_count
from tritonactor.core.errors import TritonError, internal, invalid_arg
from tritonactor.scheduling.model import ModelVersionActor
from tritonactor.scheduling.router import ModelHandle
from tritonactor.scheduling.signature import ModelSignature, label_stamp

if TYPE_CHECKING:
    from tritonactor._proto.inference import ModelConfig
    from tritonactor.actors import ActorRef
    from tritonactor.backends.base import Backend
    from tritonactor.backends.registry import BackendRegistry
    from tritonactor.control.messages import Override
    from tritonactor.control.operations import OperationTraces
    from tritonactor.control.repository import ModelSource
    from tritonactor.observability.summaries import LatencyOptions
    from tritonactor.scheduling.router import Router

__all__ = ["Loading"]

log = logging.getLogger(__name__)


def _in_force(loading: Loading, asked: ev.LoadRequested) -> bool:
    """Whether `asked` is the API's request in force for its model (nothing pending)."""
    status = loading.state.get(asked.model)
    return (
        status is not None
        and status.pending is None
        and status.requested
        == ev.Requested(asked.config_override, asked.override_repository, asked.options_digest)
    )


class Loading:
    """How versions come; mixed into the model manager, which owns the state named here."""

    _registry: BackendRegistry
    _router: Router
    _serving: dict[str, dict[int, Serving]]
    _owners: dict[ActorRef[Any], tuple[str, int]]
    _starting: dict[tuple[str, int], Starting]  # versions up, waiting for their load's others
    _operations: OperationTraces
    _strict: bool
    _lazy: bool
    _mode: str
    _budget: int
    _latency: LatencyOptions | None
    state: ev.State

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
        gone = ""  # why the files a load through the API gave cannot be read any more
        if override is not None and override.repository is not None:
            try:
                model = (
                    await anyio.to_thread.run_sync(scan_repositories, (override.repository,))
                ).get(name)
            except RepositoryError:
                # (its folder removed by hand, or by another server sharing the journal)
                gone = f"the files its load through the API gave ({override.repository}) are gone"
                if model is not None and source == ev.Source.STARTUP:
                    # A repository holds it: a start loads that, as a restarted Triton would.
                    log.warning("model '%s': %s; the repository's is loaded", name, gone)
                    override = None
                else:
                    model = None
                    gone += "; load it again through the API"
        current = self._serving.get(name, {})
        if model is None:
            if source in (ev.Source.API, ev.Source.REQUEST):
                # Triton's words for a model no repository holds; what serves of it (loaded
                # through overrides, or from a folder removed since) goes on serving, as in
                # Triton: a failed load takes nothing down.
                raise internal(f"failed to load '{name}', failed to poll from model repository")
            await self._vanished(name, source)
            if source == ev.Source.STARTUP:
                # (the load stays asked for: listed with the reason, retried at the next start)
                reason = gone or f"model '{name}' is not in any model repository"
                self._record(ev.LoadFailed(model=name, version=None, reason=reason))
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
        if model.error is not None or model.config is None:
            self._refuse(name, str(model.error), serving)
        try:
            versions = versions_to_load(model)
        except ConfigError as error:  # the policy selects no version
            self._refuse(name, failure_reason(error), serving, versionless=True)
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
        # What makes a serving version load again: its config but its version policy, which
        # chooses versions and changes none (a load that changes only the policy keeps the
        # versions that stay, as Triton's does).
        kept_digest = config_digest(config, policy=False)
        # (a config override is in `kept_digest`; files an override gives are told apart here)
        override_digest = (
            override.digest if override is not None and override.repository is not None else ""
        )
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
            != (kept_digest, files[version], override_digest)
        ]
        leaving = [version for version in current if version not in versions]
        if config.ensemble_scheduling is not None:
            # (Before what changed: a load of an ensemble away loads its steps, to bring it back.)
            await self._ensemble_steps(name, config, found, source, loading, serving)
        if not changed and not leaving:
            asked = load_requested(name, (), source, digest, override)
            if source == ev.Source.API and (self._in_doubt(name) or not _in_force(self, asked)):
                # Nothing to do, but the request is the one in force now: on record (a plain
                # load after a config override equal to config.pbtxt ends the override; it also
                # settles what an unreadable journal line left in doubt). The same request again
                # adds nothing to the journal.
                self._record(asked)
            return
        try:  # Triton's rule: no response cache for a decoupled or sequence model
            check_model_config(config, self._router.step_configs(config))
        except ConfigError as error:
            self._refuse(name, str(error), serving)
        self._record(load_requested(name, tuple(changed), source, digest, override))
        failures = await self._start_versions(
            model, backend, config, changed, (digest, kept_digest), files, override_digest
        )
        if failures:
            # The load failed as a whole: what served before serves on, the versions its
            # policy would drop included, as Triton's do (a broken version 2 under `latest 1`
            # left the model with no version at all).
            leaving = []
        for version in leaving:
            self._record(
                ev.UnloadRequested(
                    model=name,
                    versions=(version,),
                    source=source,
                    reason="no longer selected by the version policy",
                )
            )
            # listed as Triton lists it: "unloaded"
            await self._retire(name, version, "")
        if failures:
            raise load_failed(name, failures)

    async def _ensemble_steps(
        self,
        name: str,
        config: ModelConfig,
        found: dict[str, ModelSource],
        source: ev.Source,
        loading: frozenset[str],
        serving: bool,
    ) -> None:
        """An ensemble needs its steps. Refused when they lead back to it. Unless the watcher
        loads it (the watcher loads the steps too, each on its own), the steps that do not
        serve are loaded first, and the ensemble is refused, in Triton's words, when one still
        does not serve the version it runs (Triton does the same)."""
        cycle = step_cycle(name, config, found)
        if cycle:
            self._refuse(
                name, f"ensemble '{name}' depends on itself: {' -> '.join(cycle)}", serving
            )
        if source == ev.Source.POLL:
            return
        failures = await self._load_steps(name, config, source, loading)
        assert config.ensemble_scheduling is not None
        models = {step.model_name for step in config.ensemble_scheduling.step}
        versions = {model: self._router.ready_versions(model) for model in models}
        reason = unserved_step(name, config, self._router.known, versions, failures)
        if reason is not None:
            self._refuse(name, reason, serving)

    def _refuse(
        self, name: str, reason: str, serving: bool, *, versionless: bool = False
    ) -> NoReturn:
        """The load of `name` fails as a whole, before any version is tried (`versionless`:
        because its version policy selects none, `events.LoadFailed`)."""
        failed = ev.LoadFailed(
            model=name, version=None, reason=reason, serving=serving, versionless=versionless
        )
        self._record(failed)
        raise invalid_arg(f"load failed for model '{name}': {reason}\n")  # (Triton's line break)

    async def _load_steps(
        self, name: str, config: ModelConfig, source: ev.Source, loading: frozenset[str]
    ) -> dict[str, tuple[str, bool]]:
        """Load the ensemble's step models that do not serve (an ensemble away among them, to
        bring it back); those whose load failed, with the error's detail and whether the model
        failed as a whole (`unserved_step`)."""
        assert config.ensemble_scheduling is not None
        steps = {step.model_name for step in config.ensemble_scheduling.step}
        failures = {}
        for step in sorted(steps - loading):
            # Not serving (a load under way holds its lock: this waits for it).
            if not self._router.ready_versions(step):
                try:
                    await self._load(step, None, source, loading)
                except TritonError as error:
                    log.warning("ensemble '%s': step model '%s': %s", name, step, error.message)
                    detail = error.message.removeprefix(f"load failed for model '{step}': ")
                    status = self.state.get(step)
                    whole = status is not None and status.state is not None
                    failures[step] = (detail.removesuffix("\n"), whole)
        return failures

    async def _start_versions(
        self,
        model: ModelSource,
        backend: Backend,
        config: ModelConfig,
        versions: list[int],
        digests: tuple[str, str],
        files: dict[int, str],
        override_digest: str,
    ) -> list[tuple[int, str]]:
        """Load `versions` concurrently. When every one has come up, each replaces its
        predecessor in the router; when one fails, none does (Triton's rule). Returns (version,
        reason) for each that failed."""
        name = model.name
        digest, kept_digest = digests  # (the config's; the one a reload compares, `_sync`)
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
        started: dict[int, tuple[Serving, float]] = {}  # each version up, with its load's time
        rss_before = await anyio.to_thread.run_sync(process_tree_rss)

        async def start(version: int) -> None:
            began = time.perf_counter()
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
            serving.config_digest = kept_digest
            serving.files = files[version]
            serving.override = override_digest
            serving.folder = hold(model.repository, name)
            serving.memory = estimate // max(len(versions), 1)
            started[version] = (serving, time.perf_counter() - began)
            # (the manager notes here what happens to it until it joins: its actor failing,
            # its health)
            self._starting[(name, version)] = Starting(serving)

        try:
            async with anyio.create_task_group() as group:
                for version in versions:
                    group.start_soon(start, version)
        except BaseException:
            for version in started:
                self._starting.pop((name, version), None)
            raise
        # Looked up again: the dict may have been replaced while the versions loaded.
        current = self._serving.setdefault(name, {})
        unhealthy: dict[int, str] = {}  # why a version's instance is down as it joins
        for version in sorted(started):
            starting = self._starting.pop((name, version))
            if starting.failed is not None:  # its actor failed while the others came up
                serving, _ = started.pop(version)
                await anyio.to_thread.run_sync(release, serving.folder, name)
                failures.append((version, starting.failed))
                self._record(
                    ev.LoadFailed(
                        model=name,
                        version=version,
                        reason=starting.failed,
                        serving=version in current,
                    )
                )
            elif starting.unhealthy is not None:
                unhealthy[version] = starting.unhealthy
        if failures:
            # Triton's rule: a load one of whose versions fails loads none of them. The copies
            # that served before serve on; a version that did not is listed as unloaded.
            for version, (serving, _) in started.items():
                await self._drain_and_stop(serving)
                await anyio.to_thread.run_sync(release, serving.folder, name)
                if version not in current:
                    self._record(ev.ModelUnloaded(model=name, version=version))
            if not current:
                self._serving.pop(name, None)
            return failures
        replaced: dict[int, Serving] = {}
        for version, (serving, seconds) in sorted(started.items()):
            old = current.get(version)
            current[version] = serving
            self._router.add(serving.handle)
            self._router.known.add(name)
            self._record(
                ev.ModelLoaded(
                    model=name,
                    version=version,
                    config_digest=digest,
                    load_seconds=seconds,
                    memory_bytes=serving.memory,
                )
            )
            if old is not None:
                replaced[version] = old
            if version in unhealthy:  # told now that it serves
                self._record(
                    ev.InstanceFailed(model=name, version=version, reason=unhealthy[version])
                )
        grown = await anyio.to_thread.run_sync(process_tree_rss) - rss_before
        if versions and grown > estimate:
            for version in versions:
                current[version].memory = grown // len(versions)
            reason = self._over_budget(name, 0)
            if reason:
                reason = f"model '{name}' took {grown} bytes once loaded; {reason}; it was unloaded"
                for version in versions:
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
            latency=self._latency,
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
