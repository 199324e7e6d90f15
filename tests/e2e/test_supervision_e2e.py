"""A python model process killed with SIGKILL is noticed when it dies, not when a request meets
it: the index and strict readiness say so at once, a replacement starts with no request sent,
and no request sent after the death fails (it waits in the scheduler for the replacement). Only
a request the process was running when it died fails, UNAVAILABLE with the reason.

Run against the real server in both topologies (`tritonactor serve --workers 0`: the engine in
the one process; `--workers 2`: an engine process behind two front ends). The model's process
is found in /proc by its command line and the server's port (stubs inherit the server's
environment). A gate file held by the test keeps the replacement in `initialize`, so that the
window while no process serves is as long as the test needs, never a matter of timing."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.processes import cmdline, environ
from tests.server_process import free_port, pending_requests

pytestmark = pytest.mark.e2e

# Generous bounds on waiting for an event; reaching one is a failure, never an expected outcome.
EVENT_TIMEOUT_S = 60.0
POLL_S = 0.02

MODEL = "watched"

MODEL_PY = '''
"""Answers with its process id. INPUT0 = 1 writes busy-<pid> in the gate folder and blocks.
While the gate folder holds hold-init, initialize waits (a replacement held by the test)."""

import os
import time
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

GATE = Path(os.environ["SUPERVISION_GATE"])


class TritonPythonModel:
    def initialize(self, args):
        (GATE / f"init-{os.getpid()}").touch()
        while (GATE / "hold-init").exists():
            time.sleep(0.01)

    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()[0]
            if value == 1:
                (GATE / f"busy-{os.getpid()}").touch()
                while True:
                    time.sleep(1)
            pid = pb_utils.Tensor("PID", np.array([os.getpid()], dtype=np.int64))
            responses.append(pb_utils.InferenceResponse(output_tensors=[pid]))
        return responses
'''

CONFIG = f"""
name: "{MODEL}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "PID" data_type: TYPE_INT64 dims: [ 1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""


def _alive(pid: int) -> bool:
    """Whether `pid` is a process that has not been reaped (a zombie still counts)."""
    return Path(f"/proc/{pid}").exists()


def wait_for(what: str, check: Callable[[], object]) -> object:
    deadline = time.monotonic() + EVENT_TIMEOUT_S
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(POLL_S)
    raise AssertionError(f"timed out waiting for {what}")


@dataclass
class Served:
    process: subprocess.Popen[bytes]
    http_port: int
    metrics_port: int
    gate: Path
    log: Path
    workers: int

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stubs(self) -> list[int]:
        """This server's python model processes (alive, not zombies)."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            if "tritonactor.backends.python.stub" not in cmdline(pid):
                continue
            if environ(pid).get("TRITONACTOR_HTTP_PORT") != str(self.http_port):
                continue
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if state != "Z":
                found.append(pid)
        return found

    def stub(self) -> int:
        """The one process serving the model, once it is the only one."""
        [pid] = wait_for(
            "exactly one model process", lambda: (s := self.stubs()) and len(s) == 1 and s
        )
        return pid

    def pending(self) -> int:
        """The model's requests routed and not answered yet, queued or running (its metrics)."""
        return pending_requests(self.metrics_port, MODEL)

    def ready(self) -> int:
        return httpx.get(f"{self.base}/v2/health/ready", timeout=30).status_code

    def index_entry(self) -> dict:
        entries = httpx.post(f"{self.base}/v2/repository/index", timeout=30).json()
        [entry] = [entry for entry in entries if entry["name"] == MODEL]
        return entry

    def infer(self, value: int) -> httpx.Response:
        body = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1], "data": [value]}]}
        return httpx.post(f"{self.base}/v2/models/{MODEL}/infer", json=body, timeout=120)


def answered_pid(response: httpx.Response) -> int:
    assert response.status_code == 200, response.text
    return int(response.json()["outputs"][0]["data"][0])


def start(root: Path, workers: int) -> Served:
    repo = root / "repo"
    (repo / MODEL / "1").mkdir(parents=True)
    (repo / MODEL / "1" / "model.py").write_text(MODEL_PY)
    (repo / MODEL / "config.pbtxt").write_text(CONFIG)
    gate = root / "gate"
    gate.mkdir()
    http_port = free_port()
    metrics_port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRITONACTOR_", "TA_"))}
    env.update(
        {
            "SUPERVISION_GATE": str(gate),
            "TRITONACTOR_MODEL_REPOSITORY": str(repo),
            "TRITONACTOR_JOURNAL": str(root / "journal.jsonl"),
            "TRITONACTOR_HTTP_HOST": "127.0.0.1",
            "TRITONACTOR_HTTP_PORT": str(http_port),
            "TRITONACTOR_GRPC_HOST": "127.0.0.1",
            "TRITONACTOR_GRPC_PORT": str(free_port()),
            "TRITONACTOR_METRICS_HOST": "127.0.0.1",
            "TRITONACTOR_METRICS_PORT": str(metrics_port),
        }
    )
    command = [sys.executable, "-m", "tritonactor.cli", "serve", "--workers", str(workers)]
    log = root / "server.log"
    with log.open("wb") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    served = Served(process, http_port, metrics_port, gate, log, workers)

    def ready() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"server exited {process.returncode}:\n{served.output()}")
        try:
            return served.ready() == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for("the server to be ready", ready)
    except BaseException:
        stop(served)
        raise
    return served


