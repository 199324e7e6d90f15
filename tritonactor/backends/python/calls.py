"""The server's side of what a model asks for (see `stub_calls` for the stub's): BLS requests
through the router, one response (`exec()`) or a stream of them (`exec(decoupled=True)`, on the
router's streaming with a `ResponseSender`), and model control (`pb_utils.load_model`...).

Each call arrives through the instance's reader. A BLS call with one response, read on the
server's event loop, is served there by a task of its own: it asks the router and writes the
answer back (from a thread when its tensors are large: `core/offload`), so a call waiting on
another model never holds up the reader and crosses no thread. Everything else (a decoupled
call, whose responses come from whichever thread sends them; model control; any call read off
the loop) is served from a small thread pool, its work run on the server's event loop
(`anyio.from_thread`, with the loop's token).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anyio.from_thread

from tritonactor.backends.base import InstanceContext
from tritonactor.backends.python import ipc
from tritonactor.backends.python.held import HeldRequests
from tritonactor.backends.python.wire import (
    bls_model_parameters,
    bls_parameters,
    response_to_wire,
)
from tritonactor.core import offload
from tritonactor.core.errors import ErrorCode, TritonError, internal, refused, unavailable
from tritonactor.core.types import (
    InferenceRequest,
    InferenceResponse,
    RequestedOutput,
    ResponseSender,
    Tensor,
)

log = logging.getLogger(__name__)

# Calls one instance may have waiting on the server at once.
CALL_THREADS = 8


class ServedCalls:
    def __init__(
        self,
        context: InstanceContext,
        channel: ipc.Channel,
        shm_prefix: str,
        held: HeldRequests,
        token: Callable[[], Any],
        inline_limit: int = ipc.INLINE_LIMIT,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self._context = context
        self._channel = channel
        self._shm_prefix = shm_prefix
        self._held = held
        self._token = token
        self._inline_limit = inline_limit  # (small answers travel inside the message)
        self._pool: ThreadPoolExecutor | None = None
        self._loop = loop  # the server's event loop, where the router is asked
        self._tasks: set[asyncio.Task[None]] = set()  # the BLS calls served on the loop
        # Once closed (the stub exited or is finalized) nothing more is written for it: what a
        # call answers late would be left in shared memory, nobody to read it.
        self._closed = False
        self._writing = threading.Lock()

    def submit(self, message: dict[str, Any]) -> None:
        """From the instance's reader: serve `message` (op bls or control), in a task when it is
        a BLS call with one response read on the server's loop, else on the pool."""
        if message["op"] == "bls" and not message.get("decoupled") and self._on_loop():
            assert self._loop is not None
            task = self._loop.create_task(self._serve_bls_here(message))
            self._tasks.add(task)  # (the loop keeps only a weak reference)
            task.add_done_callback(self._tasks.discard)
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(CALL_THREADS, f"{self._context.name}-calls")
        serve = self._serve_bls if message["op"] == "bls" else self._serve_control
        self._pool.submit(serve, message)

    def close(self) -> None:
        """No more answers for the stub; returns once none is being written."""
        with self._writing:
            self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def _send(self, message: dict[str, Any], tensors: list[tuple[str, Any]] | None = None) -> bool:
        """Send `message`, its `tensors` written first, inside it when small, else to shared
        memory (into message["shm"] and message["response"]["descriptors"]). False when the
        stub is gone: nothing is left behind. The tensors are written before the lock is
        taken, so that the loop, answering a small call, never waits on a large file being
        written by a thread."""
        shm = None
        if tensors is not None:
            if self._closed:
                return False
            shm, message["response"]["descriptors"] = ipc.write_tensors(
                self._shm_prefix, tensors, inline=self._inline_limit
            )
            message["shm"] = shm
        with self._writing:
            if self._closed:  # (closed while the tensors were written: the file goes too)
                ipc.remove_file(shm)
                return False
            try:
                self._channel.send(message)
            except OSError:  # the stub is gone; the reader reports it
                ipc.remove_file(shm)
                return False
            return True

    def _on_loop(self) -> bool:
        """Whether this runs on the server's event loop (the reader's, not a thread's)."""
        try:
            return asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return False

    # -- BLS ---------------------------------------------------------------------------------

    async def _serve_bls_here(self, message: dict[str, Any]) -> None:
        """A BLS call with one response, on the server's loop (`_serve_bls` on a thread).
        Whatever happens, the call is answered: with the response, or with an error (one
        writing the answer failed with, too), or, cancelled as the server stops, unavailable."""
        call = message["call"]
        answered = False

        def answer(response: InferenceResponse | None, error: TritonError | None) -> None:
            nonlocal answered
            try:
                self._answer(call, response, error)
            except Exception as exc:  # e.g. an output of a dtype no Triton datatype names
                self._answer(call, None, internal(f"{type(exc).__name__}: {exc}"))
            answered = True

        try:
            try:
                request = self._bls_request(message)
                self._refused_before_model(request, streamed=False)
                infer = self._context.infer
                assert infer is not None
                response = await infer(request)
            except TritonError as exc:
                answer(None, bls_error(exc, message["model_name"]))
            except Exception as exc:
                answer(None, internal(f"{type(exc).__name__}: {exc}"))
            else:
                # Large tensors are written to their file off the loop (core/offload).
                work = offload.tensors_work(response.outputs)
                await offload.off_loop(lambda: answer(response, None), work)
        finally:
            if not answered:
                self._answer(call, None, unavailable("the server is stopping"))

    def _serve_bls(self, message: dict[str, Any]) -> None:
        try:
            request = self._bls_request(message)
            token = self._token()
            if token is None:
                raise unavailable("BLS is only supported during the 'execute' function.")
            self._refused_before_model(request, streamed=bool(message.get("decoupled")))
            if message.get("decoupled"):
                self._stream(message["call"], request, token)
                return
            infer = self._context.infer
            assert infer is not None
            response = anyio.from_thread.run(infer, request, token=token)
            self._answer(message["call"], response, None)
        except TritonError as exc:
            failure = bls_error(exc, message["model_name"])
            self._answer(message["call"], None, failure, message.get("decoupled", False))
        except Exception as exc:
            error = internal(f"{type(exc).__name__}: {exc}")
            self._answer(message["call"], None, error, message.get("decoupled", False))

    def _bls_request(self, message: dict[str, Any]) -> InferenceRequest:
        inputs = [
            Tensor(name=name, datatype=datatype, shape=tuple(array.shape), data=array)
            for name, datatype, array in ipc.read_tensors(message["shm"], message["descriptors"])
        ]
        if self._context.infer is None:
            raise unavailable("BLS is not available to this model instance")
        request = InferenceRequest(
            model_name=message["model_name"],
            model_version=message["model_version"],
            id=message["id"],
            inputs=inputs,
            outputs=[RequestedOutput(name) for name in message["outputs"]],
            parameters=bls_parameters(message),
            headers=bls_model_parameters(message),
        )
        # A BLS request made with trace=request.trace() nests in that request's trace.
        parent = self._held.request(message.get("trace_key"))
        if parent is not None and parent.trace is not None:
            request.trace = parent.trace.child()
        return request

    def _refused_before_model(self, request: InferenceRequest, streamed: bool) -> None:
        """What Triton's python backend checks of a BLS call before it submits it, in its
        words: the model is ready (at the version asked), and a decoupled one is called with
        decoupled=True."""
        router = _router(self._context)
        if router is None:
            return
        name = request.model_name
        try:
            handle = router.resolve(name, request.model_version)
        except TritonError:
            if router.loader is not None and name in router.known:
                return  # lazy loading: the call itself loads it (or fails with the load's error)
            raise refused(
                internal(f"Failed for execute the inference request. Model '{name}' is not ready.")
            ) from None
        if handle.decoupled and not streamed:
            raise refused(
                internal(  # (the stray quote at the end is Triton's)
                    f"Model {name} is using the decoupled. The current BLS request call doesn't "
                    "support models using the decoupled transaction policy. Please use "
                    "'decoupled=True' argument to the 'exec' or 'async_exec' calls for "
                    "decoupled models.'"
                )
            )

    def _answer(
        self,
        call: int,
        response: InferenceResponse | None,
        error: TritonError | None,
        streamed: bool = False,
    ) -> None:
        """The one answer of a call (or, streamed, its only and final one)."""
        wire, tensors = response_to_wire(response, error)
        if streamed:
            message = {"op": "bls_stream", "call": call, "shm": None, "response": wire}
            message["final"] = True
        else:
            message = {"op": "bls_result", "call": call, "shm": None, "response": wire}
        try:
            self._send(message, tensors)
        except OSError as exc:  # the tensors could not be written
            failed = response_to_wire(None, internal(f"cannot pass the response: {exc}"))[0]
            self._send({**message, "shm": None, "response": failed})

    def _stream(self, call: int, request: InferenceRequest, token: Any) -> None:
        """A decoupled BLS call: every response the model sends goes to the stub as it comes,
        from whichever thread sends it; the last is marked final (a bare final flag travels
        without a response: the stub turns it into Triton's empty final response)."""
        submit = self._context.submit
        if submit is None:
            raise unavailable("decoupled BLS calls are not available to this model instance")

        def deliver(
            response: InferenceResponse | None, error: TritonError | None, final: bool
        ) -> None:
            message = {"op": "bls_stream", "call": call, "shm": None, "final": final}
            if response is None and error is None:
                sent = self._send({**message, "response": None})
            else:
                failure = None if error is None else bls_error(error, request.model_name)
                wire, tensors = response_to_wire(response, failure)
                sent = self._send({**message, "response": wire}, tensors)
            if not sent and not final:
                request.cancel()  # the caller is gone: the model may stop early

        # `deliver` writes to the calling model's process, which may make it wait: a response
        # read on the event loop is handed on from a thread (backends/python/reader.py).
        sender = request.sender = ResponseSender(deliver, holds_up=True)

        def start() -> None:
            reply = submit(request)
            reply.add_done_callback(lambda done: sender.end_if_failed(done.result))

        anyio.from_thread.run_sync(start, token=token)

    # -- model control -----------------------------------------------------------------------

    def _serve_control(self, message: dict[str, Any]) -> None:
        answer: dict[str, Any] = {"op": "control_result", "call": message["call"], "error": None}
        try:
            control = getattr(self._context, "control", None)
            token = self._token()
            if control is None or token is None:
                raise unavailable(
                    "model control (pb_utils.load_model, unload_model, is_model_ready) is not "
                    "available to this model instance"
                )
            action, model = message["action"], message["model"]
            if action == "load":
                anyio.from_thread.run(
                    control.load,
                    model,
                    message.get("config", ""),
                    message.get("files") or {},
                    token=token,
                )
            elif action == "unload":
                anyio.from_thread.run(
                    control.unload, model, bool(message.get("unload_dependents")), token=token
                )
            else:
                answer["value"] = anyio.from_thread.run(
                    control.ready, model, message.get("version", ""), token=token
                )
        except TritonError as exc:
            answer["error"] = exc.message
        except Exception as exc:
            answer["error"] = f"{type(exc).__name__}: {exc}"
        self._send(answer)


def bls_error(error: TritonError, model: str) -> TritonError:
    """An error as Triton 2.51's python backend gives it to a BLS caller: INTERNAL, whatever
    its code; one the server gave before a model had the call (the model is not ready, the
    call is not valid for it, a scheduler refused it) prefixed with the model's name."""
    if error.refused:
        # (`refused` marks the server's refusals: the router's, the schedulers', the checks above)
        return internal(f"Model {model} - Error when running inference: {error.message}")
    return error if error.code is ErrorCode.INTERNAL else internal(error.message)


def _router(context: InstanceContext) -> Any:
    """The router behind the instance's `infer` (the server gives instances `Router.infer`),
    to tell a decoupled model apart before calling it; None for any other `infer`."""
    return getattr(context.infer, "__self__", None)
