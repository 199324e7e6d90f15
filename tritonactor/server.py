"""The composition root: settings -> journal, backends, router, the model manager and (in poll
mode) the repository watcher, in one actor system."""

from __future__ import annotations

import contextlib
import gc
import logging
import os
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio

from tritonactor import __version__
from tritonactor.actors import ActorRef, ActorSystem
from tritonactor.backends.registry import BackendRegistry
from tritonactor.cache import ResponseCache
from tritonactor.control import events as ev
from tritonactor.control.index import IndexEntry, index, ready
from tritonactor.control.journal import (
    Journal,
    JournalEntry,
    JournalLocationError,
    open_journal,
)
from tritonactor.control.load_parameters import LoadOptions, UnloadOptions, options_digest
from tritonactor.control.load_plan import restored_overrides
from tritonactor.control.manager import ModelManager
from tritonactor.control.messages import Discover, GetState, Load, Override, Startup, Unload
from tritonactor.control.override_folders import claim_root, materialize, override_root
from tritonactor.control.watcher import RepositoryWatcher, take_snapshot, tell_changes
from tritonactor.core.errors import TritonError, invalid_arg, unavailable
from tritonactor.core.heap import keep_freed_memory
from tritonactor.memory.region import Kind
from tritonactor.memory.registry import SharedMemoryRegistry
from tritonactor.observability import logging as log_settings
from tritonactor.observability.log_format import OBJECT, table
from tritonactor.observability.span_export import exporter_settings
from tritonactor.observability.summaries import latency_options
from tritonactor.observability.trace_settings import OFF, SettingJson, TraceSettings
from tritonactor.observability.tracing import Tracing, start_tracing
from tritonactor.observability.tracing_env import TracingConfigError, tracing_config
from tritonactor.scheduling.router import ModelHandle, Router
from tritonactor.settings import ControlMode, Settings, SettingsError
from tritonactor.store.mirror import StoreMirror, open_mirrors
from tritonactor.store.remote import StoreError
from tritonactor.store.syncer import Refresh, StoreSyncer

log = logging.getLogger(__name__)

# The protocol extensions this server answers (GET /v2 and gRPC ServerMetadata list them):
# Triton 2.51's, in its order, then ours: "repository_events" is GET /v2/repository/events, the
# journal's history.
EXTENSIONS = (
    "classification",
    "sequence",
    "model_repository",
    "model_repository(unload_dependents)",
    "schedule_policy",
    "model_configuration",
    "system_shared_memory",
    "cuda_shared_memory",
    "binary_tensor_data",
    "parameters",
    "statistics",
    "trace",
    "logging",
    "repository_events",
)


class StartupFailed(RuntimeError):
    """Models failed to load at startup and --exit-on-error says to stop: the ASGI lifespan
    fails with it, so hypercorn (and `tritonactor serve`) exits non-zero."""

    def __init__(self, failures: list[tuple[str, str]]) -> None:
        self.failures = failures
        listed = "; ".join(f"'{name}': {reason}" for name, reason in failures).rstrip(".")
        super().__init__(
            f"failed to load {len(failures)} model(s) at startup: {listed}. Stopping, as "
            "--exit-on-error is true (TRITONACTOR_EXIT_ON_ERROR=false serves the other models)"
        )


def startup_failures(
    state: ev.State, names: tuple[str, ...] | None = None
) -> list[tuple[str, str]]:
    """(model, reason) for every model of the startup list (`names`; None: every model) that
    should be loaded and is not, after the startup loads: what --exit-on-error stops the server
    for. A model only the journal restores (explicit mode) is not on the list: Triton has no
    such restore, and a model broken on disk since must not stop every restart."""
    failures = []
    for name, status in sorted(state.items()):
        if not status.wanted or (names is not None and name not in names):
            continue
        if status.state is not None:
            failures.append((name, status.reason))
            continue
        for version, version_status in sorted(status.versions.items()):
            if not version_status.unloaded and version_status.state != ev.VersionState.READY:
                failures.append((name, f"version {version}: {version_status.reason}"))
    return failures


def model_table(state: ev.State) -> str:
    """The models and versions the startup loads left, as Triton's table after its startup
    loads: READY, or UNAVAILABLE and why."""
    rows = []
    for name, status in sorted(state.items()):
        if status.state is not None:
            rows.append((name, "-", _status_text(status.state, status.reason)))
        for version, version_status in sorted(status.versions.items()):
            state_text = _status_text(version_status.state, version_status.reason)
            rows.append((name, str(version), state_text))
    return table(("Model", "Version", "Status"), rows)


