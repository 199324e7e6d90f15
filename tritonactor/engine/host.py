"""The engine's side of the front-end connections: a Unix socket on which each front-end
process holds one connection, carrying typed messages (`engine/messages.py`) both ways.

Each connection is served by an asyncio protocol on the engine's event loop: an inference
request goes straight to the server's router (`Router.submit`, with its reply's done callback
writing the answer back), so a request costs no task of its own unless it must wait (a mailbox
that is full, a lazy load). A call is a method of `EngineServer`, run as a task. Whenever the
router's table or the shared-memory regions change, every connection is told before anything
that follows the change is answered."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import itertools
import logging
import os
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import numpy as np

from tritonactor.actors import Reply
from tritonactor.core import offload
from tritonactor.core.cork import CorkedTransport
from tritonactor.core.datatypes import to_numpy_dtype
from tritonactor.core.errors import TritonError, cancelled, internal
from tritonactor.core.tensors import tensor_to_bytes
from tritonactor.core.types import (
    OUTPUT_BUFFERS,
    InferenceRequest,
    InferenceResponse,
    ResponseSender,
)
from tritonactor.engine import messages as m
from tritonactor.engine.frame_reader import FrameReader
from tritonactor.engine.lanes import Lane, LaneReader, remove_owned, sweep_lanes
from tritonactor.engine.launch import peer_pid, same_user
from tritonactor.engine.own_files import hold, remove_own
from tritonactor.engine.wire import (
    OUT_OF_BAND,
    PROTOCOL,
    TRACE_CROSSING,
    encode,
    write,
)
from tritonactor.memory.lease import check_output_size
from tritonactor.memory.registry import Place, SharedMemoryRegistry
from tritonactor.observability import logging as log_settings
from tritonactor.scheduling.router import Router

log = logging.getLogger(__name__)


class ObservedRouter(Router):
    """The engine's router: tells `changed` whenever its table of ready versions changes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.changed: Callable[[], None] = lambda: None

    def add(self, handle: Any) -> None:
        super().add(handle)
        self.changed()

    def remove(self, name: str, version: int) -> None:
        super().remove(name, version)
        self.changed()

    def tried_load(self, name: str, versions: frozenset[int] | None = frozenset()) -> bool:
        if not super().tried_load(name, versions):
            return False
        self.changed()
        return True


def table(router: Router) -> m.Table:
    return m.Table(
        tuple(
            m.Version(handle.name, handle.version, handle.config, handle.signature)
            for handle in router.handles()
        ),
        frozenset(router.known),
        dict(router.tried),
    )


