"""An engine whose starter ends before any front end joined stops by itself.

A plain `hypercorn --workers N` worker starts the engine without tying it to itself (the other
workers share it). A worker that ends between starting the engine and joining it (killed while
it starts) would otherwise leave an engine nobody stops, holding the server's ports."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from tests.processes import all_pids, cmdline, environ
from tests.server_process import free_port, loopback_env

pytestmark = pytest.mark.e2e

MODELS = Path(__file__).resolve().parent.parent / "python_models"
# What a worker does first: start the engine (untied, as a plain hypercorn's worker does);
# then it ends without joining.
STARTER = """
import os, pathlib, sys
from tritonactor.engine.launch import _locked_start, engine_socket
from tritonactor.settings import Settings

settings = Settings.from_env()
_locked_start(settings, engine_socket(settings))
print("engine", pathlib.Path("/proc/self/task/%d/children" % os.getpid()).read_text(), flush=True)
sys.stdin.read()  # until the test lets it end
"""
# A bound on waiting for the engine to go; reaching it is the failure.
PATIENCE = 120.0


def engine_of(http_port: int) -> int | None:
    for pid in all_pids():
        if "tritonactor.engine" in cmdline(pid) and environ(pid).get(
            "TRITONACTOR_HTTP_PORT"
        ) == str(http_port):
            return pid
    return None


def test_an_engine_no_front_end_joined_stops_once_its_starter_has_ended(tmp_path: Path) -> None:
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    env = loopback_env(tmp_path, http_port, grpc_port, metrics_port)
    repo = tmp_path / "repo"
    repo.mkdir()
    env["TRITONACTOR_MODEL_REPOSITORY"] = str(repo)
    log = tmp_path / "engine.log"
    with log.open("wb") as out:
        starter = subprocess.Popen(
            [sys.executable, "-c", STARTER],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=out,  # the engine's log too (it inherits it)
        )
    assert starter.stdout is not None and starter.stdin is not None
    engine = None
    for raw in iter(starter.stdout.readline, b""):  # (the starter's lines; it waits after)
        words = raw.decode().split()
        if words[:1] == ["engine"]:
            engine = int(words[1]) if len(words) > 1 else None
            break
    try:
        assert engine is not None and "tritonactor.engine" in cmdline(engine), log.read_text()
        starter.stdin.close()  # the starter ends, never having joined
        assert starter.wait(timeout=PATIENCE) == 0
        deadline = time.monotonic() + PATIENCE
        while engine_of(http_port) == engine:
            assert time.monotonic() < deadline, f"the engine still runs:\n{log.read_text()}"
            time.sleep(0.1)
        assert "no front end joined: the engine stops" in log.read_text()
        # Its ports are free again: nothing answers on the metrics port.
        with pytest.raises(requests.ConnectionError):
            requests.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5)
    finally:
        starter.kill()
        starter.wait()
        left = engine_of(http_port)
        if left is not None:
            os.kill(left, signal.SIGKILL)
