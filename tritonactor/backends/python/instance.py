"""One python model instance, as the server sees it: a stub process and the reader of its socket.

`PythonInstance.execute` writes the batch's input tensors into shared memory, sends descriptors
on the instance's socket and awaits the answer on the event loop. The event loop reads the
socket (`add_reader`: no thread to wake between the stub's answer and the request it answers)
and takes everything the stub sends — results, responses sent through response senders (which
may come after execute returned), BLS calls, cancellation queries, log lines — and notices at
once when the process dies: it fails what the process was running and tells whoever watches
the instance (`on_death`, the instance actor), so that a replacement starts at once, not when
the next request meets the dead process. (An instance made elsewhere than on a worker thread
of the loop, as the unit tests make theirs, reads with a thread of its own, the same way.)

Cancellation is asked for, not pushed: the model's `is_cancelled()` sends the request's key and
the reader answers from `InferenceRequest.cancelled` (the server sets it from any thread, with
no event to hook), so nothing costs anything until a model asks.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
import anyio.from_thread
import anyio.lowlevel

from tritonactor.backends.base import (
    RESCHEDULE,
    BackendInstance,
    InstanceContext,
    InstanceDied,
    ModelContext,
    Result,
)
from tritonactor.backends.lifetime import BatchNotRun
from tritonactor.backends.python import ipc
from tritonactor.backends.python.calls import ServedCalls
from tritonactor.backends.python.held import HeldRequests
from tritonactor.backends.python.metrics import InstanceMetrics
from tritonactor.backends.python.process import StubProcess, StubSettings, exit_description
from tritonactor.backends.python.reader import ChannelReader
from tritonactor.backends.python.wire import Reshapes, request_entry, response_from_wire
from tritonactor.core.errors import TritonError, internal, unavailable
from tritonactor.core.types import InferenceRequest

log = logging.getLogger(__name__)
# How long finalize waits for the reader to deliver what the exited stub sent last.
READER_DRAIN_TIMEOUT_S = 30.0

_FINAL = 1  # TRITONSERVER_RESPONSE_COMPLETE_FINAL


class PythonModelSpec(Protocol):
    """What an instance needs of its model (`backend.PythonModel`)."""

    context: ModelContext
    interpreter: str
    settings: StubSettings
    decoupled: bool
    output_names: list[str]
    iterative: bool

    def initialize_args(self, context: InstanceContext) -> dict[str, str]: ...


@dataclass(eq=False)
class _Pending:
    """One execute waiting on the loop for its stub's answer."""

    answered: asyncio.Future[None]  # done once `message` is in, or the process died
    loop_thread: int  # the thread of the loop that waits
    keys: list[int]
    message: dict[str, Any] | None = None
    died: bool = False
    taken: bool = False  # the dead process had taken the batch off its socket

    def wake(self) -> None:
        """Wake the execute waiting for this, from any thread (on the loop's own, at once)."""
        if threading.get_ident() == self.loop_thread:
            _settle(self.answered)
        else:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                self.answered.get_loop().call_soon_threadsafe(_settle, self.answered)


def _settle(answered: asyncio.Future[None]) -> None:
    if not answered.done():  # (its execute may have been cancelled meanwhile)
        answered.set_result(None)