class _Connection(asyncio.BufferedProtocol):
    def __init__(self, host: EngineHost) -> None:
        self._host = host
        # Large tensors: those sent go through this side's lane, those received come from
        # the front end's (engine/lanes.py).
        self._lane = Lane()
        self._lanes = LaneReader()
        # Tensors in clients' system shared-memory regions cross as where they lie.
        self._regions: SharedMemoryRegistry = host.server.shared_memory
        self._reader = FrameReader(self._lanes, self._regions)
        self._peer = 0  # the front end's pid
        self._transport: CorkedTransport | None = None
        # Requests in flight, by id: what a Cancel reaches.
        self._requests: dict[int, InferenceRequest] = {}
        # Where requests in flight want outputs written (`Submit.targets`), by id.
        self._targets: dict[int, tuple[tuple[str, Place], ...]] = {}
        self._tasks: dict[int, asyncio.Task[None]] = {}
        # What the engine asked this front end, by id.
        self._asked: dict[int, asyncio.Future[Any]] = {}
        self._asks = itertools.count(1)

    # --- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Wrapped: a batch's answers go in one write (core/cork.py, scheduling/instance.py).
        self._transport = CorkedTransport(transport)
        sock = transport.get_extra_info("socket")
        if not same_user(sock):
            log.error("a process of another user connected to the engine: closed")
            transport.close()
            return
        self._peer = peer_pid(sock)
        self._host.open.add(self)
        self.send(m.Hello(os.getpid(), self._host.server.settings.lazy_load, PROTOCOL))
        self.send(table(self._host.server.router))
        self.send(self._host.regions())
        self.send(self._host.server.trace_state())
        # The log settings in force, perhaps changed since the server started (uvicorn's
        # replacement of a front end that died starts with the command line's); the log file
        # is the command line's in every process, and no request may change it.
        settings = log_settings.current()
        del settings["log_file"]
        self.send(m.LogSettings(settings))

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._reader.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        try:
            received = self._reader.buffer_updated(nbytes)
        except Exception:
            log.exception("a front end sent a frame that does not decode: closing it")
            assert self._transport is not None
            self._transport.close()
            return
        for message in received:
            self._dispatch(message)
        del received  # (with the last message: a tensor no one kept is let go of now)
        message = None
        if self._lanes.due:  # otherwise they ride with the next message (engine/lanes.py)
            self.send(m.Released(self._lanes.pop_taken()))

    async def ask(self, method: str, *args: Any) -> Any:
        """Ask the front end (None when it has gone meanwhile)."""
        id = next(self._asks)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._asked[id] = future
        self.send(m.Ask(id, method, args))
        return await future

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._lane.close()
        self._lanes.close()
        if self in self._host.connections:
            # What the front end made, mapped here or not: it may have died.
            remove_owned(self._peer)
        for future in self._asked.values():
            if not future.done():
                future.set_result(None)
        self._asked.clear()
        for request in self._requests.values():
            request.cancel()
        self._requests.clear()
        for task in self._tasks.values():
            task.cancel()
        self._targets.clear()
        self._host.lost(self)

    # --- messages ------------------------------------------------------------------------------

    def send(self, message: object) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        try:
            pieces = encode(message, self._lane, self._regions)
        except Exception as error:
            # An answer that does not pickle (a backend's odd output) fails its request rather
            # than leaving the front end waiting for it.
            id = getattr(message, "id", None)
            log.exception("an answer for a front end could not be encoded")
            if id is None or isinstance(message, m.Failed):
                return
            pieces = encode(m.Failed(id, internal(f"the answer could not be sent: {error}")))
        write(transport, pieces, self._lane, self._lanes)

    def _dispatch(self, message: object) -> None:
        if type(message) is m.Submit:
            self._submit(message)
        elif type(message) is m.Cancel:
            request = self._requests.get(message.id)
            if request is not None:
                request.cancel()
            task = self._tasks.get(message.id)
            if task is not None:
                task.cancel()
        elif type(message) is m.Call:
            self._start(message.id, self._call(message))
        elif type(message) is m.Join:
            if message.protocol == PROTOCOL:
                self._host.connections.add(self)
                self._host.joined = True
                self._host.settled.set()
        elif type(message) is m.Leave:
            self._host.connections.discard(self)
            if self._host.connections:
                self.send(m.Answer(message.id, None))
            else:
                self._host.deserted.set()
        elif type(message) is m.TraceUsed:
            self._host.server.trace_used(message.model)
        elif type(message) is m.Released:
            self._lane.release(message.names)
        elif type(message) is m.Dropped:
            self._lanes.forget(message.names)
        elif type(message) is m.Answer:
            asked = self._asked.pop(message.id, None)
            if asked is not None and not asked.done():
                asked.set_result(message.value)
        elif type(message) is m.Failed:
            # A request whose tensor lies in a region the engine no longer has (wire.py): it
            # fails back to its front end.
            self.send(message)
        else:
            log.error("a front end sent an unknown message %r", type(message).__name__)

    def _start(self, id: int, work: Any) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks[id] = task
        task.add_done_callback(lambda _: self._tasks.pop(id, None))

    async def _call(self, call: m.Call) -> None:
        try:
            value = await self._host.server.engine_call(call.method, call.args)
        except TritonError as error:
            self.send(m.Failed(call.id, error))
        except Exception as error:
            log.exception("engine call %s failed", call.method)
            self.send(m.Failed(call.id, internal(f"{type(error).__name__}: {error}")))
        else:
            self.send(m.Answer(call.id, value))

    def _submit(self, message: m.Submit) -> None:
        request = message.request
        host = self._host
        crossed = request.context.pop(TRACE_CROSSING, None)
        if crossed is not None and host.continue_trace is not None:
            request.trace = host.continue_trace(crossed)
        id = message.id
        if message.streamed:
            request.sender = ResponseSender(
                lambda response, error, final: host.on_loop(
                    self._part, m.Part(id, response, error, final)
                )
            )
        if message.targets:
            request.context[OUTPUT_BUFFERS] = functools.partial(self._buffers, message.targets)
        router = host.server.router
        if router.loader is not None and not router.ready_versions(request.model_name):
            self._start(id, self._submit_waiting(id, request))
            return
        try:
            reply = router.submit(request)
        except TritonError as error:
            self.send(m.Failed(id, error))
            return
        self._requests[id] = request
        if message.targets:
            self._targets[id] = message.targets
        reply.add_done_callback(functools.partial(self._answer, id))

    def _buffers(
        self, targets: tuple[tuple[str, Place], ...], request: InferenceRequest
    ) -> dict[str, memoryview]:
        """`OUTPUT_BUFFERS` for a request of this front end, asked right before its run: a
        backend that writes an output there itself spares `_write_targets` its copy. Nothing
        once the front end has gone (its leases, which kept the regions registered, went with
        it)."""
        if self._transport is None:  # (read from the instance's thread, perhaps: no call)
            return {}
        return self._regions.offer(request.inputs, targets)

    async def _submit_waiting(self, id: int, request: InferenceRequest) -> None:
        """A request that may wait: for a lazy load, or for room in a full mailbox."""
        router = self._host.server.router
        self._requests[id] = request
        try:
            if request.sender is None:
                response = await router.infer(request)
            else:
                await router.ensure_loaded(request.model_name)
                reply = router.submit(request)
                await _settled(reply)
                response = reply.result()
        except TritonError as error:
            self._requests.pop(id, None)
            self.send(m.Failed(id, error))
        else:
            self._settle(id, request)
            self._reply(id, request, response, None)  # (a traced one's links go with it)

    def _part(self, part: m.Part) -> None:
        if part.final:
            self._requests.pop(part.id, None)
        self.send(part)

    def _settle(self, id: int, request: InferenceRequest) -> None:
        """Its execute is over: a decoupled request may still be cancelled until its model
        sent the final response."""
        if request.sender is None or request.sender.finished:
            self._requests.pop(id, None)

    def _answer(self, id: int, reply: Reply[InferenceResponse]) -> None:
        error = reply.error
        request = self._requests.get(id)
        if error is not None or request is None:
            self._requests.pop(id, None)
        else:
            self._settle(id, request)
        targets = self._targets.pop(id, None) if self._targets else None
        if targets is None or error is not None or request is None:
            # (No request: its front end has gone, and with it the leases that kept its
            # regions from being unregistered: nothing is written into them any more.)
            self._reply(id, request, reply.result() if error is None else None, error)
            return
        response = reply.result()
        write = functools.partial(self._write_targets, response, targets)
        if not offload.large(_bytes_due(response, targets, self._regions)):
            try:
                written = write()
            except Exception as failed:
                self._reply(id, request, None, failed)
            else:
                self._reply(id, request, written, None)
            return
        # A large copy leaves the engine's loop; the answer follows it, whatever happens.
        offload.start(write).add_done_callback(
            lambda done: (
                self._reply(id, request, None, cancelled("the copy was cancelled"))
                if done.cancelled()
                else self._reply(
                    id, request, None if done.exception() else done.result(), done.exception()
                )
            )
        )

    def _reply(
        self,
        id: int,
        request: InferenceRequest | None,
        response: InferenceResponse | None,
        error: BaseException | None,
    ) -> None:
        trace = request.trace if request is not None else None
        if trace is not None and error is None:
            # The stages' spans are closed (an instance closes its batch's before answering):
            # the front end's span, which ends when the answer arrives, outlasts them.
            self.send(m.Answer(id, response, tuple(trace.links_back())))  # type: ignore[attr-defined]
        elif error is None:
            self.send(m.Answer(id, response))
        elif isinstance(error, TritonError):
            self.send(m.Failed(id, error))
        else:
            self.send(m.Failed(id, internal(f"{type(error).__name__}: {error}")))

    def _write_targets(
        self, response: InferenceResponse, targets: tuple[tuple[str, Place], ...]
    ) -> InferenceResponse:
        """`response` with its large outputs of numbers (those that would cross out of band)
        that are due in system regions written there, and viewing them: they cross as where
        they lie, and the front end copies nothing (`OutputTarget.holds`). An output too
        large for its place fails the request as the front end would (`Lease.write`); one
        whose region is gone here is left for the front end to write."""
        places = dict(targets)
        outputs = list(response.outputs)
        for index, tensor in enumerate(outputs):
            place = places.get(tensor.name)
            data = tensor.data
            if (
                place is None
                or type(data) is not np.ndarray
                or data.nbytes < OUT_OF_BAND  # it crosses in the frame: the front end writes it
                or data.dtype.kind == "O"
                or data.dtype != to_numpy_dtype(tensor.datatype)
                or self._regions.lies_at(data, place)  # the backend wrote it there: it stays
            ):
                continue
            chunk = tensor_to_bytes(tensor.datatype, data)
            check_output_size(tensor.name, place[4], chunk.size)
            try:
                written = self._regions.write_at(place, chunk)  # type: ignore[arg-type]
            except TritonError:
                continue
            view = np.frombuffer(written, data.dtype).reshape(data.shape)
            outputs[index] = dataclasses.replace(tensor, data=view)
        return dataclasses.replace(response, outputs=outputs)


