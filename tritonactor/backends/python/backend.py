"""The server side of the python backend: one stub process per model instance.

`PythonInstance.execute` writes the batch's input tensors into shared memory, sends descriptors
on the instance's socket and awaits the answer on the event loop. A reader thread per instance
takes everything the stub sends — results, responses of decoupled requests (which may come after
execute returned), BLS calls, cancellation queries, log lines — and notices at once when the
process dies.

Cancellation is asked for, not pushed: the model's `is_cancelled()` sends the request's key and
the reader thread answers from `InferenceRequest.cancelled` (the server sets it from any thread,
with no event to hook), so nothing costs anything until a model asks.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import sniffio

import tritonactor
from tritonactor._proto.inference import ModelConfig
from tritonactor.backends.base import (
    Backend,
    BackendInstance,
    BackendModel,
    InstanceContext,
    InstanceDied,
    ModelContext,
    Result,
)
from tritonactor.backends.python import ipc
from tritonactor.config.model_config import ConfigError, config_from_json, config_to_json
from tritonactor.core.errors import (
    ErrorCode,
    TritonError,
    internal,
    invalid_arg,
    unavailable,
)
from tritonactor.core.types import (
    InferenceRequest,
    InferenceResponse,
    RequestedOutput,
    ResponseSender,
    Tensor,
)

__all__ = ["PythonBackend", "PythonInstance", "PythonModel"]

log = logging.getLogger(__name__)
model_log = logging.getLogger("tritonactor.models")

MODEL_FILENAME = "model.py"
EXECUTION_ENV_PATH = "EXECUTION_ENV_PATH"
# How long finalize waits for the model's own finalize() before killing the process.
FINALIZE_TIMEOUT_S = 30.0
# BLS calls one instance may have waiting on the server at once.
BLS_THREADS = 8

_PACKAGE_ROOT = str(Path(tritonactor.__file__).resolve().parent.parent)
_LOG_LEVELS = {0: logging.INFO, 1: logging.WARNING, 2: logging.ERROR, 3: logging.DEBUG}
_FINAL = 1  # TRITONSERVER_RESPONSE_COMPLETE_FINAL


# ---------------------------------------------------------------------------------------------
# The stub process


def interpreter_for(config: ModelConfig, model_dir: Path) -> str:
    """The Python that runs the model: the config's EXECUTION_ENV_PATH parameter (a Python
    executable, or a virtual environment's folder), else the server's own."""
    parameter = config.parameters.get(EXECUTION_ENV_PATH)
    value = parameter.string_value.strip() if parameter is not None else ""
    if not value:
        return sys.executable
    path = Path(value.replace("$$TRITON_MODEL_DIRECTORY", str(model_dir)))
    if path.is_dir():
        for candidate in (path / "bin" / "python3", path / "bin" / "python"):
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
        raise invalid_arg(
            f"model '{config.name}': {EXECUTION_ENV_PATH} {path} is a folder without "
            "bin/python3 or bin/python"
        )
    if path.is_file() and os.access(path, os.X_OK):
        return str(path)
    if path.name.endswith((".tar.gz", ".tgz")):
        raise invalid_arg(
            f"model '{config.name}': {EXECUTION_ENV_PATH} {path} is a packed environment; "
            "tritonactor needs an unpacked one (a venv folder or a python executable)"
        )
    raise invalid_arg(
        f"model '{config.name}': {EXECUTION_ENV_PATH} {path} is neither a python executable "
        "nor a virtual environment"
    )


def exit_description(returncode: int | None) -> str:
    if returncode is None:
        return "an unknown status"
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"code {returncode}"


class _StubProcess:
    """A started stub: its process, its channel and the thread that logs its output."""

    def __init__(self, interpreter: str, name: str) -> None:
        self.name = name
        self.shm_prefix = f"tritonactor-py-{os.getpid()}-{secrets.token_hex(4)}"
        parent_end, child_end = socket.socketpair()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH", "")) if p
        )
        env["PYTHONUNBUFFERED"] = "1"
        try:
            self.process = subprocess.Popen(
                [
                    interpreter,
                    "-m",
                    "tritonactor.backends.python.stub",
                    "--fd",
                    str(child_end.fileno()),
                    "--name",
                    name,
                    "--shm-prefix",
                    f"{self.shm_prefix}-s",
                ],
                pass_fds=(child_end.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=env,
            )
        except OSError as exc:
            parent_end.close()
            raise unavailable(
                f"cannot start the python model process for '{name}': {exc}"
            ) from None
        finally:
            child_end.close()
        self.channel = ipc.Channel(parent_end)
        threading.Thread(target=self._log_output, name=f"{name}-output", daemon=True).start()

    @property
    def parent_prefix(self) -> str:
        return f"{self.shm_prefix}-p"

    def _log_output(self) -> None:
        assert self.process.stdout is not None
        for line in iter(self.process.stdout.readline, b""):
            model_log.info("[%s] %s", self.name, line.decode("utf-8", "replace").rstrip())

    def log(self, message: dict[str, Any]) -> None:
        level = _LOG_LEVELS.get(message["level"], logging.INFO)
        model_log.log(level, "[%s] %s", self.name, message["message"])

    def wait_for(self, op: str) -> dict[str, Any]:
        """Block until the stub answers `op` (logging what it says meanwhile)."""
        while True:
            message = self.channel.recv()
            if message is None:
                returncode = self.wait(5)
                raise unavailable(
                    f"python model process for instance '{self.name}' exited with "
                    f"{exit_description(returncode)} before answering"
                )
            if message["op"] == "log":
                self.log(message)
            elif message["op"] == "failed":
                raise internal(message["error"])
            elif message["op"] == op:
                return message

    def wait(self, timeout: float) -> int | None:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()

    def stop(self, timeout: float) -> None:
        """Ask the stub to finalize and exit; kill it if it takes longer than `timeout`."""
        if self.process.poll() is None:
            with contextlib.suppress(OSError):
                self.channel.send({"op": "finalize"})
            self.wait(timeout)
        self.channel.close()
        ipc.remove_files(self.shm_prefix)


# ---------------------------------------------------------------------------------------------
# The backend


class PythonBackend(Backend):
    """Triton's python backend: `model.py` defining `TritonPythonModel`."""

    name = "python"
    default_model_filename = MODEL_FILENAME

    def auto_complete_config(self, config: ModelConfig, version_dir: Path) -> ModelConfig:
        path = version_dir / (config.default_model_filename or MODEL_FILENAME)
        try:
            source = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return config
        if "auto_complete_config" not in source:
            return config  # spare a process start for the common case
        stub = _StubProcess(
            interpreter_for(config, version_dir.parent), f"{config.name}_auto_complete"
        )
        try:
            stub.channel.send(
                {"op": "auto_complete", "config": config_to_json(config), "model_file": str(path)}
            )
            reply = stub.wait_for("auto_completed")
        except TritonError as exc:
            raise invalid_arg(
                f"model '{config.name}': auto_complete_config failed: {exc.message}"
            ) from None
        finally:
            stub.stop(FINALIZE_TIMEOUT_S)
        if reply["config"] is None:
            return config
        try:
            return config_from_json(reply["config"])
        except ConfigError as exc:
            raise invalid_arg(
                f"model '{config.name}': auto_complete_config gave an invalid config: {exc}"
            ) from None

    def load_model(self, context: ModelContext) -> PythonModel:
        if not context.model_path.is_file():
            raise invalid_arg(
                f"model '{context.name}' version {context.version}: no python model file at "
                f"{context.model_path}"
            )
        return PythonModel(context, interpreter_for(context.config, context.model_dir))


