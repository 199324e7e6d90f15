"""The stub: one process per python model instance, running the model's `TritonPythonModel`.

    python -m tritonactor.backends.python.stub --fd N --name INSTANCE --shm-prefix P

Fd N is this side of a socketpair with the server (see `ipc`). A reader thread takes every
message: answers to the model's BLS calls and cancellation queries are handed to the waiting
call (which may be on any of the model's threads), everything else goes
to the main thread, which runs the model one message at a time. stdout and stderr belong to the
model (the server logs them); the protocol never uses them.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import inspect
import json
import os
import queue
import socket
import sys
import threading
import traceback
from itertools import count
from pathlib import Path
from typing import Any

from tritonactor.backends.python import ipc

# How long is_cancelled() waits for the server's answer before saying False: the server answers
# from its reader thread at once, so this only bounds a model thread against a wedged server.
CANCELLED_QUERY_TIMEOUT_S = 5.0


class Stub:
    def __init__(self, channel: ipc.Channel, name: str, shm_prefix: str, pb_utils: Any) -> None:
        self.channel = channel
        self.name = name
        self.shm_prefix = shm_prefix
        self.pb = pb_utils
        self.model: Any = None
        self.decoupled = False
        self._inbox: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._calls: dict[int, Any] = {}
        self._call_ids = count()
        self._calls_lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        # Execute messages come one at a time: their tensors travel through reused arenas.
        self._results_arena = ipc.Arena(f"{shm_prefix}-arena")
        self._inputs_arena = ipc.ArenaReader()

    # -- the reader thread -------------------------------------------------------------------

    def read_forever(self) -> None:
        while True:
            message = self.channel.recv()
            if message is None:
                # The server is gone: nobody is left to serve.
                os._exit(0)
            if message["op"] == "bls_result":
                self._resolve_call(message)
            elif message["op"] == "cancelled":
                self._resolve_query(message)
            else:
                self._inbox.put(message)

    def _resolve_call(self, message: dict[str, Any]) -> None:
        with self._calls_lock:
            waiter = self._calls.pop(message["call"], None)
        if waiter is None:
            return
        response = self._response_from_wire(message["shm"], message["response"])
        if isinstance(waiter, asyncio.Future):
            waiter.get_loop().call_soon_threadsafe(_set_result, waiter, response)
        else:
            waiter[1].append(response)
            waiter[0].set()

    def _resolve_query(self, message: dict[str, Any]) -> None:
        with self._calls_lock:
            waiter = self._calls.pop(message["call"], None)
        if waiter is not None:
            waiter[1].append(bool(message["cancelled"]))
            waiter[0].set()

    # -- the main thread ---------------------------------------------------------------------

    def serve(self) -> None:
        while True:
            message = self._inbox.get()
            if message is None:
                return
            op = message["op"]
            if op == "init":
                self._initialize(message)
            elif op == "auto_complete":
                self._auto_complete(message)
            elif op == "execute":
                self._execute(message)
            elif op == "finalize":
                self._finalize()
                return

    def _load_class(self, model_file: str) -> Any:
        path = Path(model_file)
        # Sibling modules of model.py import as they do in Triton.
        sys.path.insert(0, str(path.parent))
        module_name = f"_tritonactor_model_{abs(hash(str(path)))}"
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot import {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
        model_class = getattr(module, "TritonPythonModel", None)
        if model_class is None:
            raise ImportError(f"{path} defines no class TritonPythonModel")
        return model_class

    def _initialize(self, message: dict[str, Any]) -> None:
        try:
            self.decoupled = message["decoupled"]
            self.model = self._load_class(message["model_file"])()
            initialize = getattr(self.model, "initialize", None)
            if initialize is not None:
                self._call(initialize, message["args"])
            is_ready = getattr(self.model, "is_ready", None)
            if is_ready is not None and not self._call(is_ready):
                raise RuntimeError("the model's is_ready() returned False")
        except BaseException as exc:
            traceback.print_exc()
            self.channel.send({"op": "failed", "error": _describe(exc)})
            self._inbox.put(None)
            return
        self.channel.send({"op": "ready"})

    def _auto_complete(self, message: dict[str, Any]) -> None:
        try:
            model_class = self._load_class(message["model_file"])
            complete = getattr(model_class, "auto_complete_config", None)
            if complete is None:
                self.channel.send({"op": "auto_completed", "config": None})
                return
            wrapper = self.pb.ModelConfig(message["config"])
            result = complete(wrapper)
            config = result.as_dict() if result is not None else wrapper.as_dict()
        except BaseException as exc:
            traceback.print_exc()
            self.channel.send({"op": "failed", "error": _describe(exc)})
            return
        self.channel.send({"op": "auto_completed", "config": config})

    def _execute(self, message: dict[str, Any]) -> None:
        seq = message["seq"]
        try:
            requests = self._requests_from_wire(message)
            responses = self._call(self.model.execute, requests)
            reply = self._responses_to_wire(seq, requests, responses)
        except BaseException as exc:
            traceback.print_exc()
            reply = {
                "op": "result",
                "seq": seq,
                "shm": None,
                "responses": None,
                "error": (
                    f"Failed to process the request(s) for model instance '{self.name}', "
                    f"message: {_describe(exc)}"
                ),
            }
        self.channel.send(reply)

    def _finalize(self) -> None:
        finalize = getattr(self.model, "finalize", None)
        if finalize is not None:
            try:
                self._call(finalize)
            except BaseException:
                traceback.print_exc()
        self._results_arena.close()
        self.channel.send({"op": "finalized"})

    def _call(self, function: Any, *args: Any) -> Any:
        result = function(*args)
        if inspect.isawaitable(result):
            result = self._loop.run_until_complete(result)
        return result

    # -- conversions -------------------------------------------------------------------------

    def _requests_from_wire(self, message: dict[str, Any]) -> list[Any]:
        pb = self.pb
        arrays = iter(ipc.read_tensors(message["shm"], message["descriptors"], self._inputs_arena))
        requests = []
        for entry in message["requests"]:
            inputs = [pb.Tensor(name, array) for name, _, array in _take(arrays, entry["inputs"])]
            request = pb.InferenceRequest(
                model_name=entry["model_name"],
                inputs=inputs,
                requested_output_names=entry["outputs"],
                model_version=entry["model_version"],
                request_id=entry["id"],
                correlation_id=entry["correlation_id"],
                parameters=entry["parameters"],
            )
            request._key = entry["key"]
            request._sender = pb.ResponseSender(entry["key"])
            request._trace = pb.InferenceTrace(entry.get("trace"), entry["key"])
            requests.append(request)
        return requests

    def _responses_to_wire(self, seq: int, requests: list[Any], responses: Any) -> dict[str, Any]:
        if self.decoupled:
            if responses is not None:
                raise RuntimeError("a decoupled model's execute() must return None")
            return {"op": "result", "seq": seq, "shm": None, "responses": None, "error": None}
        if responses is None or len(responses) != len(requests):
            got = "None" if responses is None else len(responses)
            raise RuntimeError(
                f"execute() returned {got} responses for {len(requests)} requests; the number "
                "of InferenceResponse objects must match the number of InferenceRequest objects"
            )
        tensors: list[tuple[str, Any]] = []
        wire: list[dict[str, Any] | None] = []
        for response in responses:
            if response is None:
                wire.append(None)
                continue
            entry, arrays = self._response_entry(response)
            tensors.extend(arrays)
            wire.append(entry)
        shm, descriptors = ipc.write_tensors(self.shm_prefix, tensors, self._results_arena)
        return {
            "op": "result",
            "seq": seq,
            "shm": shm,
            "descriptors": descriptors,
            "responses": wire,
            "error": None,
        }

    def _response_entry(self, response: Any) -> tuple[dict[str, Any], list[tuple[str, Any]]]:
        if not isinstance(response, self.pb.InferenceResponse):
            raise TypeError(
                f"execute() must return pb_utils.InferenceResponse objects, not "
                f"{type(response).__name__}"
            )
        error = response.error()
        arrays = [(t.name(), t.as_numpy()) for t in response.output_tensors()]
        entry = {
            "outputs": len(arrays),
            "error": None
            if error is None
            else (self.pb._error_code_name(error.code()), error.message()),
            "parameters": json.loads(response.parameters()),
        }
        return entry, arrays

    def _response_from_wire(self, shm: str | None, wire: dict[str, Any]) -> Any:
        pb = self.pb
        arrays = ipc.read_tensors(shm, wire["descriptors"])
        error = wire["error"]
        return pb.InferenceResponse(
            output_tensors=[pb.Tensor(name, array) for name, _, array in arrays],
            error=None
            if error is None
            else pb.TritonError(error[1], pb._error_code_number(error[0])),
            parameters=wire.get("parameters") or None,
        )

    # -- what pb_utils calls -----------------------------------------------------------------

    def send_response(self, key: int, response: Any, flags: int) -> None:
        shm, descriptors, entry = None, [], None
        if response is not None:
            entry, arrays = self._response_entry(response)
            shm, descriptors = ipc.write_tensors(self.shm_prefix, arrays)
        self.channel.send(
            {
                "op": "send",
                "key": key,
                "shm": shm,
                "descriptors": descriptors,
                "response": entry,
                "flags": flags,
            }
        )

    def _bls_message(self, request: Any, decoupled: bool) -> tuple[int, dict[str, Any]]:
        if decoupled:
            raise self.pb.TritonModelException(
                "BLS calls with decoupled=True are not supported by tritonactor yet"
            )
        call = next(self._call_ids)
        arrays = [(t.name(), t.as_numpy()) for t in request.inputs()]
        shm, descriptors = ipc.write_tensors(self.shm_prefix, arrays)
        version = request.model_version()
        return call, {
            "op": "bls",
            "call": call,
            "shm": shm,
            "descriptors": descriptors,
            "model_name": request.model_name(),
            "model_version": "" if version in (-1, None, "") else str(version),
            "id": request.request_id(),
            "outputs": request.requested_output_names(),
            "parameters": json.loads(request.parameters()),
            # The request whose trace the BLS call continues (trace=request.trace()).
            "trace_key": request.trace()._key,
        }

    def bls(self, request: Any, decoupled: bool) -> Any:
        call, message = self._bls_message(request, decoupled)
        waiter: tuple[threading.Event, list[Any]] = (threading.Event(), [])
        with self._calls_lock:
            self._calls[call] = waiter
        self.channel.send(message)
        waiter[0].wait()
        return waiter[1][0]

    async def bls_async(self, request: Any, decoupled: bool) -> Any:
        call, message = self._bls_message(request, decoupled)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        with self._calls_lock:
            self._calls[call] = future
        self.channel.send(message)
        return await future

    def is_cancelled(self, key: int) -> bool:
        """Ask the server whether it marked request `key` cancelled; any thread may ask."""
        call = next(self._call_ids)
        waiter: tuple[threading.Event, list[bool]] = (threading.Event(), [])
        with self._calls_lock:
            self._calls[call] = waiter
        try:
            self.channel.send({"op": "is_cancelled", "call": call, "key": key})
        except OSError:
            answered = False
        else:
            answered = waiter[0].wait(CANCELLED_QUERY_TIMEOUT_S)
        if not answered:
            with self._calls_lock:
                self._calls.pop(call, None)
            return False
        return waiter[1][0]

    def log(self, level: int, message: str) -> None:
        self.channel.send({"op": "log", "level": level, "message": message})


def _set_result(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _take(arrays: Any, n: int) -> list[Any]:
    return [next(arrays) for _ in range(n)]


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="tritonactor.backends.python.stub")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--shm-prefix", required=True)
    options = parser.parse_args(argv)
    sock = socket.socket(fileno=options.fd)
    channel = ipc.Channel(sock)
    # Model code imports the helpers by their Triton name. An alias rather than this folder on
    # sys.path, so that our other modules here cannot shadow a model's own `ipc` or `stub`.
    from tritonactor.backends.python import triton_python_backend_utils as pb_utils

    sys.modules["triton_python_backend_utils"] = pb_utils

    stub = Stub(channel, options.name, options.shm_prefix, pb_utils)
    pb_utils._stub = stub
    threading.Thread(target=stub.read_forever, name="stub-reader", daemon=True).start()
    stub.serve()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