def _bytes_due(
    response: InferenceResponse,
    targets: tuple[tuple[str, Place], ...],
    regions: SharedMemoryRegistry,
) -> int:
    """The bytes `_write_targets` copies."""
    places = dict(targets)
    due = 0
    for tensor in response.outputs:
        place = places.get(tensor.name)
        data = tensor.data
        if (
            place is not None
            and type(data) is np.ndarray
            and data.nbytes >= OUT_OF_BAND
            and not regions.lies_at(data, place)
        ):
            due += data.nbytes
    return due


async def _settled(reply: Reply[Any]) -> None:
    with contextlib.suppress(Exception):
        await reply.wait()


class EngineHost:
    """Serves front-end connections on the Unix socket `path` for `server` (an EngineServer)."""

    def __init__(self, server: Any, path: str) -> None:
        self.server = server
        self.path = path
        # Every connection open, and those of them that joined as front ends.
        self.open: set[_Connection] = set()
        self.connections: set[_Connection] = set()
        self.loop = asyncio.get_event_loop()
        self.continue_trace: Callable[[tuple[Any, ...]], Any] | None = None
        # Set once a front end has connected and every one has gone since.
        self.deserted = asyncio.Event()
        self._thread = threading.get_ident()
        # Whether a front end has ever joined; and an event set whenever a front end joins or
        # the last open connection closes.
        self.joined = False
        self.settled = asyncio.Event()

    def on_loop(self, call: Callable[[object], None], message: object) -> None:
        """`call(message)` now when on the engine's loop, else soon on it (a backend's
        thread): the order of one request's parts is kept either way."""
        if threading.get_ident() == self._thread:
            call(message)
        else:
            self.loop.call_soon_threadsafe(call, message)

    def regions(self) -> m.Regions:
        return self.server.regions()

    async def ask_all(self, method: str, *args: Any) -> list[Any]:
        """Ask every front end; the answers of those that answered."""
        answers = await asyncio.gather(*(c.ask(method, *args) for c in list(self.connections)))
        return [answer for answer in answers if answer is not None]

    def broadcast(self, message: object) -> None:
        for connection in list(self.open):
            connection.send(message)

    def lost(self, connection: _Connection) -> None:
        self.open.discard(connection)
        if not self.open:
            self.settled.set()
        if connection not in self.connections:
            return  # never joined: a probe
        self.connections.discard(connection)
        if not self.connections:
            self.deserted.set()

    @asynccontextmanager
    async def serving(self) -> AsyncIterator[EngineHost]:
        """Accept front ends on the socket while the block runs (the connections made stay
        open until `connected` ends)."""
        self.loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        sweep_lanes()  # what a server killed outright left in /dev/shm
        listener = await self.loop.create_unix_server(lambda: _Connection(self), self.path)
        os.chmod(self.path, 0o600)
        own = hold(self.path)
        try:
            yield self
        finally:
            listener.close()
            remove_own(self.path, own)  # (not another engine's, that took the path since)

    @asynccontextmanager
    async def connected(self) -> AsyncIterator[None]:
        """Close every front end's connection when the block ends: the last front end to leave
        waits for that, so the server's process ends after what runs inside the block (the
        models' stop, their `finalize`)."""
        try:
            yield
        finally:
            for connection in list(self.open):
                if connection._transport is not None:
                    connection._transport.close()
