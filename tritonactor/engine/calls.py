"""What a front-end process may ask of the engine by name (`Call.method`), and the engine's
record of the shared-memory regions clients registered through any front end."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from tritonactor.core.errors import invalid_arg
from tritonactor.engine import messages as m
from tritonactor.memory.region import Kind
from tritonactor.observability.endpoint import ServerMetrics
from tritonactor.server import Server


class EngineServer:
    """The engine's server as its front-end connections see it."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.router = server.router
        self.settings = server.settings
        # The regions mapped here: tensors in them cross as where they lie (engine/wire.py).
        self.shared_memory = server.shared_memory
        # Every region registered, as it was asked for: what a front end maps in its process.
        self._regions: dict[str, m.Region] = {}
        # Set by the host: tell every front end (the regions, the log settings changed), and ask
        # every one.
        self.broadcast: Callable[[object], None] = lambda message: None
        self.ask_all: Callable[..., Awaitable[list[Any]]] = _nobody
        self._calls: dict[str, Callable[..., Awaitable[Any]]] = {
            "live": self._live,
            "ready": self.server.ready,
            "index": self.server.index,
            "load": self.server.load,
            "unload": self.server.unload,
            "events": self.server.events,
            "ensure_loaded": self.router.ensure_loaded,
            "trace_extension": self._trace_settings,
            "statistics": self._statistics,
            "register_system": self._register_system,
            "register_cuda": self._register_cuda,
            "unregister": self._unregister,
            "log_settings": self._log_settings,
            "metrics": ServerMetrics(server).render,
        }

    async def engine_call(self, method: str, args: tuple[Any, ...]) -> Any:
        call = self._calls.get(method)
        if call is None:
            raise invalid_arg(f"the engine has no call '{method}'")
        return await call(*args)

    def regions(self) -> m.Regions:
        return m.Regions(tuple(self._regions.values()))

    async def _live(self) -> bool:
        return self.server.live

    async def _trace_settings(self, model: str, changes: dict[str, Any] | None) -> Any:
        answer = await self.server.trace_extension(model, changes)
        if changes:
            self.broadcast(m.TraceSettings(model, changes))
        return answer

    def trace_used(self, scope: str) -> None:
        """A front end traced a request against `scope`'s trace_count: count it here, where
        every front end's are counted, and tell them all what is left."""
        left = self.server.trace_settings.use(scope)
        if left is not None:
            self.broadcast(m.TraceLeft(scope, left))

    def trace_state(self) -> m.TraceState:
        return m.TraceState(self.server.trace_settings.snapshot())

    async def _statistics(self, name: str, version: str) -> list[tuple[m.Version, Any]]:
        return [
            (m.Version(h.name, h.version, h.config, h.signature), h.statistics)
            for h in await self.server.statistics(name, version)
        ]

    async def _register_system(self, name: str, key: str, offset: int, byte_size: int) -> None:
        await self.server.register_system_memory(name, key, offset, byte_size)
        self._regions[name] = m.Region(Kind.SYSTEM, name, key, b"", 0, offset, byte_size)
        self.broadcast(self.regions())

    async def _register_cuda(
        self, name: str, handle: bytes, device_id: int, byte_size: int
    ) -> None:
        await self.server.register_cuda_memory(name, handle, device_id, byte_size)
        self._regions[name] = m.Region(Kind.CUDA, name, "", handle, device_id, 0, byte_size)
        self.broadcast(self.regions())

    async def _unregister(self, kind: Kind, name: str) -> None:
        # A region is in use while a request of any front end holds it.
        held = await self.ask_all("in_use", kind)
        busy = frozenset().union(*held)
        try:
            await self.server.unregister_memory(kind, name, busy)
        finally:
            kept = {region.name for region in self.server.shared_memory.status(kind)}
            for region_name, region in list(self._regions.items()):
                if region.kind is kind and region_name not in kept:
                    del self._regions[region_name]
            self.broadcast(self.regions())

    async def _log_settings(self, changes: dict[str, Any] | None) -> dict[str, object]:
        answer = await self.server.log_settings(changes)
        if changes:
            self.broadcast(m.LogSettings(changes))
        return answer


async def _nobody(method: str, *args: Any) -> list[Any]:
    return []
