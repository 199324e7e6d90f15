"""The model manager: the control-plane actor that turns the repository into loaded models.

Every step is an event (see `events`), appended to the journal and folded into the state the
repository index reports. The manager owns one `ModelVersionActor` per loaded version and tells
the router which versions serve. A (re)load brings the new version to READY before the router
switches to it; the version it replaces is retired in the background: it finishes what it was
given, then stops. Work on one model is serialised by a lock of its own, so the mailbox stays
free (an index or a readiness probe is answered during a long load) and models load in parallel.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Iterable
from pathlib import Path
from typing import Any

import anyio

from tritonactor.actors import Actor, ActorRef, Reply
from tritonactor.backends.registry import BackendRegistry
from tritonactor.control import events as ev
from tritonactor.control.index import unrestored
from tritonactor.control.load_plan import override_of
from tritonactor.control.loading import Loading
from tritonactor.control.messages import Discover, GetState, Load, Override, Startup, Unload
from tritonactor.control.operations import OperationTraces
from tritonactor.control.prepare import failure_reason
from tritonactor.control.repository import ModelSource, config_digest, scan_repositories
from tritonactor.control.retiring import Retiring
from tritonactor.control.serving import EventLog, Serving, Starting
from tritonactor.control.watcher import RepositoryChanged
from tritonactor.core.errors import TritonError, internal
from tritonactor.observability.summaries import LatencyOptions
from tritonactor.observability.tracing import Tracing
from tritonactor.scheduling.messages import VersionHealth
from tritonactor.scheduling.router import Router

log = logging.getLogger(__name__)


class ModelManager(Loading, Retiring, Actor[Any]):
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
        latency: LatencyOptions | None = None,
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
        # What `--metrics-config` asks each version's statistics to keep (the summaries).
        self._latency = latency
        # The record itself is the journal's; only its fold is kept here.
        self.state: ev.State = ev.fold(history)
        self._serving: dict[str, dict[int, Serving]] = {}
        self._owners: dict[ActorRef[Any], tuple[str, int]] = {}
        self._starting: dict[tuple[str, int], Starting] = {}  # (loading.py: `_start_versions`)
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
        if isinstance(event, ev.LoadRequested | ev.LoadFailed):
            self._router.tried_load(event.model, frozenset(self.state[event.model].versions))
        elif isinstance(event, ev.ModelRemoved):
            self._router.tried_load(event.model, None)
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
            case Unload(reply, name, source, wait=True):
                self.start_soon(self._answer, reply, self._unload(name, source))
            case Unload(reply, name, source):
                self.start_soon(self._answer_early, reply, name, source)
            case RepositoryChanged(names):
                # The watcher's report: each model is loaded, reloaded or unloaded to match.
                for name in sorted(names):
                    self.start_soon(self._quietly, self._load(name, None, ev.Source.POLL))
            case Discover(reply):
                self.start_soon(self._answer, reply, self._discover())
            case GetState(reply):
                reply.set(self.state)
            case VersionHealth(model, version, ready, reason, sender):
                starting = self._starting.get((model, version))
                if starting is not None and starting.serving.ref is sender:
                    starting.unhealthy = None if ready else reason  # told as it joins
                    return
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

    async def _answer_early(self, reply: Reply[None], name: str, source: ev.Source) -> None:
        """An unload answered as soon as the model left the router (`Unload.wait` False)."""

        def left() -> None:
            if not reply.done:
                reply.set(None)

        try:
            await self._unload(name, source, left)
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
        status = self.state.get(model.name)
        # (a restart keeps what the API asked of a model, not that a repository holds it)
        if status is None or not status.discovered:
            self._record(
                ev.ModelDiscovered(
                    model=model.name,
                    repository=str(model.repository),
                    versions=model.versions,
                    # Of config.pbtxt as written (LoadRequested has the completed config's).
                    config_digest=config_digest(model.config) if model.config is not None else "",
                )
            )

    # -- failures --------------------------------------------------------------------------------

    async def on_child_failed(self, child: ActorRef[Any], error: BaseException) -> None:
        owner = self._owners.pop(child, None)
        if owner is None:
            return  # already retired
        name, version = owner
        starting = self._starting.get(owner)
        if starting is not None and starting.serving.ref is child:
            # up, but not serving yet: its load fails (`Loading._start_versions`)
            starting.failed = f"model version stopped serving: {failure_reason(error)}"
            return
        serving = self._serving.get(name, {}).get(version)
        if serving is None or serving.ref is not child:
            return
        del self._serving[name][version]
        if not self._serving[name]:
            del self._serving[name]
        self._router.remove(name, version)
        reason = f"model version stopped serving: {failure_reason(error)}"
        self._record(ev.LoadFailed(model=name, version=version, reason=reason))
