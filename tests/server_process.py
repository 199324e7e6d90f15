"""Start the real server (`hypercorn tritonactor.app:app`) in a subprocess on free ports."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

# The ports this process has handed out: the kernel may give a port just released again, so
# two calls for one server's endpoints could return the same one (seen once: the server then
# refuses to start, "each endpoint needs its own port").
_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A port free on 127.0.0.1 now, never one this process has handed out before."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def loopback_env(root: Path, http_port: int, grpc_port: int, metrics_port: int) -> dict[str, str]:
    """This process's environment without its TRITONACTOR_* and TA_* variables, plus what puts
    a server's three listeners on 127.0.0.1 at these ports and its journal in `root`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRITONACTOR_", "TA_"))}
    env.update(
        {
            "TRITONACTOR_JOURNAL": str(root / "journal.jsonl"),
            "TRITONACTOR_HTTP_HOST": "127.0.0.1",
            "TRITONACTOR_HTTP_PORT": str(http_port),
            "TRITONACTOR_GRPC_HOST": "127.0.0.1",
            "TRITONACTOR_GRPC_PORT": str(grpc_port),
            "TRITONACTOR_METRICS_HOST": "127.0.0.1",
            "TRITONACTOR_METRICS_PORT": str(metrics_port),
        }
    )
    return env


@dataclass
class ServerProcess:
    """A running server; `url` is host:port as tritonclient wants it."""

    process: subprocess.Popen[bytes]
    http_port: int
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def base(self) -> str:
        return f"http://{self.url}"

    @property
    def grpc_port(self) -> int:
        return int(self.env["TRITONACTOR_GRPC_PORT"])

    @property
    def grpc_url(self) -> str:
        """host:port of the gRPC listener, as tritonclient.grpc wants it."""
        return f"127.0.0.1:{self.grpc_port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def pending(self, model: str) -> int:
        """Its requests for `model` routed and not answered yet (its metrics)."""
        return pending_requests(int(self.env["TRITONACTOR_METRICS_PORT"]), model)

    def stop(self, timeout: float = 15) -> int:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def pending_requests(metrics_port: int, model: str) -> int:
    """`nv_inference_pending_request_count` of `model` on the server whose metrics listen on
    `metrics_port` (0 before the model has a count; AssertionError where the server has no
    such metric at all, so that a wait for 0 cannot pass on a metric gone)."""
    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
    assert "# TYPE nv_inference_pending_request_count gauge" in text, text
    for line in text.splitlines():
        if line.startswith("nv_inference_pending_request_count{") and f'model="{model}"' in line:
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


def wait_for(
    condition: Callable[[], bool],
    timeout: float = 20.0,
    describe: Callable[[], str] | None = None,
) -> None:
    """Returns once `condition()` holds (asked every 0.1 s); AssertionError after `timeout`
    seconds, the bound on a wait for an event, not a measure of speed, saying `describe()`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(describe() if describe is not None else "condition not met in time")


def start_server(
    repositories: Sequence[Path | str] | None,
    log_dir: Path,
    extra_env: Mapping[str, str] | None = None,
    wait_ready: bool = True,
    timeout: float = 60,
    probe_headers: Mapping[str, str] | None = None,
    http_port: int | None = None,
    args: Sequence[str] = (),
    wait_live: bool = True,
) -> ServerProcess:
    """`hypercorn tritonactor.app:app` with TRITONACTOR_* settings, on `http_port` (default: a
    free one), hypercorn's own flags `args` last; waits until it is live (`wait_live` False:
    returns at once, for a server that will not be)."""
    http_port = http_port or free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRITONACTOR_")}
    env.update(
        {
            "TRITONACTOR_GRPC_PORT": str(free_port()),
            "TRITONACTOR_METRICS_PORT": str(free_port()),
            # Its own journal, so explicit mode never replays another server's loads; a test of
            # restarts passes the same TRITONACTOR_JOURNAL to both servers.
            "TRITONACTOR_JOURNAL": str(log_dir / f"journal-{http_port}.jsonl"),
        }
    )
    if repositories:
        env["TRITONACTOR_MODEL_REPOSITORY"] = ",".join(str(r) for r in repositories)
    env.update(extra_env or {})
    log_path = log_dir / f"server-{http_port}.log"
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "hypercorn",
                "tritonactor.app:app",
                "--bind",
                f"127.0.0.1:{http_port}",
                # One worker: on two cores or more, one front-end process beside the engine
                # process (docs/architecture.md), on one core the whole server in one process;
                # TA_TEST_WORKERS=2 runs every such test against two front ends, 0 in one process.
                "--workers",
                os.environ.get("TA_TEST_WORKERS", "1"),
                *args,
            ],
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    server = ServerProcess(process, http_port, log_path, env)
    if not wait_live:
        return server
    return _answering(server, wait_ready, timeout, probe_headers)


def start_serve(
    root: Path, env: Mapping[str, str], *flags: str, timeout: float = 90
) -> ServerProcess:
    """`tritonactor serve FLAGS` (the CLI, its default front ends) on free loopback ports, with
    `env` over `loopback_env`'s; waits until it is ready."""
    http_port = free_port()
    full_env = {**loopback_env(root, http_port, free_port(), free_port()), **env}
    log_path = root / f"serve-{http_port}.log"
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "tritonactor.cli", "serve", *flags],
            env=full_env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    return _answering(ServerProcess(process, http_port, log_path, full_env), True, timeout)


def _answering(
    server: ServerProcess,
    wait_ready: bool,
    timeout: float,
    probe_headers: Mapping[str, str] | None = None,
) -> ServerProcess:
    """`server` once it is ready (or live); RuntimeError with its log if it exits or does not
    answer within `timeout` seconds (then it is stopped)."""
    deadline = time.monotonic() + timeout
    path = "/v2/health/ready" if wait_ready else "/v2/health/live"
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"server exited with {server.process.returncode}:\n{server.log()}")
        try:
            probe = httpx.get(f"{server.base}{path}", timeout=1, headers=probe_headers)
            if probe.status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    server.stop()
    raise RuntimeError(
        f"server did not become {'ready' if wait_ready else 'live'}:\n{server.log()}"
    )
