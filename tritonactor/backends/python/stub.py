"""The stub: one process per python model instance, running the model's `TritonPythonModel`.

    python -m tritonactor.backends.python.stub --fd N --answers-fd M --name INSTANCE
        --shm-prefix P [--shm-default-size B] [--shm-growth-size B] [--taken-fd FD]
        [--inline-limit B]

Fds N and M are this side of two socketpairs with the server (see `ipc`). The main thread reads
fd N itself (init, execute, finalize: one message at a time, no thread hand-off on the way to
the model) and sends everything the stub says on it. Fd M carries only the server's answers to
the model's own calls (BLS, cancellation queries, model control, metrics): a reader thread
hands each to the waiting call (`stub_calls`), so a model blocked in such a call while the main
thread runs it is still answered. What a `__del__` has to say is sent by a forwarding thread.
Coroutines (`async def execute`) run on an event loop of their own thread,
as in Triton: a non-decoupled execute is waited for; a decoupled one runs in the background
while the main thread takes the next batch, its answers going through the response senders.
stdout and stderr belong to the model (the server logs them); the protocol never uses them.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import importlib.machinery
import importlib.util
import inspect
import os
import queue
import signal
import socket
import sys
import threading
import traceback
from concurrent.futures import Future
from pathlib import Path
from typing import Any, NoReturn

from tritonactor.backends.python import _pb_runtime, ipc
from tritonactor.backends.python.stub_calls import ServerCalls
from tritonactor.backends.python.stub_wire import _FINAL, ExecuteError, WireConversions


class Stub(WireConversions):
    def __init__(
        self,
        channel: ipc.Channel,
        answers: ipc.Channel,
        name: str,
        shm_prefix: str,
        pb_utils: Any,
        shm_default_size: int = 0,
        shm_growth_size: int = 0,
        taken: ipc.Counter | None = None,
        inline_limit: int = ipc.INLINE_LIMIT,
    ) -> None:
        self.channel = channel
        # Where the stub notes each execute it takes (its seq + 1), for the server to read if
        # this process dies: a batch it never took runs elsewhere.
        self._taken = taken
        self.answers = answers
        self.name = name
        self.shm_prefix = shm_prefix
        self.pb = pb_utils
        self.model: Any = None
        self._model_file = ""  # model.py's path, as the init message gives it
        self.model_dir = ""  # its version's folder, once model.py is imported
        self.decoupled = False
        self.calls = ServerCalls(self)
        # What `__del__`s have to say, sent by the forwarding thread. SimpleQueue: a response
        # sender's __del__ may put into it from any thread, any time.
        self._forwards: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._background: set[Future[Any]] = set()
        # Execute messages come one at a time: their tensors travel through reused arenas.
        self._results_arena = ipc.Arena(f"{shm_prefix}-arena", shm_default_size, shm_growth_size)
        # Results of this many bytes or fewer travel inside their message (ipc.write_tensors).
        self._inline_limit = inline_limit
        self._inputs_arena = ipc.ArenaReader()
        # Responses leave in the order the model's threads called send(): writing the tensors
        # releases the GIL, and without it a later send could overtake an earlier one.
        self._send_lock = threading.Lock()
        self._gone = threading.Lock()  # held by the thread that ends the process (`_server_gone`)

    # -- the answers' reader thread and the forwarding thread --------------------------------

    def read_answers(self) -> None:
        while True:
            message = self.answers.recv()
            if message is None:
                self._server_gone()
            self.calls.answer(message)

    def forward_forever(self) -> None:
        while True:
            message = self._forwards.get()
            try:
                self.channel.send(message)
            except OSError:
                self._server_gone()

    def _server_gone(self) -> NoReturn:
        # The server is gone (killed, most likely): nobody is left to serve, or to clear the
        # shared memory of this instance, its side's or ours. Several threads may find it gone
        # at once (the requests' socket, the answers' socket): one clears and ends the process,
        # the others wait here for that (they raced on the results' arena, and the one that
        # failed could end the process before the other had cleared anything).
        with self._gone:
            try:
                self._results_arena.close()
            finally:
                ipc.remove_files(self.shm_prefix.removesuffix(ipc.STUB_SIDE))
                os._exit(0)

    # -- the main thread ---------------------------------------------------------------------

    def serve(self) -> None:
        self.channel.send({"op": "started"})
        while True:
            message = self.channel.recv()
            if message is None:
                self._server_gone()
            op = message["op"]
            if op == "init":
                if not self._initialize(message):
                    return
            elif op == "auto_complete":
                self._auto_complete(message)
            elif op == "execute":
                if self._taken is not None:
                    self._taken.value = message["seq"] + 1
                self._execute(message)
            elif op == "finalize":
                self._finalize()
                return

    def _load_class(self, model_file: str) -> Any:
        """model.py's `TritonPythonModel`, model.py imported as Triton's stub imports it: the
        module `<version>.<file stem>` (its `__name__`), of a package that is the version's
        folder (so that `from .helper import ...` finds a sibling, its `__init__.py` runs and
        `importlib.resources` reads the files beside it), with the version's folder and the
        model's folder put last on `sys.path` (sibling modules import by their names, and
        installed packages come first, as in Triton). The package is looked for in the model's
        folder only, not along `sys.path`, where a folder of the same name in the working
        folder would come first."""
        path = Path(model_file)
        version_dir = path.parent
        self.model_dir = str(version_dir)  # pb_utils.get_model_dir()
        sys.path.append(str(version_dir))
        sys.path.append(str(version_dir.parent))
        package_name = version_dir.name
        # Found in the model's folder alone; its __init__.py, if any, runs (a namespace
        # package otherwise, as Triton's import makes it).
        spec = importlib.machinery.PathFinder.find_spec(package_name, [str(version_dir.parent)])
        if spec is None:
            raise ImportError(f"cannot import {version_dir} as the package {package_name!r}")
        package = importlib.util.module_from_spec(spec)
        sys.modules[package_name] = package
        if spec.loader is not None:
            spec.loader.exec_module(package)
        module_name = f"{package_name}.{path.stem}"
        __import__(module_name)  # (through the import system, as Triton's stub imports it)
        module = sys.modules[module_name]
        model_class = getattr(module, "TritonPythonModel", None)
        if model_class is None:
            # Triton's words: its stub imports model.py as a module of its version's folder.
            raise AttributeError(
                f"module '{path.parent.name}.{path.stem}' has no attribute 'TritonPythonModel'"
            )
        return model_class

    def _initialize(self, message: dict[str, Any]) -> bool:
        try:
            self.decoupled = message["decoupled"]
            self._model_file = message["model_file"]
            self.model = self._load_class(self._model_file)()
            initialize = getattr(self.model, "initialize", None)
            if initialize is not None:
                self._call(initialize, message["args"])
            is_ready = getattr(self.model, "is_ready", None)
            if is_ready is not None and not self._call(is_ready):
                raise RuntimeError("the model's is_ready() returned False")
        except BaseException as exc:
            # Logged by the server, which reports the failed load with these words.
            self.channel.send({"op": "failed", "error": _describe_where(exc)})
            return False
        self.channel.send({"op": "ready"})
        return True

    def _auto_complete(self, message: dict[str, Any]) -> None:
        try:
            model_class = self._load_class(message["model_file"])
            complete = getattr(model_class, "auto_complete_config", None)
            if complete is None:
                self.channel.send({"op": "auto_completed", "config": None})
                return
            wrapper = self.pb.ModelConfig(message["config"])
            result = complete(wrapper)
            if not isinstance(result, self.pb.ModelConfig):
                name = message["config"].get("name", "")
                raise ValueError(
                    f"auto_complete_config function in model '{name}' must return a valid "
                    "pb.ModelConfig object."
                )
            config = result.as_dict()
        except BaseException as exc:
            # Logged by the server, which reports the failed load with these words.
            self.channel.send({"op": "failed", "error": _describe_where(exc)})
            return
        self.channel.send({"op": "auto_completed", "config": config})

    def _execute(self, message: dict[str, Any]) -> None:
        seq = message["seq"]
        requests: list[Any] = []
        try:
            requests = self._requests_from_wire(message)
            try:
                execute = self.model.execute
            except AttributeError:
                raise ExecuteError(
                    f"Python model {self._model_file} does not implement `execute` method."
                ) from None
            returned = execute(requests)
            # (A list, what most models return, is never awaitable: no ABC check for it.)
            if type(returned) is not list and inspect.isawaitable(returned):
                if self.decoupled:
                    # Triton runs a decoupled coroutine in the background: the next batch need
                    # not wait for it; its answers go through the response senders.
                    self._run_in_background(returned, requests)
                    returned = None
                else:
                    returned = self._run_on_loop(returned)
            reply = self._responses_to_wire(seq, requests, returned)
            reply["release"] = self._released(requests)
        except BaseException as exc:
            text = str(exc) if isinstance(exc, ExecuteError) else _describe_where(exc)
            for request in requests:  # the server ends them all: no more sends
                request._sender._close()
            error = f"Failed to process the request(s) for model '{self.name}', message: {text}"
            self.log(2, error)  # an error line, as Triton's stub writes it
            reply = {"op": "result", "seq": seq, "shm": None, "responses": None, "error": error}
        self.channel.send(reply)

    def _finalize(self) -> None:
        finalize = getattr(self.model, "finalize", None)
        if finalize is not None:
            try:
                self._call(finalize)
            except BaseException as exc:
                error = _describe_where(exc)
                self.log(2, f"model instance '{self.name}': finalize failed: {error}")
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._results_arena.close()
        self.channel.send({"op": "finalized"})

    # -- coroutines --------------------------------------------------------------------------

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        """The model's event loop, running on a thread of its own (created on first use, from
        the main thread only)."""
        if self._loop is None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)  # what asyncio.get_event_loop() gives the main thread
            threading.Thread(target=loop.run_forever, name="stub-event-loop", daemon=True).start()
            self._loop = loop
        return self._loop

    def _run_on_loop(self, awaitable: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(_awaited(awaitable), self._event_loop()).result()

    def _run_in_background(self, awaitable: Any, requests: list[Any]) -> None:
        future = asyncio.run_coroutine_threadsafe(_awaited(awaitable), self._event_loop())
        self._background.add(future)
        # The callback holds the requests until the coroutine is done with them.
        future.add_done_callback(functools.partial(self._background_done, requests))

    def _background_done(self, requests: list[Any], future: Future[Any]) -> None:
        self._background.discard(future)
        error = future.exception() if not future.cancelled() else asyncio.CancelledError()
        if error is None:
            return
        text = (
            f"Failed to process the request(s) for model '{self.name}', message: "
            f"{_describe_where(error)}"
        )
        self.log(2, text)
        for request in requests:  # those it left unfinished end with its error
            sender = request._sender
            if not sender._is_closed:
                sender._close()
                self._send(request._key, None, _FINAL, error=("INTERNAL", text))

    def _call(self, function: Any, *args: Any) -> Any:
        result = function(*args)
        if inspect.isawaitable(result):
            result = self._run_on_loop(result)
        return result

    # -- what pb_utils calls -----------------------------------------------------------------

    def send_response(
        self, key: int, response: Any, flags: int, requested: frozenset[str] = frozenset()
    ) -> None:
        with self._send_lock:
            if response is None:
                self._send(key, None, flags)
                return
            entry, arrays = self._response_entry(response, requested)
            # Small ones inside the message: a file per response would cost each side its
            # system calls (a decoupled model's tokens are small and many).
            shm, descriptors = ipc.write_tensors(self.shm_prefix, arrays, inline=self._inline_limit)
            self._send(key, entry, flags, shm, descriptors)

    def _send(
        self,
        key: int,
        entry: dict[str, Any] | None,
        flags: int,
        shm: ipc.Place = None,
        descriptors: list[Any] | None = None,
        error: tuple[str, str] | None = None,
    ) -> None:
        if error is not None:
            entry = {"outputs": 0, "error": error, "parameters": {}}
        self.channel.send(
            {
                "op": "send",
                "key": key,
                "shm": shm,
                "descriptors": descriptors or [],
                "response": entry,
                "flags": flags,
            }
        )

    def forward(self, message: dict[str, Any]) -> None:
        """Send `message` to the server from the forwarding thread: what a `__del__` has to say
        (it may run on any thread, even one in the middle of a send, where only putting into a
        SimpleQueue is safe)."""
        self._forwards.put(message)

    def sender_dropped(self, key: int) -> None:
        """A response sender nobody holds any more, its request unfinished."""
        self.forward({"op": "dropped", "key": key})

    def metric(self, action: str, name: str, wait: bool = True, **arguments: Any) -> Any:
        """A custom-metric operation; without `wait` (a release, from a `__del__`) it is only
        forwarded."""
        if not wait:
            self.forward(
                {"op": "metric", "call": None, "action": action, "name": name, **arguments}
            )
            return None
        return self.calls.metric(action, name, **arguments)

    def bls(self, request: Any, decoupled: bool) -> Any:
        return self.calls.bls(request, decoupled)

    def bls_async(self, request: Any, decoupled: bool) -> Any:
        return self.calls.bls_async(request, decoupled)

    def is_cancelled(self, key: int) -> bool:
        return self.calls.is_cancelled(key)

    def control(self, action: str, model: str, **arguments: Any) -> Any:
        return self.calls.control(action, model, **arguments)

    def log(self, level: int, message: str, file: str = "", line: int = 0) -> None:
        """A line for the server's log, located at `file`:`line` (a model's logger call), or,
        without them, where the stub logs it (as Triton's lines name its stub's source)."""
        if not file:
            caller = sys._getframe(1)
            file, line = caller.f_code.co_filename, caller.f_lineno
        self.channel.send(
            {"op": "log", "level": level, "message": message, "file": file, "line": line}
        )


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def _describe(exc: BaseException) -> str:
    # (An exception without a message: pybind11's words for it, which Triton's stub writes.)
    return f"{type(exc).__name__}: {str(exc) or '<EMPTY MESSAGE>'}"


_OWN_FILES = os.path.dirname(os.path.abspath(__file__))  # the stub and its pb_utils


def _describe_where(exc: BaseException) -> str:
    """The error, and where in the model's code it was raised: Triton's python backend's
    words for a failed `initialize`, `auto_complete_config` or `execute` ("At:", then each
    frame from the innermost out, `file(line): function`), the stub's own frames left out."""
    frames = [
        frame
        for frame in reversed(traceback.extract_tb(exc.__traceback__))
        if not os.path.abspath(frame.filename).startswith(_OWN_FILES + os.sep)
    ]
    if not frames:
        return _describe(exc)
    where = "".join(f"  {f.filename}({f.lineno}): {f.name}\n" for f in frames)
    return f"{_describe(exc)}\n\nAt:\n{where}"