class PythonModel(BackendModel):
    def __init__(self, context: ModelContext, interpreter: str) -> None:
        self.context = context
        self.interpreter = interpreter
        self.config_json = json.dumps(config_to_json(context.config))
        policy = context.config.model_transaction_policy
        self.decoupled = bool(policy is not None and policy.decoupled)

    def create_instance(self, context: InstanceContext) -> PythonInstance:
        """Start a stub and initialize the model in it; may be called again for a new instance
        after one died."""
        return PythonInstance(self, context)

    def initialize_args(self, context: InstanceContext) -> dict[str, str]:
        """Triton's `args` for `TritonPythonModel.initialize`: every value a string."""
        return {
            "model_config": self.config_json,
            "model_instance_kind": context.kind.removeprefix("KIND_"),
            "model_instance_name": context.name,
            "model_instance_device_id": str(context.device_id),
            "model_repository": str(self.context.model_dir),
            "model_version": str(self.context.version),
            "model_name": self.context.name,
        }


# ---------------------------------------------------------------------------------------------
# An instance


@dataclass(eq=False)
class _Pending:
    """One execute waiting on the loop for its stub's answer."""

    event: anyio.Event
    token: Any
    requests: dict[int, InferenceRequest]
    message: dict[str, Any] | None = None
    died: bool = False