def _status_text(state: ev.VersionState, reason: str) -> str:
    if not reason or state == ev.VersionState.READY:
        return state.value
    return f"{state.value}: {reason.rstrip()}"


def settle_heap() -> None:
    """Once started: what startup made (modules, configs, models' Python objects) moves out of
    the collector's generations, so a full collection no longer walks it. A full collection
    of a started server took ~25 ms and came every ~0.6 s under load, which was the p99 of
    dynamic batching (docs/benchmarks.md). Large buffers freed from now on stay in the heap
    for the next request (core/heap.py)."""
    gc.collect()
    gc.freeze()
    keep_freed_memory()


class Server:
    """What the front ends talk to: the router for inference, and the control plane."""

    # Triton's name: clients and tools (and Triton's own tests) read it; `version` says which
    # tritonactor this is (docs/decisions.md).
    name = "triton"
    version = __version__
    extensions = EXTENSIONS

    def __init__(
        self,
        settings: Settings,
        registry: BackendRegistry | None = None,
        router_class: type[Router] = Router,
    ) -> None:
        self.settings = settings
        self.registry = (
            registry if registry is not None else BackendRegistry(config=settings.backend_config)
        )
        # The one response cache (--cache-config local,size=N), shared by every model that
        # asks for it; None without the setting.
        size = settings.response_cache_size()
        self.router = router_class(cache=ResponseCache(size) if size is not None else None)
        # The shared-memory regions clients registered (both front ends share them).
        self.shared_memory = SharedMemoryRegistry()
        self.live = False
        self.journal: Journal | None = None
        self._manager: ActorRef[Any] | None = None
        # Poll mode with an interval: the repository watcher.
        self._watcher: ActorRef[Any] | None = None
        # With object-store repositories (modes poll and explicit): what keeps their copies.
        self._syncer: ActorRef[Any] | None = None
        try:
            # Read now, so that a bad OTEL_* variable stops the server before it starts.
            self._tracing_config = tracing_config(os.environ)
        except TracingConfigError as error:
            raise SettingsError(str(error), error.variable) from None
        self._start_warnings: list[str] = []
        self.trace_settings = self._initial_trace_settings()
        # --metrics-config: the latency counters and summaries (what it cannot read is warned of).
        self.latency = latency_options(settings.metrics_config, self._start_warnings.append)
        # While running with tracing configured: the tracer, owned here, shut down at stop.
        self.tracing: Tracing | None = None

    def _initial_trace_settings(self) -> TraceSettings:
        """What the trace flags ask for; unset, with an exporter configured every request is
        traced until the trace API says less."""
        asked = self.settings.trace_defaults()
        exporting = self._tracing_config is not None
        level = asked.level or (("TIMESTAMPS",) if exporting else (OFF,))
        if level != (OFF,) and not exporting:
            self._start_warnings.append(
                f"trace level {','.join(level)} is set but no OpenTelemetry exporter is "
                "configured (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_TRACES_EXPORTER): no trace is "
                "exported"
            )
        return TraceSettings(
            level=level,
            rate=1 if asked.rate is None else asked.rate,
            count=-1 if asked.count is None else asked.count,
            log_frequency=0 if asked.log_frequency is None else asked.log_frequency,
            exporter=exporter_settings(os.environ),
        )

    def new_tracing(self) -> Tracing | None:
        """A tracer for this process, exporting as configured (None without an exporter)."""
        if self._tracing_config is None:
            return None
        return start_tracing(self._tracing_config, self.trace_settings)

    def startup_warnings(self) -> list[str]:
        """What the server warns about when it starts: each setting given that it does not act
        on (by flag and variable), trace settings that cannot take effect, and what
        `--metrics-config` says that cannot be read."""
        return self.settings.warnings() + self._start_warnings

    def log_startup(self) -> None:
        """The settings in force, in a table as Triton logs its options, then the startup
        warnings: once, as the ASGI lifespan starts and logging is configured."""
        options = table(("Option", "Value"), self.settings.describe())
        log.info("", extra={OBJECT: options})
        for warning in self.startup_warnings():
            log.warning("%s", warning)

    @property
    def mode(self) -> ControlMode:
        return self.settings.model_control_mode

    @property
    def _override_root(self) -> Path:
        """Where explicit loads' override files live: beside the journal that refers to them,
        one folder per journal (`<journal>.overrides/`)."""
        return override_root(self.settings.journal)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Server]:
        """Open the journal, start the actors and load the models; stop them all on exit."""
        settings = self.settings
        # Object-store repositories are copied first: every scan reads the local copies.
        try:
            repositories, mirrors = await anyio.to_thread.run_sync(
                open_mirrors, settings.model_repositories, settings.repository_cache_dir
            )
        except StoreError as error:
            log.error("cannot read a model repository: %s", error)
            raise
        try:
            async with self._serving(repositories, mirrors):
                yield self
        finally:
            for mirror in mirrors:
                mirror.close()

    @asynccontextmanager
    async def _serving(
        self, repositories: tuple[Path, ...], mirrors: list[StoreMirror]
    ) -> AsyncIterator[None]:
        settings = self.settings
        try:
            journal, history = await anyio.to_thread.run_sync(open_journal, settings.journal)
        except JournalLocationError as error:
            log.error("%s", error)  # (a hypercorn worker ends without a word otherwise)
            raise
        self.journal = journal
        # What a crash left behind: half-written overrides, and override folders that no load
        # in force uses (unless another server shares this journal, and so the folder).
        claim = await anyio.to_thread.run_sync(
            claim_root, self._override_root, restored_overrides(ev.fold(history))
        )
        try:
            self.tracing = self.new_tracing()
            async with ActorSystem(
                on_failure=self._actor_failed, shutdown_timeout=settings.exit_timeout_secs
            ) as system:
                manager = ModelManager(
                    repositories,
                    self.registry,
                    self.router,
                    strict_model_config=settings.strict_model_config,
                    journal=journal,
                    history=history,
                    mode=self.mode.value,
                    lazy=settings.lazy_load,
                    memory_budget=settings.memory_budget,
                    tracing=self.tracing,
                    latency=self.latency,
                )
                self._manager = await system.spawn(manager)
                self.live = True
                if settings.lazy_load:
                    self.router.loader = self._load_lazily
                snapshot = None
                if self.mode is ControlMode.POLL and settings.repository_poll_secs > 0:
                    # Taken before the startup scan: whatever changes during the loads differs
                    # from it and is looked at again once it settles.
                    snapshot = await anyio.to_thread.run_sync(take_snapshot, repositories)
                startup_models = self._startup_models()
                await self._manager.ask(
                    lambda reply: Startup(
                        reply, startup_models, restore=self.mode is ControlMode.EXPLICIT
                    )
                )
                state = await self.state()
                log.info("", extra={OBJECT: model_table(state)})
                failures = startup_failures(state, startup_models) if settings.exit_on_error else []
                if failures:
                    self.live = False
                    error = StartupFailed(failures)
                    log.error("%s", error)
                    raise error
                if snapshot is not None:
                    self._watcher = await system.spawn(
                        RepositoryWatcher(
                            repositories,
                            settings.repository_poll_secs,
                            tell_changes(self._manager),
                            snapshot=snapshot,
                        )
                    )
                if mirrors and self.mode is not ControlMode.NONE:
                    polling = self.mode is ControlMode.POLL and settings.repository_poll_secs > 0
                    self._syncer = await system.spawn(
                        StoreSyncer(mirrors, settings.repository_poll_secs if polling else None)
                    )
                settle_heap()
                try:
                    yield
                finally:
                    self.live = False
                    self.router.loader = None
                    self._manager = None
                    self._watcher = None
                    self._syncer = None
        finally:
            journal.close()
            claim.close()
            self.registry.finalize()
            self.shared_memory.close()
            tracing, self.tracing = self.tracing, None
            if tracing is not None:
                # Last, so that what stopping the models recorded is exported too.
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(tracing.shutdown)

    def _startup_models(self) -> tuple[str, ...] | None:
        """None (all) in modes none and poll; explicit mode loads only TRITONACTOR_LOAD_MODEL
        ("*": all)."""
        settings = self.settings
        if self.mode is not ControlMode.EXPLICIT or "*" in settings.load_models:
            return None
        return settings.load_models

    @property
    def manager(self) -> ActorRef[Any] | None:
        """The model manager while the server runs (observers walk the actor tree from it)."""
        return self._manager

    @property
    def watcher(self) -> ActorRef[Any] | None:
        """The repository watcher while the server polls (none without poll mode, or with a
        poll interval of 0)."""
        return self._watcher

    def _manager_ref(self) -> ActorRef[Any]:
        if self._manager is None:
            raise unavailable("the server is not running")
        return self._manager

    async def state(self) -> ev.State:
        return await self._manager_ref().ask(GetState)

    async def ready(self) -> bool:
        """Strict readiness, Triton's default: live, and every model that should be loaded is
        ready (see `index.ready`). Without it (--strict-readiness=false): live."""
        if not self.settings.strict_readiness:
            return self.live
        return self.live and ready(await self.state())

    async def index(self, ready_only: bool = False) -> list[IndexEntry]:
        if self.mode is ControlMode.EXPLICIT:
            # Every model folder there is now, as Triton's index: a store is read again first.
            with contextlib.suppress(TritonError):  # logged; the index says what is known
                await self._refresh_stores(None)
            await self._manager_ref().ask(Discover)
        entries = index(await self.state(), self.router.hidden())
        if ready_only:
            entries = [entry for entry in entries if entry.state == ev.VersionState.READY]
        return entries

    async def load(self, name: str, options: LoadOptions) -> None:
        """An explicit load (the front ends have checked the mode): returns once the model
        serves, or raises Triton's error for why it does not."""
        override = None
        if options.has_overrides:
            override = await anyio.to_thread.run_sync(self._override, name, options)
        await self._refresh_stores(name)
        manager = self._manager_ref()
        await manager.ask(lambda reply: Load(reply, name, override, ev.Source.API))

    def _override(self, name: str, options: LoadOptions) -> Override:
        repository: Path | None = None
        if options.files:
            model_folder = materialize(options, name, self._override_root)
            repository = model_folder.parent
        return Override(options.config_json or "", repository, options_digest(options))

    async def unload(self, name: str, options: UnloadOptions) -> None:
        manager = self._manager_ref()
        await manager.ask(lambda reply: Unload(reply, name, ev.Source.API))

    async def _refresh_stores(self, name: str | None) -> None:
        """Explicit mode reads the object stores at each load, as Triton does: the model's copy
        (`name`, and its ensemble steps with no copy yet) is brought up to date first; for the
        index (None), the models with no copy yet are copied and those gone from the store and
        not loaded dropped. 503 when a store cannot be read or the model cannot be copied."""
        if self._syncer is None or self.mode is not ControlMode.EXPLICIT:
            return
        keep: frozenset[str] = frozenset()
        if name is None:  # what is loaded, or asked for, keeps its copy
            state = await self.state()
            keep = frozenset(model for model, status in state.items() if status.wanted)
        try:
            await self._syncer.ask(lambda reply: Refresh(reply, name, keep))
        except StoreError as error:
            raise unavailable(f"cannot read the model repository: {error}") from None

    async def _load_lazily(self, name: str) -> None:
        await self._refresh_stores(name)
        await self._manager_ref().ask(lambda reply: Load(reply, name, None, ev.Source.REQUEST))

    async def trace_extension(
        self, model: str = "", changes: Mapping[str, Any] | None = None
    ) -> dict[str, SettingJson]:
        """The trace extension: the settings in force for `model` ("" = global), after applying
        `changes` when given. A model must be ready, as in Triton. (In a front-end process the
        engine answers.)"""
        if model and not self.router.ready_versions(model):
            raise invalid_arg(f"Request for unknown model : {model}")
        if changes is None:
            return self.trace_settings.get(model)
        return self.trace_settings.update(changes, model)

    async def log_settings(self, changes: Mapping[str, object] | None = None) -> dict[str, object]:
        """The logging extension: the log settings in force, after applying `changes`."""
        if changes is None:
            return log_settings.current()
        return log_settings.update(changes)

    async def statistics(self, name: str = "", version: str = "") -> list[ModelHandle]:
        """The ready versions whose statistics were asked for (`Router.select`)."""
        return self.router.select(name, version)

    async def register_system_memory(
        self, name: str, key: str, offset: int, byte_size: int
    ) -> None:
        self.shared_memory.register_system(name, key, offset, byte_size)

    async def register_cuda_memory(
        self, name: str, handle: bytes, device_id: int, byte_size: int
    ) -> None:
        # Off the event loop: the first one loads the CUDA runtime (seconds).
        register = self.shared_memory.register_cuda
        await anyio.to_thread.run_sync(register, name, handle, device_id, byte_size)

    async def unregister_memory(
        self, kind: Kind, name: str = "", busy: frozenset[str] = frozenset()
    ) -> None:
        """Unregister as the extension asks; `busy`: regions that requests of other processes
        (front ends) hold, which stay."""
        self.shared_memory.unregister(kind, name, busy)

    async def events(self, after: int = 0, limit: int = 100) -> list[JournalEntry]:
        """The journal's history, oldest first, `limit` entries whose seq is above `after`."""
        if self.journal is None:
            raise unavailable("the server is not running")
        journal = self.journal
        return await anyio.to_thread.run_sync(lambda: journal.page(after, limit))

    def _actor_failed(self, actor: ActorRef[object], error: BaseException) -> None:
        log.error("actor '%s' failed and was not restarted: %r", actor.name, error)
