"""A stub process as the server sees it: started with one end of a socketpair, its output logged
line by line, stopped (finalize, then kill) at the end; and the python backend's settings that
shape it (`--backend-config=python,<setting>=<value>`)."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import socket
import subprocess
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tritonactor
from tritonactor.backends.python import ipc
from tritonactor.core.errors import internal, invalid_arg, unavailable

log = logging.getLogger(__name__)
model_log = logging.getLogger("tritonactor.models")

_PACKAGE_ROOT = str(Path(tritonactor.__file__).resolve().parent.parent)
_LOG_LEVELS = {0: logging.INFO, 1: logging.WARNING, 2: logging.ERROR, 3: logging.DEBUG}

# Settings of Triton's python backend that tritonactor's design makes moot: accepted, logged.
_IGNORED_SETTINGS = {
    "shm-region-prefix-name": "shared-memory files are named by tritonactor",
    "shm-message-queue-size": "control messages travel on a socket, not a message queue",
    "default-max-batch-size": "max_batch_size comes from the config or auto_complete_config",
}


@dataclass(frozen=True, slots=True)
class StubSettings:
    """How the server runs stub processes. `start_timeout_s` (Triton's stub-timeout-seconds):
    how long a stub may take to start, and to finalize, before it is declared dead and killed.
    The shared-memory sizes (shm-default-byte-size, shm-growth-byte-size) are the first size and
    the growth step of each instance's reused arenas (0: tritonactor's defaults).
    `inline_limit`: how many bytes of a message's tensors (an execute's, its results, a
    response sender's, a BLS call's) travel inside it rather than through shared memory (not
    a backend setting: tests set 0 to take the shared-memory path with small tensors)."""

    start_timeout_s: float = 30.0
    shm_default_size: int = 0
    shm_growth_size: int = 0
    inline_limit: int = ipc.INLINE_LIMIT

    @classmethod
    def from_backend_config(cls, config: Mapping[str, str]) -> StubSettings:
        """Read `--backend-config=python,...`; a setting that means nothing here is logged, a
        malformed number is INVALID_ARG."""
        values: dict[str, Any] = {}
        for key, value in config.items():
            if key == "stub-timeout-seconds":
                values["start_timeout_s"] = float(_positive_int(key, value))
            elif key == "shm-default-byte-size":
                values["shm_default_size"] = _positive_int(key, value)
            elif key == "shm-growth-byte-size":
                values["shm_growth_size"] = _positive_int(key, value)
            elif key in _IGNORED_SETTINGS:
                log.info("python backend setting %s=%s: %s", key, value, _IGNORED_SETTINGS[key])
            else:
                log.info("python backend setting %s=%s has no effect in tritonactor", key, value)
        settings = cls(**values)
        if values:
            log.info(
                "python backend: shm-default-byte-size=%d, shm-growth-byte-size=%d, "
                "stub-timeout-seconds=%g (0: tritonactor's default)",
                settings.shm_default_size,
                settings.shm_growth_size,
                settings.start_timeout_s,
            )
        return settings


def _positive_int(key: str, value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number <= 0:
        raise invalid_arg(f"python backend setting {key} must be a positive integer, not '{value}'")
    return number


def exit_description(returncode: int | None) -> str:
    if returncode is None:
        return "an unknown status"
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"code {returncode}"


class StubProcess:
    """A started stub: its process, its channel and the thread that logs its output. Returns
    once the stub said it started (or raises UNAVAILABLE, having killed it)."""

    def __init__(self, interpreter: str, name: str, settings: StubSettings) -> None:
        self.name = name
        self.settings = settings
        self.shm_prefix = f"tritonactor-py-{os.getpid()}-{secrets.token_hex(4)}"
        # What the server's own files are named by (an attribute: read at every execute).
        self.parent_prefix = f"{self.shm_prefix}{ipc.SERVER_SIDE}"
        # The sequence number (+1) of the last execute the stub took off the socket: read once
        # it died, it tells a batch the model may have begun from one it never saw.
        self.taken = ipc.Counter()
        parent_end, child_end = socket.socketpair()
        # Only the server's answers to the model's own calls (see `stub`).
        answers_end, answers_child = socket.socketpair()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH", "")) if p
        )
        env["PYTHONUNBUFFERED"] = "1"
        command = [
            interpreter,
            "-m",
            "tritonactor.backends.python.stub",
            "--fd",
            str(child_end.fileno()),
            "--answers-fd",
            str(answers_child.fileno()),
            "--name",
            name,
            "--shm-prefix",
            f"{self.shm_prefix}{ipc.STUB_SIDE}",
            "--taken-fd",
            str(self.taken.fd),
        ]
        if settings.shm_default_size:
            command += ["--shm-default-size", str(settings.shm_default_size)]
        if settings.shm_growth_size:
            command += ["--shm-growth-size", str(settings.shm_growth_size)]
        if settings.inline_limit != ipc.INLINE_LIMIT:
            command += ["--inline-limit", str(settings.inline_limit)]
        try:
            self.process = subprocess.Popen(
                command,
                pass_fds=(child_end.fileno(), answers_child.fileno(), self.taken.fd),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=env,
            )
        except OSError as exc:
            parent_end.close()
            answers_end.close()
            self.taken.close()
            ipc.remove_files(self.shm_prefix)
            raise unavailable(
                f"cannot start the python model process for '{name}': {exc}"
            ) from None
        finally:
            child_end.close()
            answers_child.close()
            self.taken.handed_over()
        self.channel = ipc.Channel(parent_end)
        # Answers to the model's BLS, cancellation, model-control and metric calls.
        self.answers = ipc.Channel(answers_end)
        self.output_thread = threading.Thread(
            target=self._log_output, name=f"{name}-output", daemon=True
        )
        self.output_thread.start()
        try:
            self.wait_for("started", settings.start_timeout_s)
        except BaseException:
            self.stop(0)
            raise

    def arena(self) -> ipc.Arena:
        """A reused arena for what the server sends this stub, sized by the settings."""
        return ipc.Arena(
            f"{self.parent_prefix}-arena",
            self.settings.shm_default_size,
            self.settings.shm_growth_size,
        )

    def _log_output(self) -> None:
        assert self.process.stdout is not None
        with self.process.stdout:  # closed at its end: a dead stub's pipe is no longer held
            for line in iter(self.process.stdout.readline, b""):
                model_log.info("[%s] %s", self.name, line.decode("utf-8", "replace").rstrip())

    def log(self, message: dict[str, Any]) -> None:
        """A model's `pb_utils.Logger` line, located where the model called the logger."""
        level = _LOG_LEVELS.get(message["level"], logging.INFO)
        if not model_log.isEnabledFor(level):
            return
        record = model_log.makeRecord(
            model_log.name,
            level,
            message.get("file") or __file__,
            message.get("line", 0),
            "[%s] %s",
            (self.name, message["message"]),
            None,
        )
        model_log.handle(record)

    def wait_for(
        self,
        op: str,
        timeout_s: float | None = None,
        other: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Block until the stub answers `op` (logging what it says meanwhile, and handing
        anything else to `other`: a model may define metrics in `initialize`). With a
        timeout, a stub that has not answered by then is killed and the wait fails
        UNAVAILABLE."""
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            with contextlib.suppress(OSError):
                self.process.kill()

        timer = None
        if timeout_s is not None:
            timer = threading.Timer(timeout_s, expire)
            timer.daemon = True
            timer.start()
        try:
            while True:
                message = self.channel.recv()
                if message is None:
                    returncode = self.wait(5)
                    if expired.is_set():
                        raise unavailable(
                            f"python model process for instance '{self.name}' did not answer "
                            f"within {timeout_s:g} s (stub-timeout-seconds); it was killed"
                        )
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
                elif other is not None:
                    other(message)
        finally:
            if timer is not None:
                timer.cancel()

    def wait(self, timeout: float) -> int | None:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()

    def stop(self, timeout: float) -> None:
        """Ask the stub to finalize and exit (killing it after `timeout`), then close."""
        self.finish(timeout)
        self.close()

    def finish(self, timeout: float) -> None:
        """Ask the stub to finalize and exit; kill it if it takes longer than `timeout`. What it
        sent before exiting can still be read from the channel."""
        if self.process.poll() is None:
            with contextlib.suppress(OSError):
                self.channel.send({"op": "finalize"})
            self.wait(timeout)

    def close(self) -> None:
        """Close the channel and remove what the stub left in shared memory: once everything
        it sent has been read."""
        self.channel.close()
        self.answers.close()
        self.taken.close()
        ipc.remove_files(self.shm_prefix)