@dataclass(eq=False)
class _Decoupled:
    request: InferenceRequest
    sender: ResponseSender


class PythonInstance(BackendInstance):
    def __init__(self, model: PythonModel, context: InstanceContext) -> None:
        self.model = model
        self.context = context
        self.name = context.name
        self._model_name = model.context.name
        self._model_version = str(model.context.version)
        self._seq = itertools.count()
        self._keys = itertools.count()
        self._lock = threading.Lock()
        self._pending: dict[int, _Pending] = {}
        self._decoupled: dict[int, _Decoupled] = {}
        self._death: str | None = None
        self._finalizing = False
        self._closed = False
        self._token: Any = None
        self._bls_pool: ThreadPoolExecutor | None = None
        self._stub = _StubProcess(model.interpreter, context.name)
        # One execute at a time: its tensors travel through reused arenas (see ipc.Arena).
        self._inputs_arena = ipc.Arena(f"{self._stub.parent_prefix}-arena")
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
            self._stub.wait_for("ready")
        except BaseException as exc:
            self._stub.stop(5)
            if isinstance(exc, TritonError):
                raise internal(
                    f"model '{self._model_name}' instance '{self.name}' failed to initialize: "
                    f"{exc.message}"
                ) from None
            raise
        self._reader = threading.Thread(
            target=self._read_forever, name=f"{self.name}-reader", daemon=True
        )
        self._reader.start()

    @property
    def pid(self) -> int:
        return self._stub.process.pid

    # -- execute (on the event loop) ---------------------------------------------------------

    async def execute(self, requests: list[InferenceRequest]) -> list[Result]:
        self._token = anyio.lowlevel.current_token()
        token = _loop_token()
        seq = next(self._seq)
        keys = [next(self._keys) for _ in requests]
        entries: list[dict[str, Any]] = []
        arrays: list[tuple[str, Any]] = []
        for key, request in zip(keys, requests, strict=True):
            if request.sender is not None:
                self._decoupled[key] = _Decoupled(request, request.sender)
            entries.append(
                {
                    "key": key,
                    "model_name": request.model_name,
                    "model_version": request.resolved_version or -1,
                    "id": request.id,
                    "correlation_id": request.parameters.get("sequence_id", 0),
                    "parameters": dict(request.parameters),
                    "inputs": len(request.inputs),
                    "outputs": request.requested_output_names,
                    # What the model's request.trace().get_context() answers.
                    "trace": None if request.trace is None else request.trace.carrier(),
                }
            )
            arrays.extend((tensor.name, tensor.data) for tensor in request.inputs)
        pending = _Pending(anyio.Event(), token, dict(zip(keys, requests, strict=True)))
        with self._lock:
            if self._death is not None:
                raise InstanceDied(self._death)
            self._pending[seq] = pending
        completed = False
        try:
            shm, descriptors = ipc.write_tensors(
                self._stub.parent_prefix, arrays, self._inputs_arena
            )
            with contextlib.suppress(OSError):  # a dead stub: the reader reports why
                self._stub.channel.send(
                    {
                        "op": "execute",
                        "seq": seq,
                        "shm": shm,
                        "descriptors": descriptors,
                        "requests": entries,
                    }
                )
            await pending.event.wait()
            completed = True
        finally:
            with self._lock:
                self._pending.pop(seq, None)
            if not completed:
                # The stub may still read the abandoned batch: the next one gets a fresh arena.
                self._inputs_arena.close()
        if pending.died:
            raise InstanceDied(self._death)
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
            results: list[Result] = []
            for key in keys:
                entry = self._decoupled.pop(key, None)
                if entry is None:
                    results.append(error)
                else:
                    if not entry.sender.finished:
                        entry.sender.send(None, error=error, final=True)
                    results.append(None)
            return results
        wires = message["responses"]
        if wires is None:  # decoupled: the answers travel through the senders
            return [None] * len(requests)
        results = []
        for request, wire in zip(requests, wires, strict=True):
            if wire is None:
                results.append(internal(f"model '{self._model_name}' returned None for a request"))
            else:
                results.append(self._response(request, wire, arrays))
        return results

    def _response(
        self, request: InferenceRequest, wire: dict[str, Any], arrays: Any
    ) -> InferenceResponse | TritonError:
        tensors = [next(arrays) for _ in range(wire["outputs"])]
        if wire["error"] is not None:
            code, text = wire["error"]
            return TritonError(ErrorCode[code], text)
        wanted = set(request.requested_output_names)
        outputs = [
            Tensor(name=name, datatype=datatype, shape=tuple(array.shape), data=array)
            for name, datatype, array in tensors
            if not wanted or name in wanted
        ]
        parameters = {
            k: v
            for k, v in (wire.get("parameters") or {}).items()
            if isinstance(v, bool | int | float | str)
        }
        return InferenceResponse(
            model_name=self._model_name,
            model_version=self._model_version,
            id=request.id,
            outputs=outputs,
            parameters=parameters,
        )

    # -- the reader thread -------------------------------------------------------------------

    def _read_forever(self) -> None:
        channel = self._stub.channel
        while True:
            message = channel.recv()
            if message is None:
                break
            try:
                self._dispatch(message)
            except Exception:
                log.exception("instance '%s': cannot handle a message from its model", self.name)
        self._exited()

    def _dispatch(self, message: dict[str, Any]) -> None:
        op = message["op"]
        if op == "result":
            with self._lock:
                pending = self._pending.get(message["seq"])
            if pending is None:  # its execute was cancelled: drop the answer
                shm = message.get("shm")
                if shm is not None and not shm.startswith("@"):
                    ipc.read_tensors(shm, message.get("descriptors", []))
                return
            pending.message = message
            _wake(pending)
        elif op == "send":
            self._deliver(message)
        elif op == "bls":
            if self._bls_pool is None:
                self._bls_pool = ThreadPoolExecutor(BLS_THREADS, f"{self.name}-bls")
            self._bls_pool.submit(self._serve_bls, message)
        elif op == "is_cancelled":
            with contextlib.suppress(OSError):  # the stub is gone; the reader reports it
                self._stub.channel.send(
                    {
                        "op": "cancelled",
                        "call": message["call"],
                        "cancelled": self._is_cancelled(message["key"]),
                    }
                )
        elif op == "log":
            self._stub.log(message)
        elif op == "finalized":
            pass
        else:
            log.warning("instance '%s': unexpected message %r", self.name, op)

    def _deliver(self, message: dict[str, Any]) -> None:
        arrays = iter(ipc.read_tensors(message["shm"], message["descriptors"]))
        final = bool(message["flags"] & _FINAL)
        entry = self._decoupled.get(message["key"])
        if entry is None:
            log.warning(
                "model '%s' sent a response through a response sender of a request the server "
                "did not give one (is the model decoupled?); it is dropped",
                self._model_name,
            )
            return
        if final:
            self._decoupled.pop(message["key"], None)
        response: InferenceResponse | None = None
        error: TritonError | None = None
        if message["response"] is not None:
            result = self._response(entry.request, message["response"], arrays)
            if isinstance(result, TritonError):
                error = result
            else:
                response = result
        try:
            entry.sender.send(response, error=error, final=final)
        except RuntimeError as exc:
            log.warning("model '%s': %s", self._model_name, exc)

    def _is_cancelled(self, key: int) -> bool:
        """Whether the server marked the request behind `key` cancelled. A request the instance
        no longer holds (answered, or its execute abandoned) reads as not cancelled."""
        entry = self._decoupled.get(key)
        if entry is not None:
            return entry.request.cancelled or entry.sender.is_cancelled()
        with self._lock:
            for pending in self._pending.values():
                request = pending.requests.get(key)
                if request is not None:
                    return request.cancelled
        return False

    def _held_request(self, key: int | None) -> InferenceRequest | None:
        """The request behind `key` while the instance holds it (executing, or answering
        through its sender)."""
        if key is None:
            return None
        entry = self._decoupled.get(key)
        if entry is not None:
            return entry.request
        with self._lock:
            for pending in self._pending.values():
                request = pending.requests.get(key)
                if request is not None:
                    return request
        return None

    def _serve_bls(self, message: dict[str, Any]) -> None:
        shm: str | None = None
        try:
            inputs = [
                Tensor(name=name, datatype=datatype, shape=tuple(array.shape), data=array)
                for name, datatype, array in ipc.read_tensors(
                    message["shm"], message["descriptors"]
                )
            ]
            infer, token = self.context.infer, self._token
            if infer is None or token is None:
                raise unavailable("BLS is not available to this model instance")
            request = InferenceRequest(
                model_name=message["model_name"],
                model_version=message["model_version"],
                id=message["id"],
                inputs=inputs,
                outputs=[RequestedOutput(name) for name in message["outputs"]],
                parameters=message["parameters"],
            )
            # A BLS request made with trace=request.trace() nests in that request's trace.
            parent = self._held_request(message.get("trace_key"))
            if parent is not None and parent.trace is not None:
                request.trace = parent.trace.child()
            response = anyio.from_thread.run(infer, request, token=token)
            shm, descriptors = ipc.write_tensors(
                self._stub.parent_prefix, [(t.name, t.data) for t in response.outputs]
            )
            wire: dict[str, Any] = {
                "descriptors": descriptors,
                "error": None,
                "parameters": dict(response.parameters),
            }
        except TritonError as exc:
            wire = {"descriptors": [], "error": (exc.code.name, exc.message)}
        except Exception as exc:
            wire = {"descriptors": [], "error": ("INTERNAL", f"{type(exc).__name__}: {exc}")}
        with contextlib.suppress(OSError):  # the stub is gone; the reader reports it
            self._stub.channel.send(
                {"op": "bls_result", "call": message["call"], "shm": shm, "response": wire}
            )

    def _exited(self) -> None:
        if self._finalizing:
            return
        returncode = self._stub.wait(5)
        reason = (
            f"python model process for instance '{self.name}' exited with "
            f"{exit_description(returncode)}"
        )
        log.error("model '%s': %s", self._model_name, reason)
        with self._lock:
            self._death = reason
            pendings = list(self._pending.values())
        in_flight = {key for pending in pendings for key in pending.requests}
        for pending in pendings:
            pending.died = True
            _wake(pending)
        # Requests of earlier batches still answering through their senders: they end here.
        for key, entry in list(self._decoupled.items()):
            if key in in_flight:
                continue
            self._decoupled.pop(key, None)
            with contextlib.suppress(RuntimeError):
                entry.sender.send(None, error=unavailable(reason), final=True)
        ipc.remove_files(self._stub.shm_prefix)

    # -- finalize ----------------------------------------------------------------------------

    def finalize(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._finalizing = True
        self._stub.stop(FINALIZE_TIMEOUT_S)
        self._inputs_arena.close()
        if self._bls_pool is not None:
            self._bls_pool.shutdown(wait=False, cancel_futures=True)


def _loop_token() -> Any:
    """What `_wake` needs to reach this event loop from another thread."""
    if sniffio.current_async_library() == "asyncio":
        return asyncio.get_running_loop()
    return anyio.lowlevel.current_token()


def _wake(pending: _Pending) -> None:
    try:
        if isinstance(pending.token, asyncio.AbstractEventLoop):
            # Schedules the wake-up without waiting for it (the generic path below blocks this
            # thread until the loop has run it: ~100 us more per request).
            pending.token.call_soon_threadsafe(pending.event.set)
        else:
            anyio.from_thread.run_sync(pending.event.set, token=pending.token)
    except RuntimeError:  # the loop is gone: nobody waits any more
        pass
