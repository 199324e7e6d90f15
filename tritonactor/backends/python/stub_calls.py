"""What a model asks of the server and waits for, on the stub's side: BLS calls (one response,
or a stream of them for `decoupled=True`), cancellation queries and model control.

Each call has an id. The stub's reader thread hands the server's answer to whoever waits: a
thread (a threading event), a coroutine on the model's event loop (an asyncio future), or a
`ResponseIterator` for a streamed BLS call. Any thread of the model may call.
"""

from __future__ import annotations

import asyncio
import json
import threading
from itertools import count
from typing import Any

from tritonactor.backends.python import ipc
from tritonactor.core.errors import ErrorCode

# How long is_cancelled() waits for the server's answer before saying False: the server answers
# from its reader thread at once, so this only bounds a model thread against a wedged server.
CANCELLED_QUERY_TIMEOUT_S = 5.0


class _Waiter:
    """A thread waiting for one answer."""

    __slots__ = ("event", "value")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.value: Any = None

    def set(self, value: Any) -> None:
        self.value = value
        self.event.set()


class ResponseIterator:
    """The responses of a decoupled BLS call, as they come: iterate it (blocking) or walk it
    with `async for` (on the model's event loop, without blocking it). The last response is an
    empty one when the model ended with a bare final flag, as in Triton. Once finished, a new
    iteration starts over from the first response."""

    def __init__(self) -> None:
        self._ready = threading.Condition()
        self._responses: list[Any] = []
        self._finished = False
        self._index = 0
        self._async_waiters: list[asyncio.Future[None]] = []

    def put(self, response: Any, final: bool) -> None:
        """From the stub's reader thread."""
        with self._ready:
            self._responses.append(response)
            self._finished = self._finished or final
            self._ready.notify_all()
            waiters, self._async_waiters = self._async_waiters, []
        for waiter in waiters:
            waiter.get_loop().call_soon_threadsafe(_set_result, waiter, None)

    def __iter__(self) -> ResponseIterator:
        with self._ready:
            if self._finished and self._index >= len(self._responses):
                self._index = 0
        return self

    def __next__(self) -> Any:
        with self._ready:
            while self._index >= len(self._responses) and not self._finished:
                self._ready.wait()
            return self._take(StopIteration)

    def __aiter__(self) -> ResponseIterator:
        return self.__iter__()

    async def __anext__(self) -> Any:
        while True:
            waiter = self._async_waiter(consume=True)
            if not isinstance(waiter, asyncio.Future):
                return waiter
            await waiter

    def wait_first(self) -> None:
        """Block until the first response (or the end) is there."""
        with self._ready:
            while not self._responses and not self._finished:
                self._ready.wait()

    async def first(self) -> None:
        while True:
            waiter = self._async_waiter(consume=False)
            if not isinstance(waiter, asyncio.Future):
                return
            await waiter

    def _async_waiter(self, consume: bool) -> Any:
        """The next response (or StopAsyncIteration), or a future to await until one comes."""
        with self._ready:
            if self._index < len(self._responses) or self._finished:
                return self._take(StopAsyncIteration) if consume else None
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._async_waiters.append(waiter)
            return waiter

    def _take(self, stop: type[Exception]) -> Any:
        if self._index < len(self._responses):
            self._index += 1
            return self._responses[self._index - 1]
        raise stop


