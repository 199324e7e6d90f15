"""The composition root: settings -> backends, router, the model manager, in one actor system."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from tritonactor import __version__
from tritonactor.actors import ActorRef, ActorSystem
from tritonactor.backends.registry import BackendRegistry
from tritonactor.control import events as ev
from tritonactor.control.manager import GetState, IndexEntry, LoadAll, ModelManager, index
from tritonactor.core.errors import unavailable
from tritonactor.scheduling.router import Router
from tritonactor.settings import ControlMode, Settings, SettingsError

log = logging.getLogger(__name__)

# The protocol extensions this server answers (GET /v2 and gRPC ServerMetadata list them).
EXTENSIONS = ("model_configuration", "binary_tensor_data", "parameters", "statistics")


def check_supported(settings: Settings) -> None:
    """Raise SettingsError for settings this version accepts but cannot serve yet."""
    if settings.model_control_mode is ControlMode.POLL:
        # Refused rather than served as mode none: a poll mode that never polls would mislead.
        raise SettingsError(
            "TRITONACTOR_MODEL_CONTROL_MODE='poll' is not available in this version yet; "
            "use 'none' or 'explicit'",
            variable="TRITONACTOR_MODEL_CONTROL_MODE",
        )


class Server:
    """What the front ends talk to: the router for inference, and the control plane's state."""

    name = "tritonactor"
    version = __version__
    extensions = EXTENSIONS

    def __init__(self, settings: Settings, registry: BackendRegistry | None = None) -> None:
        check_supported(settings)
        self.settings = settings
        self.registry = registry if registry is not None else BackendRegistry()
        self.router = Router()
        self.live = False
        self._manager: ActorRef[object] | None = None

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Server]:
        """Start the actors and load the models; stop them all on exit."""
        async with ActorSystem(on_failure=self._actor_failed, shutdown_timeout=30) as system:
            manager = ModelManager(
                self.settings.model_repositories,
                self.registry,
                self.router,
                strict_model_config=self.settings.strict_model_config,
            )
            self._manager = await system.spawn(manager)
            self.live = True
            await self._manager.ask(lambda reply: LoadAll(reply, self._startup_models()))
            try:
                yield self
            finally:
                self.live = False
                self._manager = None
        self.registry.finalize()

    def _startup_models(self) -> tuple[str, ...] | None:
        """None (all) in mode none; explicit mode loads only TRITONACTOR_LOAD_MODEL ("*": all)."""
        settings = self.settings
        if settings.model_control_mode is not ControlMode.EXPLICIT or "*" in settings.load_models:
            return None
        return settings.load_models

    async def state(self) -> ev.State:
        if self._manager is None:
            raise unavailable("the server is not running")
        return await self._manager.ask(GetState)

    async def ready(self) -> bool:
        """Strict readiness, Triton's default: live, and every model that should load is ready."""
        if not self.live:
            return False
        state = await self.state()
        return all(
            status.state is None
            and all(v.state == ev.VersionState.READY for v in status.versions.values())
            for status in state.values()
        )

    async def index(self, ready_only: bool = False) -> list[IndexEntry]:
        entries = index(await self.state())
        if ready_only:
            entries = [entry for entry in entries if entry.state == ev.VersionState.READY]
        return entries

    def _actor_failed(self, actor: ActorRef[object], error: BaseException) -> None:
        log.error("actor '%s' failed and was not restarted: %r", actor.name, error)