def stop(served: Served) -> None:
    stubs = served.stubs()
    served.process.send_signal(signal.SIGTERM)
    try:
        served.process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        served.process.kill()
        served.process.wait()
    # The engine (--workers 2) stops its model processes once its last front end has gone.
    deadline = time.monotonic() + 60
    while any(_alive(pid) for pid in stubs) and time.monotonic() < deadline:
        time.sleep(0.1)


@pytest.fixture(scope="module", params=[0, 2], ids=["workers0", "workers2"])
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    server = start(tmp_path_factory.mktemp(f"supervision-{request.param}"), request.param)
    try:
        yield server
    finally:
        stop(server)


def test_an_idle_process_killed_is_replaced_before_any_request(served: Served) -> None:
    killed = served.stub()
    assert served.ready() == 200
    assert answered_pid(served.infer(0)) == killed
    hold = served.gate / "hold-init"
    hold.touch()  # the replacement waits in initialize until the test lets it go
    try:
        os.kill(killed, signal.SIGKILL)
        # Noticed with no request sent: strict readiness falls, the index says why, and a new
        # process is started in its place.
        wait_for("readiness to fall", lambda: served.ready() == 400)
        entry = served.index_entry()
        assert entry["state"] == "UNAVAILABLE", entry
        assert "exited with signal SIGKILL" in entry["reason"], entry
        replacement = wait_for(
            "a replacement process in initialize",
            lambda: [pid for pid in served.stubs() if pid != killed],
        )
        assert isinstance(replacement, list) and len(replacement) == 1
        new_pid = replacement[0]
        wait_for("the replacement's initialize", (served.gate / f"init-{new_pid}").exists)
        assert not _alive(killed)
        # A request sent while no process serves waits for the replacement.
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(served.infer, 0)
            wait_for("the server to hold the request", lambda: served.pending() == 1)
            assert served.ready() == 400  # still held in initialize
            hold.unlink()
            assert answered_pid(waiting.result()) == new_pid
    finally:
        hold.unlink(missing_ok=True)
    wait_for("readiness to come back", lambda: served.ready() == 200)
    entry = served.index_entry()
    assert entry["state"] == "READY", entry
    assert [answered_pid(served.infer(0)) for _ in range(5)] == [new_pid] * 5
    assert served.stubs() == [new_pid]
    assert "exited with signal SIGKILL" in served.output()


# Rounds of kill-then-send: each sends the request the instant after os.kill, while the dead
# process's socket may still take the batch (the kernel closes it only as the process ends).
# One round hits that window only sometimes; ten make missing it unlikely.
KILL_ROUNDS = 10


def test_a_request_sent_right_after_the_kill_waits_for_the_replacement(served: Served) -> None:
    body = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1], "data": [0]}]}
    url = f"{served.base}/v2/models/{MODEL}/infer"
    with httpx.Client(timeout=120) as client:  # a kept-alive connection: the request is quick
        for _ in range(KILL_ROUNDS):
            killed = served.stub()
            assert answered_pid(client.post(url, json=body)) == killed
            os.kill(killed, signal.SIGKILL)
            response = client.post(url, json=body)  # no wait: it may meet the dying process
            assert response.status_code == 200, response.text
            assert answered_pid(response) != killed
            wait_for("readiness to come back", lambda: served.ready() == 200)
    pids = [answered_pid(served.infer(0)) for _ in range(3)]
    assert pids == [pids[0]] * 3


def test_only_the_request_in_flight_fails_when_its_process_dies(served: Served) -> None:
    killed = served.stub()
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        doomed = pool.submit(served.infer, 1)
        wait_for("the model to take the blocking request", (served.gate / f"busy-{killed}").exists)
        # Queued behind it (one instance): they are not part of the batch that dies.
        queued = [pool.submit(served.infer, 0) for _ in range(3)]
        # Pending counts the running request and the queued ones.
        wait_for("the three requests to queue", lambda: served.pending() == 4)
        os.kill(killed, signal.SIGKILL)
        failed = doomed.result()
        assert failed.status_code == 503, failed.text
        assert "exited with signal SIGKILL" in failed.json()["error"]
        pids = [answered_pid(future.result()) for future in queued]
    assert killed not in pids
    assert len(set(pids)) == 1
    # And after it: every request succeeds.
    assert answered_pid(served.infer(0)) == pids[0]
    wait_for("readiness to come back", lambda: served.ready() == 200)


def test_bad_input_changes_nothing(served: Served) -> None:
    """A request the model cannot take is refused, and the model process serving it stays."""
    serving = served.stub()
    bad = httpx.post(
        f"{served.base}/v2/models/{MODEL}/infer",
        json={"inputs": [{"name": "NOPE", "datatype": "INT32", "shape": [1], "data": [0]}]},
        timeout=30,
    )
    assert bad.status_code == 400, bad.text
    assert served.stubs() == [serving]
    assert answered_pid(served.infer(0)) == serving