def _ignore_signal(number: int, frame: object) -> None:
    """SIGINT/SIGTERM reach the model's process and end nothing (see `main`)."""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="tritonactor.backends.python.stub")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--answers-fd", type=int, required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--shm-prefix", required=True)
    parser.add_argument("--shm-default-size", type=int, default=0)
    parser.add_argument("--shm-growth-size", type=int, default=0)
    parser.add_argument("--inline-limit", type=int, default=ipc.INLINE_LIMIT)
    parser.add_argument(
        "--taken-fd", type=int, help="the server's counter of executes taken (ipc.Counter)"
    )
    options = parser.parse_args(argv)
    # The server decides when this process ends (finalize, or a kill after the exit timeout;
    # its end of the socket closing when it dies): a Ctrl-C or SIGTERM sent to the whole
    # process group, as a terminal or systemd does, must not end a model mid-request while the
    # server drains (docs/shutdown.md). A handler that does nothing, not SIG_IGN (which the
    # processes a model starts would inherit: they could no longer be terminated), as Triton's
    # stub does.
    for received in (signal.SIGINT, signal.SIGTERM):
        signal.signal(received, _ignore_signal)
    # The model's process, not ours: Triton's stub leaves it [""] (unittest.main() in a model
    # would otherwise parse our options).
    sys.argv = [""]
    channel = ipc.Channel(socket.socket(fileno=options.fd))
    answers = ipc.Channel(socket.socket(fileno=options.answers_fd))
    # Model code imports the helpers by their Triton name. An alias rather than this folder on
    # sys.path, so that our other modules here cannot shadow a model's own `ipc` or `stub`; and
    # a folder holding only that name last on sys.path, for the processes a model starts
    # (importable/), as Triton's stub appends its backend folder.
    from tritonactor.backends.python import triton_python_backend_utils as pb_utils

    sys.modules["triton_python_backend_utils"] = pb_utils
    sys.path.append(str(Path(__file__).resolve().parent / "importable"))

    stub = Stub(
        channel,
        answers,
        options.name,
        options.shm_prefix,
        pb_utils,
        options.shm_default_size,
        options.shm_growth_size,
        None if options.taken_fd is None else ipc.Counter(options.taken_fd),
        options.inline_limit,
    )
    _pb_runtime.stub = stub
    threading.Thread(target=stub.read_answers, name="stub-answers", daemon=True).start()
    threading.Thread(target=stub.forward_forever, name="stub-forwarder", daemon=True).start()
    try:
        stub.serve()
    finally:
        # Finalized (or its model failed to initialize, or this side failed): what the server
        # wrote for this instance (its inputs' arena) has all been read and is never used
        # again. The server clears it too, but it may die between the two (a SIGTERM that makes
        # it unload, then a SIGKILL). What this side wrote is the server's to read still:
        # answers sent from finalize may be on their way.
        ipc.remove_files(stub.shm_prefix.removesuffix(ipc.STUB_SIDE) + ipc.SERVER_SIDE)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