class PythonInstance(BackendInstance):
    def __init__(self, model: PythonModelSpec, context: InstanceContext) -> None:
        self.model = model
        self.context = context
        self.name = context.name
        self._model_name = model.context.name
        self._model_version = str(model.context.version)
        self._reshapes = Reshapes.of(self._model_name, model.context.config)
        self._seq = itertools.count()
        self._keys = itertools.count()
        self._lock = threading.Lock()
        self._pending: dict[int, _Pending] = {}
        self._held = HeldRequests(self._model_name)
        self._metrics = InstanceMetrics()
        self._death: str | None = None
        self._death_watchers: list[Callable[[str], None]] = []
        self._finalizing = False
        self._closed = False
        # The server's event loop, which model control and BLS calls run on: known from here
        # (the instance is created on a worker thread of that loop), so that `initialize` may
        # already use them, as Triton's examples do (`pb_utils.load_model` in initialize).
        self._token: Any
        self._token, loop = _creator_loop()
        # The loop the last execute ran on: the token above is taken again at the first execute,
        # and whenever one comes from another loop (as in the unit tests, which make their
        # instances elsewhere).
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stub = StubProcess(model.interpreter, context.name, model.settings)
        model.starting[context.name] = self._stub  # (until it is up: `abort_create`)
        self._calls = ServedCalls(
            context,
            self._stub.answers,
            self._stub.parent_prefix,
            self._held,
            lambda: self._token,
            model.settings.inline_limit,
            loop,
        )
        # One execute at a time: its tensors travel through reused arenas (see ipc.Arena), or
        # inside its messages when they are small (ipc.INLINE_LIMIT).
        self._inputs_arena = self._stub.arena()
        self._results_arena = ipc.ArenaReader()
        try:
            self._stub.channel.send(
                {
                    "op": "init",
                    "args": model.initialize_args(context),
                    "model_file": str(model.context.model_path),
                    "decoupled": model.decoupled,
                }
            )
            self._stub.wait_for("ready", other=self._dispatch)
        except BaseException as exc:
            model.starting.pop(context.name, None)
            self._stub.stop(5)
            if isinstance(exc, TritonError):  # the model's own words, as Triton's backend
                log.error(
                    "model '%s' instance '%s' failed to initialize", self._model_name, self.name
                )
                raise internal(exc.message) from None
            raise
        model.starting.pop(context.name, None)
        self._reader = ChannelReader(
            self._stub.channel,
            self.name,
            loop,
            self._handle,
            self._holds_up,
            self._exited,
        )
        self._reader.start()

    @property
    def pid(self) -> int:
        return self._stub.process.pid

    def on_death(self, callback: Callable[[str], None]) -> None:
        """Call `callback(reason)` (from a thread of the instance's) when the process dies; at
        once if it already has. A process ended by `finalize` is not a death."""
        with self._lock:
            death = self._death
            if death is None:
                self._death_watchers.append(callback)
        if death is not None:
            callback(death)

    # -- execute (on the event loop) ---------------------------------------------------------

    async def execute(self, requests: list[InferenceRequest]) -> list[Result]:
        # On asyncio, as the actors' mailboxes: the answer wakes a future of the loop's own.
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop = loop
            self._token = anyio.lowlevel.current_token()
        seq = next(self._seq)
        keys = list(itertools.islice(self._keys, len(requests)))
        outputs = self.model.output_names
        entries: list[dict[str, Any]] = []
        arrays: list[tuple[str, Any]] = []
        reshapes = self._reshapes
        for key, request in zip(keys, requests, strict=True):
            entries.append(request_entry(key, request, outputs))
            for tensor in request.inputs:
                data = tensor.data if reshapes is None else reshapes.input(tensor.name, tensor.data)
                arrays.append((tensor.name, data))
        pending = _Pending(loop.create_future(), threading.get_ident(), keys)
        with self._lock:
            if self._death is not None:
                raise BatchNotRun(self._death)
            self._pending[seq] = pending
        for key, request in zip(keys, requests, strict=True):
            self._held.hold(key, request)
        completed = False
        try:
            shm, descriptors = ipc.write_tensors(
                self._stub.parent_prefix,
                arrays,
                self._inputs_arena,
                self.model.settings.inline_limit,
            )
            # A dead stub: the reader reports why. (try, not contextlib.suppress: three calls
            # fewer on every execute's path.)
            try:  # noqa: SIM105
                self._stub.channel.send(
                    {
                        "op": "execute",
                        "seq": seq,
                        "shm": shm,
                        "descriptors": descriptors,
                        "requests": entries,
                    }
                )
            except OSError:
                pass
            await pending.answered
            completed = True
        finally:
            with self._lock:
                self._pending.pop(seq, None)
            if not completed:
                # The stub may still read the abandoned batch: the next one gets a fresh arena.
                self._inputs_arena.close()
                for key in keys:
                    self._held.release(key)
        if pending.died:
            for key in keys:
                self._held.release(key)
            # A batch written to the socket of a process that was already dying, but never taken
            # off it, did not run: it may run elsewhere (the stub notes each batch it takes).
            raise InstanceDied(self._death) if pending.taken else BatchNotRun(self._death)
        assert pending.message is not None
        return self._results(requests, keys, pending.message)

    def _results(
        self, requests: list[InferenceRequest], keys: list[int], message: dict[str, Any]
    ) -> list[Result]:
        arrays = iter(
            ipc.read_tensors(
                message.get("shm"), message.get("descriptors", []), self._results_arena
            )
        )
        if message["error"] is not None:
            error = internal(message["error"])
            return [self._held.failed(key, error) for key in keys]
        released = message.get("release") or {}
        wires = message["responses"]
        results: list[Result] = []
        for index, (key, request) in enumerate(zip(keys, requests, strict=True)):
            wire = None if wires is None else wires[index]
            if key in released:
                results.append(self._rescheduled(key))
            elif wire is not None:  # the response execute returned
                self._held.release(key)
                results.append(
                    response_from_wire(
                        self._model_name, self._model_version, request, wire, arrays, self._reshapes
                    )
                )
            else:
                results.append(self._held.returned(key))
        return results

    def _rescheduled(self, key: int) -> Result:
        """The model released the request with RESCHEDULE: its scheduler runs it again."""
        request = self._held.release(key)
        if request is not None and request.sender is not None and request.sender.finished:
            log.warning(
                "model '%s' asked to reschedule a request it already finished; it is not rerun",
                self._model_name,
            )
            return None
        # The scheduler takes it back, or refuses it for a model without iterative sequences.
        return RESCHEDULE

    # -- what the stub sends (handed on by the reader) ------------------------------------------

    def _holds_up(self, message: dict[str, Any]) -> bool:
        """A response whose sender may wait for room: handed on from a thread."""
        return message["op"] == "send" and self._held.holds_up(message["key"])

    def _handle(self, message: dict[str, Any]) -> None:
        try:
            self._dispatch(message)
        except Exception:
            log.exception("instance '%s': cannot handle a message from its model", self.name)

    def _dispatch(self, message: dict[str, Any]) -> None:
        op = message["op"]
        if op == "result":
            with self._lock:
                pending = self._pending.get(message["seq"])
            if pending is None:  # its execute was cancelled: drop the answer
                shm = message.get("shm")
                if isinstance(shm, str) and not shm.startswith("@"):  # a file of its own
                    ipc.read_tensors(shm, message.get("descriptors", []))
                return
            pending.message = message
            pending.wake()
        elif op == "send":
            self._deliver(message)
        elif op == "dropped":
            self._held.dropped(message["key"])
        elif op in ("bls", "control"):
            self._calls.submit(message)
        elif op == "metric":
            answer = self._metrics.handle(message)
            if answer is not None:
                with contextlib.suppress(OSError):  # the stub is gone; the reader reports it
                    self._stub.answers.send(answer)
        elif op == "is_cancelled":
            with contextlib.suppress(OSError):  # the stub is gone; the reader reports it
                self._stub.answers.send(
                    {
                        "op": "cancelled",
                        "call": message["call"],
                        "cancelled": self._held.is_cancelled(message["key"]),
                    }
                )
        elif op == "log":
            self._stub.log(message)
        elif op in ("finalized", "started"):
            pass
        else:
            log.warning("instance '%s': unexpected message %r", self.name, op)

    def _deliver(self, message: dict[str, Any]) -> None:
        # Read (and so unlink) the tensors even when nobody takes them any more.
        arrays = iter(ipc.read_tensors(message["shm"], message["descriptors"]))
        request = self._held.request(message["key"])
        result = None
        if message["response"] is not None and request is not None:
            result = response_from_wire(
                self._model_name,
                self._model_version,
                request,
                message["response"],
                arrays,
                self._reshapes,
            )
        self._held.deliver(message["key"], result, bool(message["flags"] & _FINAL))

    def _exited(self) -> None:
        if self._finalizing:
            return
        returncode = self._stub.wait(5)
        reason = (
            f"python model process for instance '{self.name}' exited with "
            f"{exit_description(returncode)}"
        )
        log.error("model '%s': %s", self._model_name, reason)
        # The process is gone: how far it got is final. A batch it took may have run in part;
        # one still in the socket (written while the process was dying) never began.
        taken = self._stub.taken.value
        with self._lock:
            self._death = reason
            pendings = list(self._pending.items())
            watchers, self._death_watchers = self._death_watchers, []
        in_flight = {key for _, pending in pendings for key in pending.keys}
        for seq, pending in pendings:
            pending.taken = seq < taken
            pending.died = True
            pending.wake()
        # Requests of earlier batches still answering (through their senders): they end here.
        self._held.fail_all(unavailable(reason), keep=in_flight)
        self._metrics.release_all()
        self._calls.close()  # before the files go: no late BLS answer writes another
        ipc.remove_files(self._stub.shm_prefix)
        for watcher in watchers:  # last: the replacement starts with this one cleaned up
            try:
                watcher(reason)
            except Exception:
                log.exception("instance '%s': a watcher of its death failed", self.name)

    # -- finalize ----------------------------------------------------------------------------

    def finalize(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._finalizing = True
        self._stub.finish(self.model.settings.start_timeout_s)
        # The process is gone: the reader delivers what it sent last (answers from the model's
        # finalize) and stops at the end of the channel; only then is the channel closed, its
        # files removed, and what is still unanswered failed.
        self._reader.finish(READER_DRAIN_TIMEOUT_S)
        self._calls.close()  # before the files go: no late BLS answer writes another
        self._stub.close()
        self._inputs_arena.close()
        self._results_arena.close()
        self._metrics.release_all()
        # Whatever the model never answered fails now, rather than its clients waiting forever.
        self._held.fail_all(
            unavailable(
                f"model instance '{self.name}' was finalized before it answered the request"
            )
        )


def _creator_loop() -> tuple[Any, asyncio.AbstractEventLoop | None]:
    """The anyio token and the asyncio event loop of the loop whose worker thread runs this
    (None elsewhere; the loop None too on another anyio backend), asked in one call."""

    def ask() -> tuple[Any, asyncio.AbstractEventLoop | None]:
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        return anyio.lowlevel.current_token(), loop

    try:
        return anyio.from_thread.run_sync(ask)
    except RuntimeError:
        return None, None
