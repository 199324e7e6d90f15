"""A front-end process's view of the engine: the same `server` and `server.router` the front
ends use in one process, with every call and request carried over the engine connection.

The router here holds a copy of the engine's table of ready versions (configs and signatures,
sent by the engine whenever the table changes), so a front end decodes and validates on its
own core and only a valid request crosses. Its `infer`/`submit` send the request and complete
when the engine answers; a decoupled model's responses arrive one `Part` at a time and go to
the request's sender as they would in one process."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio

from tritonactor.actors import Reply
from tritonactor.core.cork import CorkedTransport
from tritonactor.core.errors import TritonError, cancelled, unavailable
from tritonactor.core.types import InferenceRequest, InferenceResponse
from tritonactor.engine import messages as m
from tritonactor.engine.frame_reader import FrameReader
from tritonactor.engine.lanes import Lane, LaneReader
from tritonactor.engine.launch import EngineFailed, same_user
from tritonactor.engine.wire import PROTOCOL, encode, write
from tritonactor.memory.lease import LEASE
from tritonactor.memory.region import Kind
from tritonactor.memory.registry import SharedMemoryRegistry
from tritonactor.observability import logging as log_settings
from tritonactor.scheduling.router import ModelHandle, Router
from tritonactor.scheduling.statistics import VersionStatistics
from tritonactor.server import settle_heap

log = logging.getLogger(__name__)

ENGINE_GONE = "the server's engine is not running"
# How long a front end whose engine went away goes on answering before it stops.
STOP_GRACE_S = 1.0


class EngineConnection(asyncio.BufferedProtocol):
    """One front end's connection to the engine: calls and requests by id, answers matched
    back to them."""

    def __init__(self, on_message: Any, regions: SharedMemoryRegistry | None = None) -> None:
        # Large tensors: those sent go through this side's lane, those received come from
        # the engine's (engine/lanes.py); those in clients' regions cross as where they lie.
        self._lane = Lane()
        self._lanes = LaneReader()
        self._regions = regions
        self._reader = FrameReader(self._lanes, regions)
        # Wrapped: a turn's requests go in one write (core/cork.py).
        self._transport: CorkedTransport | None = None
        self._ids = itertools.count(1)
        self._waiting: dict[int, Reply[Any]] = {}
        self._parts: dict[int, InferenceRequest] = {}
        # Traced requests awaiting their answer: it may carry links for their span.
        self._traced: dict[int, InferenceRequest] = {}
        self._on_message = on_message
        self.closed = asyncio.Event()
        self.hello: asyncio.Future[m.Hello] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = CorkedTransport(transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._reader.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        answers = 0  # (answers, failures and parts: what wakes a call)
        for message in self._reader.buffer_updated(nbytes):
            kind = type(message)
            if kind is m.Answer:
                answers += 1
                # A decoupled model may go on sending after its execute returned: its
                # request keeps receiving parts until the final one.
                reply = self._waiting.pop(message.id, None)
                traced = self._traced.pop(message.id, None)
                if message.links and traced is not None and traced.trace is not None:
                    traced.trace.link_to(message.links)  # type: ignore[attr-defined]
                if reply is not None:
                    reply.set(message.value)
            elif kind is m.Failed:
                answers += 1
                reply = self._waiting.pop(message.id, None)
                self._parts.pop(message.id, None)
                self._traced.pop(message.id, None)
                if reply is not None:
                    reply.fail(message.error)
            elif kind is m.Part:
                answers += 1
                request = (
                    self._parts.pop(message.id, None)
                    if message.final
                    else self._parts.get(message.id)
                )
                if request is not None and request.sender is not None:
                    with contextlib.suppress(RuntimeError):
                        request.sender.send(
                            message.response, error=message.error, final=message.final
                        )
            elif kind is m.Released:
                self._lane.release(message.names)
            elif kind is m.Dropped:
                self._lanes.forget(message.names)
            elif kind is m.Hello and not self.hello.done():
                self.hello.set_result(message)
            else:
                self._on_message(message)
        message = None  # (a tensor no one kept is let go of now)
        if answers > 1 and self._transport is not None:
            # The calls these answers wake write them in the loop's next turn: to a gRPC
            # connection, together (core/cork.py). (One answer alone has nothing to go with.)
            self._transport.cork.hold()
        if self._lanes.due:  # otherwise they ride with the next message (engine/lanes.py)
            with contextlib.suppress(TritonError):  # the engine is gone: nothing to release
                self.send(m.Released(self._lanes.pop_taken()))

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._lane.close()
        self._lanes.close()
        waiting, self._waiting = self._waiting, {}
        parts, self._parts = self._parts, {}
        self._traced.clear()
        # Every stream ends, a decoupled one whose execute returned included, and every call
        # and request fails: nothing waits for an engine that is gone.
        for request in parts.values():
            if request.sender is not None:
                with contextlib.suppress(RuntimeError):
                    request.sender.send(error=unavailable(ENGINE_GONE), final=True)
        for reply in waiting.values():
            reply.fail(unavailable(ENGINE_GONE))
        if not self.hello.done():
            self.hello.set_exception(unavailable(ENGINE_GONE))
        self.closed.set()
        self._on_message(None)  # the connection is over

    @property
    def connected(self) -> bool:
        return self._transport is not None and not self._transport.is_closing()

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def send(self, message: object) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            raise unavailable(ENGINE_GONE)
        write(transport, encode(message, self._lane, self._regions), self._lane, self._lanes)

    def submit(self, request: InferenceRequest) -> tuple[int, Reply[InferenceResponse]]:
        id = next(self._ids)
        reply: Reply[InferenceResponse] = Reply()
        streamed = request.sender is not None
        lease = request.context.get(LEASE)
        targets = lease.places() if lease is not None and not streamed else ()
        self.send(m.Submit(id, request, streamed, targets))
        self._waiting[id] = reply
        if streamed:
            self._parts[id] = request
        if request.trace is not None:
            self._traced[id] = request
        # A request cancelled here (its client left, its stream closed) is cancelled there.
        request.on_cancel = functools.partial(self.cancel, id)
        return id, reply

    def cancel(self, id: int) -> None:
        """Tell the engine that whoever waited for `id` is gone (nothing once it is answered)."""
        if (id in self._waiting or id in self._parts) and self.connected:
            self.send(m.Cancel(id))

    async def leave(self, patience: float) -> None:
        """Tell the engine this front end stops, and wait (up to `patience` seconds) until it
        has taken note: the last front end waits for the engine to close its listeners."""
        if not self.connected:
            return
        id = next(self._ids)
        reply: Reply[Any] = Reply()
        self._waiting[id] = reply
        self.send(m.Leave(id))
        with anyio.move_on_after(patience), contextlib.suppress(TritonError):
            await reply.wait()

    async def call(self, method: str, *args: Any) -> Any:
        id = next(self._ids)
        reply: Reply[Any] = Reply()
        self.send(m.Call(id, method, args))
        self._waiting[id] = reply
        try:
            return await reply.wait()
        except asyncio.CancelledError:
            self._waiting.pop(id, None)
            self.cancel(id)
            raise


class RemoteRouter(Router):
    """The front end's router: the engine's table, read here; requests sent there."""

    def __init__(self, connection: EngineConnection, lazy: bool) -> None:
        super().__init__(cache=None)
        self._connection = connection
        if lazy:
            self.loader = self._load

    def connect(self, connection: EngineConnection) -> None:
        self._connection = connection

    async def _load(self, name: str) -> None:
        await self._connection.call("ensure_loaded", name)

    async def ensure_loaded(self, name: str) -> None:
        if self.loader is not None and name not in self._models:
            await self._load(name)

    def apply(self, table: m.Table) -> None:
        models: dict[str, dict[int, ModelHandle]] = {}
        for version in table.versions:
            models.setdefault(version.name, {})[version.version] = _handle(version)
        # (The engine's table holds what serves: an ensemble away is not in it.)
        self._models = self._added = {name: dict(sorted(v.items())) for name, v in models.items()}
        self.known = set(table.known)
        self.tried = dict(table.tried)

    async def infer(self, request: InferenceRequest) -> InferenceResponse:
        if self.loader is not None:
            await self.ensure_loaded(request.model_name)
        self._validate(request)
        _, reply = self._connection.submit(request)
        try:
            return await reply.wait()
        except asyncio.CancelledError:
            request.cancel()  # tells the engine (`on_cancel`)
            reply.fail(cancelled(f"request for model '{request.model_name}' was cancelled"))
            raise

    def submit(self, request: InferenceRequest) -> Reply[InferenceResponse]:
        self._validate(request)
        _, reply = self._connection.submit(request)
        return reply

    async def prepare(self, request: InferenceRequest) -> None:
        return None  # the engine works out a large request's cache key off its loop

    def _validate(self, request: InferenceRequest) -> None:
        handle = self.resolve(request.model_name, request.model_version)
        handle.signature.validate(request)
        request.resolved_version = handle.version
        if request.trace is not None:
            request.trace.resolved(request)  # type: ignore[attr-defined]


def _handle(version: m.Version, statistics: VersionStatistics | None = None) -> ModelHandle:
    return ModelHandle(
        version.name,
        version.version,
        version.config,
        version.signature,
        None,  # type: ignore[arg-type]  # the scheduler is the engine's
        statistics if statistics is not None else VersionStatistics(False),
    )


class RemoteServer:
    """What the front ends of a process talk to when the engine lives in another process."""

    def __init__(self, server: Any, path: str) -> None:
        # `server`: the Server built from the same settings (never run here): its settings,
        # name, version and extensions, the trace settings a front end samples with.
        self._local = server
        self.settings = server.settings
        self.name = server.name
        self.version = server.version
        self.extensions = server.extensions
        self.tracing = None
        self.path = path
        self.shared_memory = SharedMemoryRegistry()
        self._regions: dict[str, m.Region] = {}
        self._leaving = False
        self.engine_lost = False  # the engine went away while this front end served
        self._connection: EngineConnection | None = None
        self.router = RemoteRouter(_Unconnected(), lazy=False)  # type: ignore[arg-type]

    @property
    def live(self) -> bool:
        return self._connection is not None and self._connection.connected

    def _on_message(self, message: object) -> None:
        kind = type(message)
        if message is None:
            self._engine_gone()
        elif kind is m.Table:
            self.router.apply(message)  # type: ignore[arg-type]
        elif kind is m.Regions:
            self._apply_regions(message)  # type: ignore[arg-type]
        elif kind is m.Ask:
            self._answer(message)  # type: ignore[arg-type]
        elif kind is m.TraceSettings:
            with contextlib.suppress(TritonError):
                self._local.trace_settings.update(message.changes, message.model)  # type: ignore[attr-defined]
        elif kind is m.TraceLeft:
            self._local.trace_settings.count_left(message.model, message.left)  # type: ignore[attr-defined]
        elif kind is m.TraceState:
            self._local.trace_settings.restore(message.snapshot)  # type: ignore[attr-defined]
        elif kind is m.LogSettings:
            with contextlib.suppress(TritonError, OSError):
                log_settings.update(message.settings)  # type: ignore[attr-defined]

    def _trace_used(self, scope: str) -> None:
        if self._connection is not None:
            with contextlib.suppress(TritonError):  # the engine is gone: nothing to count
                self._connection.send(m.TraceUsed(scope))

    def _engine_gone(self) -> None:
        """The engine went away while this front end served: what was in flight has failed;
        this process stops (SIGTERM: its ASGI server finishes what it is writing), and its
        supervisor starts another, which starts an engine again or joins the one another
        front end started (with none, the app ends the process with status 1: app.py).
        Serving 503 for ever would be worse."""
        if self._leaving:
            return
        self.engine_lost = True
        log.error("%s: this front end stops (its ASGI server may start it again)", ENGINE_GONE)
        # A moment first for the failures to reach their clients: under hypercorn, SIGTERM
        # ends a worker at once.
        asyncio.get_running_loop().call_later(STOP_GRACE_S, os.kill, os.getpid(), signal.SIGTERM)

    def _answer(self, ask: m.Ask) -> None:
        value: Any = None
        if ask.method == "in_use":
            value = self.shared_memory.in_use(*ask.args)
        if self._connection is not None and self._connection.connected:
            self._connection.send(m.Answer(ask.id, value))

    def _apply_regions(self, regions: m.Regions) -> None:
        """Map here what the engine registered: a region gone or registered anew (the same
        name for another object or size) is unmapped first."""
        registry = self.shared_memory
        wanted = {region.name: region for region in regions.regions}
        for name, region in list(self._regions.items()):
            if wanted.get(name) != region:
                del self._regions[name]
                # Even when a request here holds it (it took its lease after the engine asked):
                # the name must be free for what the engine registers under it now.
                registry.retire(region.kind, name)
        for name, region in wanted.items():
            if name in self._regions:
                continue
            try:
                if region.kind is Kind.SYSTEM:
                    registry.register_system(name, region.key, region.offset, region.byte_size)
                else:
                    registry.register_cuda(name, region.handle, region.device_id, region.byte_size)
            except TritonError as error:
                log.error("shared memory region '%s' could not be mapped here: %s", name, error)
            else:
                self._regions[name] = region

    @asynccontextmanager
    async def running(self) -> AsyncIterator[RemoteServer]:
        loop = asyncio.get_running_loop()
        router = self.router

        def connect() -> EngineConnection:
            connection = EngineConnection(self._on_message, self.shared_memory)
            router.connect(connection)
            return connection

        transport, connection = await loop.create_unix_connection(connect, self.path)
        if not same_user(transport.get_extra_info("socket")):
            transport.close()
            raise EngineFailed(f"{self.path} is answered by a process of another user")
        self._connection = connection
        connection.send(m.Join(os.getpid(), PROTOCOL))
        hello = await connection.hello
        if hello.protocol != PROTOCOL:
            connection.close()
            raise EngineFailed(
                f"the engine (pid {hello.pid}) runs tritonactor {hello.protocol}, this front "
                f"end {PROTOCOL}: stop the server and start it again"
            )
        if hello.lazy:
            router.loader = router._load
        # This process's front-end spans; the engine continues each request's trace, and
        # counts trace_count for every front end.
        self.tracing = self._local.new_tracing()
        self._local.trace_settings.on_use = self._trace_used
        settle_heap()
        try:
            yield self
        finally:
            self._leaving = True
            await connection.leave(self.settings.exit_timeout_secs)
            connection.close()
            self.shared_memory.close()
            tracing, self.tracing = self.tracing, None
            if tracing is not None:
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(tracing.shutdown)

    # --- calls ---------------------------------------------------------------------------------

    def _call(self, method: str, *args: Any) -> Any:
        if self._connection is None:
            raise unavailable(ENGINE_GONE)
        return self._connection.call(method, *args)

    async def ready(self) -> bool:
        return bool(await self._call("ready")) if self.live else False

    async def index(self, ready_only: bool = False) -> Any:
        return await self._call("index", ready_only)

    async def load(self, name: str, options: Any) -> None:
        await self._call("load", name, options)

    async def unload(self, name: str, options: Any) -> None:
        await self._call("unload", name, options)

    async def events(self, after: int = 0, limit: int = 100) -> Any:
        return await self._call("events", after, limit)

    async def trace_extension(self, model: str = "", changes: Any = None) -> Any:
        return await self._call("trace_extension", model, changes)

    async def log_settings(self, changes: Any = None) -> Any:
        return await self._call("log_settings", changes)

    async def render_metrics(self) -> bytes:
        return await self._call("metrics")

    async def statistics(self, name: str = "", version: str = "") -> list[ModelHandle]:
        found = await self._call("statistics", name, version)
        return [_handle(version_, statistics) for version_, statistics in found]

    async def register_system_memory(
        self, name: str, key: str, offset: int, byte_size: int
    ) -> None:
        await self._call("register_system", name, key, offset, byte_size)

    async def register_cuda_memory(
        self, name: str, handle: bytes, device_id: int, byte_size: int
    ) -> None:
        await self._call("register_cuda", name, handle, device_id, byte_size)

    async def unregister_memory(self, kind: Kind, name: str = "") -> None:
        await self._call("unregister", kind, name)


class _Unconnected:
    def submit(self, request: InferenceRequest) -> Any:
        raise unavailable(ENGINE_GONE)

    async def call(self, method: str, *args: Any) -> Any:
        raise unavailable(ENGINE_GONE)

    def cancel(self, id: int) -> None:
        return None