class ServerCalls:
    def __init__(self, stub: Any) -> None:
        self._stub = stub
        self._ids = count()
        self._lock = threading.Lock()
        self._waiting: dict[int, Any] = {}

    # -- answers (the stub's reader thread) --------------------------------------------------

    def answer(self, message: dict[str, Any]) -> None:
        op = message["op"]
        with self._lock:
            if op == "bls_stream" and not message["final"]:
                waiter = self._waiting.get(message["call"])
            else:
                waiter = self._waiting.pop(message["call"], None)
        if waiter is None:
            return
        if op == "bls_result":
            value: Any = self._response(message["shm"], message["response"])
        elif op == "bls_stream":
            wire = message["response"]
            value = self._stub.pb.InferenceResponse() if wire is None else None
            if wire is not None:
                value = self._response(message["shm"], wire)
            waiter.put(value, bool(message["final"]))
            return
        elif op == "cancelled":
            value = bool(message["cancelled"])
        else:  # control_result, metric_result
            value = message
        if isinstance(waiter, asyncio.Future):
            waiter.get_loop().call_soon_threadsafe(_set_result, waiter, value)
        else:
            waiter.set(value)

    def _response(self, shm: ipc.Place, wire: dict[str, Any]) -> Any:
        pb = self._stub.pb
        arrays = ipc.read_tensors(shm, wire["descriptors"])
        error = wire["error"]
        return pb.InferenceResponse(
            output_tensors=[pb.Tensor(name, array) for name, _, array in arrays],
            error=None if error is None else pb.TritonError(error[1], ErrorCode.named(error[0])),
            parameters=wire.get("parameters") or None,
        )

    # -- calls (any thread of the model) -----------------------------------------------------

    def _register(self, waiter: Any) -> int:
        call = next(self._ids)
        with self._lock:
            self._waiting[call] = waiter
        return call

    def _forget(self, call: int) -> None:
        with self._lock:
            self._waiting.pop(call, None)

    def bls(self, request: Any, decoupled: bool) -> Any:
        waiter: Any = ResponseIterator() if decoupled else _Waiter()
        call = self._register(waiter)
        self._stub.channel.send(self._bls_message(call, request, decoupled))
        if decoupled:
            waiter.wait_first()  # as Triton's exec(): back once the first response is in
            return waiter
        waiter.event.wait()
        return waiter.value

    async def bls_async(self, request: Any, decoupled: bool) -> Any:
        loop = asyncio.get_running_loop()
        waiter: Any = ResponseIterator() if decoupled else loop.create_future()
        call = self._register(waiter)
        self._stub.channel.send(self._bls_message(call, request, decoupled))
        if decoupled:
            await waiter.first()
            return waiter
        return await waiter

    def _bls_message(self, call: int, request: Any, decoupled: bool) -> dict[str, Any]:
        arrays = [(t.name(), t.as_numpy()) for t in request.inputs()]
        shm, descriptors = ipc.write_tensors(
            self._stub.shm_prefix, arrays, inline=self._stub._inline_limit
        )
        version = request.model_version()
        parameters = request.parameters()
        return {
            "op": "bls",
            "call": call,
            "decoupled": decoupled,
            "shm": shm,
            "descriptors": descriptors,
            "model_name": request.model_name(),
            "model_version": "" if version in (-1, None, "") else str(version),
            "id": request.request_id(),
            "outputs": list(request._requested),
            "parameters": {} if parameters == "{}" else json.loads(parameters),
            "correlation_id": request.correlation_id(),
            "flags": request.flags(),
            "timeout": request.timeout(),
            # The request whose trace the BLS call continues (trace=request.trace()).
            "trace_key": request.trace()._key,
        }

    def is_cancelled(self, key: int) -> bool:
        """Ask the server whether it marked request `key` cancelled."""
        waiter = _Waiter()
        call = self._register(waiter)
        try:
            self._stub.channel.send({"op": "is_cancelled", "call": call, "key": key})
        except OSError:
            answered = False
        else:
            answered = waiter.event.wait(CANCELLED_QUERY_TIMEOUT_S)
        if not answered:
            self._forget(call)
            return False
        return bool(waiter.value)

    def control(self, action: str, model: str, **arguments: Any) -> Any:
        """Load, unload or ask about a model through the server's model manager; raises
        TritonModelException with the server's reason when it refuses."""
        waiter = _Waiter()
        call = self._register(waiter)
        self._stub.channel.send(
            {"op": "control", "call": call, "action": action, "model": model, **arguments}
        )
        waiter.event.wait()
        answer = waiter.value
        if answer["error"] is not None:
            raise self._stub.pb.TritonModelException(answer["error"])
        return answer.get("value")

    def metric(self, action: str, name: str, **arguments: Any) -> Any:
        """A custom-metric operation, answered by the server's registry; raises
        TritonModelException with the registry's reason."""
        waiter = _Waiter()
        call = self._register(waiter)
        self._stub.channel.send(
            {"op": "metric", "call": call, "action": action, "name": name, **arguments}
        )
        waiter.event.wait()
        answer = waiter.value
        if answer["error"] is not None:
            raise self._stub.pb.TritonModelException(answer["error"])
        return answer.get("value")


def _set_result(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)
