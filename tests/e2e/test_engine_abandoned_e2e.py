"""An engine whose starter ends before any front end joined stops by itself; one a front end
joined stays for it.

A plain `hypercorn --workers N` worker starts the engine without tying it to itself (the other
workers share it). A worker that ends between starting the engine and joining it (killed while
it starts) would otherwise leave an engine nobody stops, holding the server's ports. Once a
front end has joined, the engine is theirs: it stops when the last of them leaves, whatever
became of the process that started it."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from tests.processes import all_pids, cmdline, environ
from tests.server_process import free_port, loopback_env, start_server, wait_for
from tritonactor.engine.launch import WORKERS, _locked_start, engine_socket
from tritonactor.settings import Settings

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
# A bound on waiting for the engine to go, or for a front end to serve; reaching it is the
# failure.
PATIENCE = 120.0


@dataclass
class Started:
    """An engine started by `starter`, a process that has not joined it; its log is the
    engine's (it inherits the starter's stderr)."""

    starter: subprocess.Popen[bytes]
    engine: int
    env: dict[str, str]
    http_port: int
    metrics_port: int
    log: Path

    def end_starter(self) -> None:
        assert self.starter.stdin is not None
        self.starter.stdin.close()  # the starter ends, never having joined
        assert self.starter.wait(timeout=PATIENCE) == 0

    def wait_for_log(self, line: str) -> None:
        wait_for(
            lambda: line in self.log.read_text(),
            PATIENCE,
            lambda: f"no {line!r} in:\n{self.log.read_text()}",
        )


def engine_of(http_port: int) -> int | None:
    for pid in all_pids():
        # (`-m`: not the starter, whose script names tritonactor.engine.launch)
        if "-m tritonactor.engine" in cmdline(pid) and environ(pid).get(
            "TRITONACTOR_HTTP_PORT"
        ) == str(http_port):
            return pid
    return None


@pytest.fixture
def started(tmp_path: Path) -> Iterator[Started]:
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    env = loopback_env(tmp_path, http_port, grpc_port, metrics_port)
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copytree(MODELS / "add_sub", repo / "add_sub")
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
    assert starter.stdout is not None
    engine = None
    try:
        for raw in iter(starter.stdout.readline, b""):  # (the starter's lines; it waits after)
            words = raw.decode().split()
            if words[:1] == ["engine"]:
                engine = int(words[1]) if len(words) > 1 else None
                break
        assert engine is not None and "tritonactor.engine" in cmdline(engine), log.read_text()
        yield Started(starter, engine, env, http_port, metrics_port, log)
    finally:
        starter.kill()
        starter.wait()
        left = engine_of(http_port)
        if left is not None:
            os.kill(left, signal.SIGKILL)


def wait_until_gone(started: Started) -> None:
    wait_for(
        lambda: engine_of(started.http_port) != started.engine,
        PATIENCE,
        lambda: f"the engine still runs:\n{started.log.read_text()}",
    )


@contextmanager
def front_end(started: Started, log_dir: Path) -> Iterator[str]:
    """A plain hypercorn, one front end (whatever the cores), which finds the engine running
    and joins it rather than starting another; its base URL, once ready. Stopped (SIGTERM,
    status 0) when the block ends."""
    front = start_server(
        None,
        log_dir,
        {**started.env, WORKERS: "1"},
        timeout=PATIENCE,
        http_port=started.http_port,
    )
    try:
        assert engine_of(started.http_port) == started.engine  # joined, not started anew
        yield front.base
        assert front.stop(PATIENCE) == 0, front.log()
    finally:
        front.stop()


def assert_serves(base: str) -> None:
    body = {
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1.0] * 4},
            {"name": "INPUT1", "datatype": "FP32", "shape": [4], "data": [2.0] * 4},
        ]
    }
    answer = requests.post(f"{base}/v2/models/add_sub/infer", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.json()["outputs"][0]["data"] == [3.0] * 4


def found(started: Started) -> socket.socket:
    """What a front end starting now does first: find the engine running (and hold the
    connection that found it until it has joined)."""
    settings = Settings.from_env(started.env)
    connection = _locked_start(settings, engine_socket(settings))
    assert connection is not None  # found, not started anew
    return connection


def test_an_engine_no_front_end_joined_stops_once_its_starter_has_ended(started: Started) -> None:
    started.end_starter()
    wait_until_gone(started)
    assert "no front end joined: the engine stops" in started.log.read_text()
    # Its ports are free again: nothing answers on the metrics port.
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{started.metrics_port}/metrics", timeout=5)


def test_an_engine_a_front_end_joined_outlives_its_starter(
    started: Started, tmp_path: Path
) -> None:
    with front_end(started, tmp_path) as base:
        started.end_starter()
        started.wait_for_log("the front ends that joined it keep it")
        assert engine_of(started.http_port) == started.engine
        assert_serves(base)
    # Its last front end leaving stops it.
    wait_until_gone(started)
    assert "no front end joined" not in started.log.read_text()
    started.wait_for_log("engine stopped")


def test_an_engine_waits_for_a_front_end_that_found_it_before_its_starter_ended(
    started: Started, tmp_path: Path
) -> None:
    """A front end that found the engine running joins it a moment later (it asks for the
    gRPC socket first): the starter ending in between does not stop the engine under it."""
    with found(started) as held:
        started.end_starter()
        started.wait_for_log("the engine stops unless one of the 1 connected joins it")
        with front_end(started, tmp_path) as base:
            held.close()  # (the test's: the front end has joined)
            started.wait_for_log("the front ends that joined it keep it")
            assert_serves(base)
            assert engine_of(started.http_port) == started.engine
    wait_until_gone(started)
    assert "no front end joined" not in started.log.read_text()


def test_a_connection_that_found_the_engine_and_left_without_joining_lets_it_stop(
    started: Started,
) -> None:
    with found(started):
        started.end_starter()
        started.wait_for_log("the engine stops unless one of the 1 connected joins it")
    wait_until_gone(started)
    assert "no front end joined: the engine stops" in started.log.read_text()
