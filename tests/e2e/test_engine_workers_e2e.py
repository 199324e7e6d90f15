"""Several front-end processes in front of one engine, as `tritonactor serve --workers 2` (uvicorn)
and `hypercorn tritonactor.app:app --workers 2` run them: one copy of each model, the same
statistics and index from every front end, explicit loads seen by every front end, a front end
that dies loses only its own connections, and an engine that goes away ends every request in
flight with UNAVAILABLE (never a hang) and is started again.

Which front end serves a connection is read from /proc: the process holding the server side of
the client's TCP connection."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.otlp_receiver import OtlpReceiver
from tests.processes import all_pids, children, cmdline, environ, has_ended, start_time
from tests.server_process import free_port, loopback_env, wait_for
from tritonactor.backends.python.ipc import SHM_DIR
from tritonactor.engine.lanes import owner_prefix
from tritonactor.engine.launch import usable_cpus

pytestmark = pytest.mark.e2e

MODELS = Path(__file__).resolve().parent.parent / "python_models"
INSTANCES = 2
# A bound on the connections opened to reach both front ends (the kernel picks the accepting
# process); reaching it is a failure, never an expected outcome.
TRIES = 400


@dataclass
class Served:
    process: subprocess.Popen[bytes]
    http_port: int
    grpc_port: int
    metrics_port: int
    log: Path
    kind: str

    def engine(self) -> int:
        """The engine process of this server (its own session: found by its settings)."""
        for pid in all_pids():
            if "tritonactor.engine" in cmdline(pid) and environ(pid).get(
                "TRITONACTOR_HTTP_PORT"
            ) == str(self.http_port):
                return pid
        raise AssertionError(f"no engine process for port {self.http_port}:\n{self.output()}")

    def front_ends(self) -> list[int]:
        """The worker processes of the ASGI server (the children it spawned)."""
        return [
            pid
            for pid in children(self.process.pid)
            if "multiprocessing.spawn" in cmdline(pid)  # not its resource tracker
        ]

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def connection(self) -> http.client.HTTPConnection:
        connection = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=60)
        connection.connect()
        return connection

    def serving(self, connection: http.client.HTTPConnection) -> int:
        """The front-end process on the server side of `connection` (after a first request)."""
        client_port = connection.sock.getsockname()[1]
        inodes = set()
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            fields = line.split()
            local, remote, inode = fields[1], fields[2], fields[9]
            if (
                int(local.split(":")[1], 16) == self.http_port
                and int(remote.split(":")[1], 16) == client_port
            ):
                inodes.add(f"socket:[{inode}]")
        for pid in self.front_ends():
            try:
                fds = list(Path(f"/proc/{pid}/fd").iterdir())
            except OSError:
                continue
            for fd in fds:
                try:
                    if os.readlink(fd) in inodes:
                        return pid
                except OSError:
                    continue
        raise AssertionError("no front end holds the connection")

    def per_front_end(self) -> dict[int, http.client.HTTPConnection]:
        """A kept-alive connection to each front end."""
        found: dict[int, http.client.HTTPConnection] = {}
        wanted = len(self.front_ends())
        for _ in range(TRIES):
            connection = self.connection()
            status, _ = get(connection, "/v2/health/live")
            assert status == 200
            pid = self.serving(connection)
            if pid in found:
                connection.close()
            else:
                found[pid] = connection
            if len(found) == wanted:
                return found
        raise AssertionError(f"reached {len(found)} of {wanted} front ends in {TRIES} connections")

    def replaced(self, doomed: int) -> dict[int, http.client.HTTPConnection]:
        """A kept-alive connection to each of the two front ends once uvicorn has started one in
        place of `doomed` (killed) and it accepts. The set is read again until it holds still:
        a front end just started can still go (uvicorn kills one that does not answer its
        health check in time and starts another)."""
        deadline = time.monotonic() + 120
        while True:
            assert time.monotonic() < deadline, (
                f"no front end replaced the one that died:\n{self.output()}"
            )
            now = self.front_ends()
            if len(now) == 2 and doomed not in now:
                try:
                    found = self.per_front_end()  # once the new one accepts
                except AssertionError:
                    found = {}
                if sorted(found) == sorted(now) == sorted(self.front_ends()):
                    # (none of them failed on its own: one that did would have logged why)
                    assert "Traceback" not in self.output(), self.output()
                    return found
                for connection in found.values():
                    connection.close()
            time.sleep(0.1)


def request(
    connection: http.client.HTTPConnection, method: str, path: str, body: object = None
) -> tuple[int, dict]:
    payload = None if body is None else json.dumps(body)
    connection.request(method, path, body=payload, headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    data = response.read()
    return response.status, json.loads(data) if data else {}


def get(connection: http.client.HTTPConnection, path: str) -> tuple[int, dict]:
    return request(connection, "GET", path)


def infer_body(value: float) -> dict:
    data = [value] * 4
    return {
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": data},
            {"name": "INPUT1", "datatype": "FP32", "shape": [4], "data": data},
        ]
    }


def _repository(root: Path, models: tuple[str, ...] = ()) -> Path:
    repo = root / "repo"
    for name in ("add_sub", "cancellable", *models):
        shutil.copytree(MODELS / name, repo / name)
    config = repo / "add_sub" / "config.pbtxt"
    config.write_text(
        config.read_text().replace(
            "instance_group [ { kind: KIND_CPU } ]",
            f"instance_group [ {{ count: {INSTANCES} kind: KIND_CPU }} ]",
        )
    )
    return repo


def start(
    kind: str,
    root: Path,
    *extra: str,
    ready: bool = True,
    models: tuple[str, ...] = (),
    env_extra: dict[str, str] | None = None,
    prefix: tuple[str, ...] = (),
    ports: tuple[int, int, int] | None = None,
) -> Served:
    repo = _repository(root, models)
    http_port, grpc_port, metrics_port = ports or (free_port(), free_port(), free_port())
    env = loopback_env(root, http_port, grpc_port, metrics_port)
    if any(variable.startswith("OTEL_") for variable in env_extra or {}):
        # Only the test's tracing settings: none from the environment the tests run in.
        env = {k: v for k, v in env.items() if not k.startswith("OTEL_")}
    env.update(env_extra or {})
    env["TRITONACTOR_MODEL_REPOSITORY"] = str(repo)
    # "serve-1": one front end, in uvicorn's own process (no worker processes to count);
    # "hypercorn-1": a plain `hypercorn tritonactor.app:app`, one worker process.
    workers = 1 if kind in ("serve-1", "hypercorn-1") else 2
    if kind.startswith("serve"):
        command = [sys.executable, "-m", "tritonactor.cli", "serve", "--workers", str(workers)]
        command += extra
    else:
        command = [
            sys.executable,
            "-m",
            "hypercorn",
            "tritonactor.app:app",
            "--bind",
            f"127.0.0.1:{http_port}",
        ]
        if kind != "hypercorn-1":
            command += ["--workers", "2"]
        for flag in extra:
            name, _, value = flag.removeprefix("--").partition("=")
            env["TRITONACTOR_" + name.upper().replace("-", "_")] = value
    log = root / "server.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*prefix, *command], env=env, stdout=out, stderr=subprocess.STDOUT
        )
    served = Served(process, http_port, grpc_port, metrics_port, log, kind)
    deadline = time.monotonic() + 120
    path = "/v2/health/ready" if ready else "/v2/health/live"
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"server exited {process.returncode}:\n{served.output()}")
        try:
            connection = served.connection()
            status, _ = get(connection, path)
            connection.close()
            front_ends = 0 if kind == "serve-1" else workers
            if status == 200 and len(served.front_ends()) == front_ends:
                return served
        except OSError:
            pass
        time.sleep(0.1)
    process.kill()
    raise AssertionError(f"server did not start:\n{served.output()}")


def stop(served: Served) -> None:
    engine = None
    with contextlib.suppress(AssertionError):  # a test that killed it
        engine = served.engine()
    started = start_time(engine) if engine is not None else None
    served.process.send_signal(signal.SIGTERM)
    try:
        served.process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        served.process.kill()
        served.process.wait()
    if engine is not None:
        # The engine stops once its last front end has gone.
        deadline = time.monotonic() + 60
        while not has_ended(engine, started) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not has_ended(engine, started):
            os.kill(engine, signal.SIGKILL)
            raise AssertionError("the engine outlived its front ends")


@pytest.fixture(params=["serve", "hypercorn"])
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Served]:
    server = start(request.param, tmp_path)
    try:
        yield server
    finally:
        stop(server)


def test_one_copy_of_each_model_whatever_the_front_ends(served: Served) -> None:
    engine = served.engine()
    stubs = [pid for pid in children(engine) if "backends.python.stub" in cmdline(pid)]
    assert len(stubs) == INSTANCES + 1  # add_sub's, and cancellable's one
    for front_end in served.front_ends():
        assert not [c for c in children(front_end) if "backends.python.stub" in cmdline(c)]
    assert engine not in served.front_ends()
    # The lock that kept it to one engine (front ends racing to start it, under hypercorn)
    # leaves no file behind once the engine serves.
    socket_path = environ(engine).get("TA_ENGINE_SOCKET")
    assert socket_path and Path(socket_path).exists()
    assert not Path(socket_path + ".lock").exists()


@pytest.mark.skipif(usable_cpus() < 2, reason="one front end beside the engine needs two cores")
def test_a_plain_hypercorn_is_one_front_end_beside_the_engine(tmp_path: Path) -> None:
    """`hypercorn tritonactor.app:app` (one worker) where two cores or more may be used: its
    worker is a front end, and the models live in the engine process."""
    served = start("hypercorn-1", tmp_path)
    try:
        engine = served.engine()
        [front_end] = served.front_ends()
        stubs = [pid for pid in children(engine) if "backends.python.stub" in cmdline(pid)]
        assert len(stubs) == INSTANCES + 1
        assert not [c for c in children(front_end) if "backends.python.stub" in cmdline(c)]
        assert_infers(served)
    finally:
        stop(served)


@pytest.mark.skipif(usable_cpus() < 2, reason="one front end beside the engine needs two cores")
def test_a_large_answer_through_a_plain_hypercorn_reads_whole_in_tritonclient(
    tmp_path: Path,
) -> None:
    """1 MiB in and out through hypercorn (h11) in front of the engine, whose answer's data
    goes out as a body message of its own after the JSON header (how, in
    tests/unit/test_http_response_pieces.py): the real client reads each response whole."""
    served = start("hypercorn-1", tmp_path, models=("async_add",))
    try:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{served.http_port}")
        rng = np.random.default_rng(1)
        for _ in range(3):
            data = rng.random((1, 1 << 18), dtype=np.float32)
            given = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
            given.set_data_from_numpy(data, binary_data=True)
            wanted = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
            result = client.infer("async_add", [given], outputs=[wanted])
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data + 1)
        client.close()
    finally:
        stop(served)


@pytest.mark.skipif(shutil.which("taskset") is None, reason="needs taskset (util-linux)")
def test_a_plain_hypercorn_on_one_core_is_one_process(tmp_path: Path) -> None:
    """The same command on one core: the worker is the whole server, models and all."""
    served = start("hypercorn-1", tmp_path, prefix=("taskset", "-c", "0"))
    try:
        with pytest.raises(AssertionError, match="no engine process"):
            served.engine()
        [worker] = served.front_ends()
        stubs = [pid for pid in children(worker) if "backends.python.stub" in cmdline(pid)]
        assert len(stubs) == INSTANCES + 1
        assert_infers(served)
    finally:
        stop(served)


def assert_infers(served: Served) -> None:
    connection = served.connection()
    status, answer = request(connection, "POST", "/v2/models/add_sub/infer", infer_body(2.0))
    connection.close()
    assert status == 200, answer
    outputs = {output["name"]: output["data"] for output in answer["outputs"]}
    assert outputs == {"OUTPUT0": [4.0] * 4, "OUTPUT1": [0.0] * 4}


def test_statistics_index_and_metrics_are_the_same_from_every_front_end(served: Served) -> None:
    connections = served.per_front_end()
    assert len(connections) == 2
    sent = 0
    for connection in connections.values():
        for value in (1.0, 2.0, 3.0):
            status, body = request(
                connection, "POST", "/v2/models/add_sub/infer", infer_body(value)
            )
            assert status == 200, body
            assert body["outputs"][0]["data"] == [2 * value] * 4
            sent += 1
    answers = []
    for connection in connections.values():
        status, stats = get(connection, "/v2/models/add_sub/stats")
        assert status == 200
        answers.append(stats["model_stats"][0]["inference_count"])
        status, index = request(connection, "POST", "/v2/repository/index")
        assert status == 200
        assert [(e["name"], e["state"]) for e in index] == [
            ("add_sub", "READY"),
            ("cancellable", "READY"),
        ]
    assert answers == [sent, sent]
    metrics = http.client.HTTPConnection("127.0.0.1", served.metrics_port, timeout=60)
    metrics.request("GET", "/metrics")
    text = metrics.getresponse().read().decode()
    assert f'nv_inference_count{{model="add_sub",version="1"}} {sent}\n' in text


def test_explicit_load_through_one_front_end_serves_on_every_one(tmp_path: Path) -> None:
    served = start("serve", tmp_path, "--model-control-mode=explicit")
    try:
        (first, one), (second, other) = served.per_front_end().items()
        assert first != second
        status, body = request(other, "POST", "/v2/models/add_sub/infer", infer_body(1.0))
        assert status == 404, body  # not loaded yet: Triton's unknown model
        status, body = request(one, "POST", "/v2/repository/models/add_sub/load")
        assert status == 200, body
        status, body = request(other, "POST", "/v2/models/add_sub/infer", infer_body(1.0))
        assert status == 200, body
        status, body = request(other, "POST", "/v2/repository/models/add_sub/unload")
        assert status == 200, body
        status, body = request(one, "POST", "/v2/models/add_sub/infer", infer_body(1.0))
        assert status == 404, body
        assert "unknown model" in body["error"]
    finally:
        stop(served)


@pytest.mark.parametrize("kind", ["serve", "hypercorn"])
def test_a_supervisor_killed_outright_takes_its_front_ends_and_engine_with_it(
    kind: str, tmp_path: Path
) -> None:
    """`kill -9` of the ASGI server's supervisor (`tritonactor serve --workers 2`, a plain
    `hypercorn --workers 2`): its workers drain and end (they served on, orphaned, before,
    holding the ports), then the engine, whose front ends have all left; a new server starts
    on the same ports."""
    served = start(kind, tmp_path / "first")
    workers, engine = served.front_ends(), served.engine()
    assert len(workers) == 2
    started = {pid: start_time(pid) for pid in [*workers, engine]}
    served.process.kill()
    served.process.wait()
    deadline = time.monotonic() + 60  # a bound on waiting for the event: reaching it fails
    for pid in [*workers, engine]:
        while not has_ended(pid, started[pid]):
            assert time.monotonic() < deadline, (pid, cmdline(pid), served.output())
            time.sleep(0.05)
    ports = (served.http_port, served.grpc_port, served.metrics_port)
    stop(start(kind, tmp_path / "second", ports=ports))


def test_a_front_end_that_dies_loses_only_its_connections(tmp_path: Path) -> None:
    # uvicorn's supervisor starts a dead worker again and leaves the others be; hypercorn's
    # stops every worker when one exits with an error (its own policy: docs/decisions.md).
    served = start("serve", tmp_path)
    try:
        _lose_one_front_end(served)
    finally:
        stop(served)


def _lose_one_front_end(served: Served) -> None:
    connections = served.per_front_end()
    (doomed, lost), (survivor, kept) = connections.items()
    os.kill(doomed, signal.SIGKILL)
    with pytest.raises((ConnectionError, http.client.HTTPException, OSError)):
        request(lost, "POST", "/v2/models/add_sub/infer", infer_body(1.0))
    status, body = request(kept, "POST", "/v2/models/add_sub/infer", infer_body(4.0))
    assert status == 200, body
    assert body["outputs"][0]["data"] == [8.0] * 4
    assert served.engine() not in (doomed, survivor)
    # uvicorn starts another front end, which joins the same engine: its new connections serve.
    replacement = served.replaced(doomed)
    for connection in replacement.values():
        status, body = request(connection, "POST", "/v2/models/add_sub/infer", infer_body(1.0))
        assert status == 200, body
    # (a new connection: `kept` may have been closed as idle meanwhile; every front end answers
    # the same statistics)
    status, stats = get(served.connection(), "/v2/models/add_sub/stats")
    assert stats["model_stats"][0]["inference_count"] == 1 + len(replacement)


def test_an_engine_that_goes_away_ends_every_request_and_the_server_recovers(
    served: Served, tmp_path: Path
) -> None:
    engine = served.engine()
    # A decoupled model answering every 20 ms until cancelled: a stream in flight.
    url = f"http://127.0.0.1:{served.http_port}/v2/models/cancellable/generate_stream"
    body = {"INTERVAL_MS": 20, "marker": str(tmp_path / "ended"), "limit_s": 60}
    with requests.post(url, json=body, stream=True, timeout=60) as response:
        assert response.status_code == 200
        lines = (line for line in response.iter_lines() if line)
        assert json.loads(next(lines)[len(b"data: ") :])["INDEX"] == 0
        os.kill(engine, signal.SIGKILL)
        events = [json.loads(line[len(b"data: ") :]) for line in lines]
    # The stream ended (no hang), its last event saying why.
    assert "engine" in events[-1]["error"], events[-1]
    # The front ends stop. hypercorn's supervisor then stops the server (its policy when a
    # worker ends); uvicorn's starts them again, and a new engine serves.
    if served.kind == "hypercorn":
        served.process.wait(timeout=120)
        return
    deadline = time.monotonic() + 120
    while True:
        assert time.monotonic() < deadline, f"the server did not recover:\n{served.output()}"
        try:
            connection = served.connection()
            status, answer = request(
                connection, "POST", "/v2/models/add_sub/infer", infer_body(1.0)
            )
            connection.close()
            if status == 200:
                break
        except (OSError, http.client.HTTPException, ValueError):
            pass
        time.sleep(0.2)
    assert answer["outputs"][0]["data"] == [2.0] * 4
    assert served.engine() != engine
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{served.grpc_port}")
    assert client.is_model_ready("add_sub")
    client.close()


def test_with_one_front_end_an_engine_that_goes_away_stops_the_server_with_status_1(
    tmp_path: Path,
) -> None:
    # `tritonactor serve --workers 1` (the default on two cores): the front end is the ASGI
    # server's own process, which no supervisor would start again.
    served = start("serve-1", tmp_path)
    try:
        connection = served.connection()
        status, answer = request(connection, "POST", "/v2/models/add_sub/infer", infer_body(1.0))
        assert status == 200, answer
        os.kill(served.engine(), signal.SIGKILL)
        assert served.process.wait(timeout=120) == 1, served.output()
        assert "its engine went away and no supervisor starts" in served.output()
    finally:
        if served.process.poll() is None:
            served.process.kill()
            served.process.wait()


def lane_files(pid: int) -> set[str]:
    """The shared-memory slots a process made for large tensors (engine/lanes.py)."""
    return {name for name in os.listdir(SHM_DIR) if name.startswith(owner_prefix(pid))}


def infer_large(connection: http.client.HTTPConnection, data: np.ndarray) -> np.ndarray:
    """async_add over binary HTTP: INPUT0 + 1."""
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "FP32",
                    "shape": list(data.shape),
                    "parameters": {"binary_data_size": data.nbytes},
                }
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        }
    ).encode()
    connection.request(
        "POST",
        "/v2/models/async_add/infer",
        body=header + data.tobytes(),
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    response = connection.getresponse()
    body = response.read()
    assert response.status == 200, body[:500]
    length = int(response.getheader("Inference-Header-Content-Length"))
    return np.frombuffer(body[length:], np.float32).reshape(data.shape)


def test_large_tensors_cross_in_shared_memory_that_is_reused_and_removed(tmp_path: Path) -> None:
    """1 MiB in and out through each front end: the tensors go to the engine and back through
    each side's lane slots (files in /dev/shm) rather than the socket, the slots are reused
    request after request, a front end killed outright has its slots removed by the engine, and
    nothing is left once the server stops."""
    served = start("serve", tmp_path, models=("async_add",))
    try:
        engine = served.engine()
        connections = served.per_front_end()
        rng = np.random.default_rng(0)
        made: dict[int, set[str]] = {}
        for round in range(5):
            for connection in connections.values():
                data = rng.random((1, 1 << 18), dtype=np.float32)
                np.testing.assert_array_equal(infer_large(connection, data), data + 1)
            if round == 1:
                # A slot is released with the first message after its tensor's last view
                # went (engine/lanes.py), here the next request's answer or the next request:
                # two slots in the front end's lane, one in the engine's, then reused.
                made = {pid: lane_files(pid) for pid in (engine, *connections)}
        assert all(made.values()), made
        assert {pid: lane_files(pid) for pid in (engine, *connections)} == made  # reused
        (doomed, _lost), (survivor, kept) = connections.items()
        os.kill(doomed, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while lane_files(doomed):
            assert time.monotonic() < deadline, "the dead front end's slots were not removed"
            time.sleep(0.05)
        data = rng.random((2, 1 << 17), dtype=np.float32)
        np.testing.assert_array_equal(infer_large(kept, data), data + 1)
    finally:
        stop(served)
    assert not lane_files(engine) and not lane_files(survivor)


def test_an_answer_still_being_written_keeps_its_slot(tmp_path: Path) -> None:
    """The front end reads an answer's tensor in the engine's lane slot and uvicorn writes it
    from there: an answer larger than the sockets' buffers, to a client that does not read
    yet, keeps its slot until it is written (answers meanwhile take another one), and the
    client reads its own bytes, not those of the answers after it (engine/lanes.py)."""
    served = start("serve-1", tmp_path, models=("async_add",))
    try:
        engine = served.engine()
        # 12 MiB of FP32 each way: past what the kernel buffers of a connection whose client
        # reads nothing (tcp_wmem's 4 MiB at most, and a receive buffer of 4 KiB)
        elements = 3 << 20
        late = np.full((1, elements), 1.0, np.float32)
        header = json.dumps(
            {
                "inputs": [
                    {
                        "name": "INPUT0",
                        "datatype": "FP32",
                        "shape": [1, elements],
                        "parameters": {"binary_data_size": late.nbytes},
                    }
                ],
                "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
            }
        ).encode()
        reader = socket.socket()
        reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        reader.connect(("127.0.0.1", served.http_port))
        reader.sendall(
            b"POST /v2/models/async_add/infer HTTP/1.1\r\nHost: test\r\n"
            b"Content-Length: %d\r\nInference-Header-Content-Length: %d\r\n\r\n"
            % (len(header) + late.nbytes, len(header))
            + header
            + late.tobytes()
        )
        other = served.connection()
        wait_for(lambda: inferences(other) == 1, 60, lambda: "the late request not answered")
        for value in (2.0, 3.0):  # answers while the late one is being written
            data = np.full((1, elements), value, np.float32)
            np.testing.assert_array_equal(infer_large(other, data), data + 1)
        slots = lane_files(engine)
        response = http.client.HTTPResponse(reader)
        response.begin()
        body = response.read()
        assert response.status == 200, body[:300]
        length = int(response.getheader("Inference-Header-Content-Length"))
        np.testing.assert_array_equal(np.frombuffer(body[length:], np.float32), late[0] + 1)
        reader.close()
        assert len(slots) == 2  # its slot was held: the answers after it took one more
    finally:
        stop(served)


def test_large_grpc_messages_cross_uvicorns_loop_both_ways(tmp_path: Path) -> None:
    """Under `tritonactor serve` (uvicorn, uvloop), large ModelInfer messages each way, the
    paths where a request is read in place and an answer of 64 KiB or more written as its
    pieces (its tensor a view of the engine's lane slot): tritonclient gets each answer's own
    bytes, round after round, while the slots are reused. (Which path wrote what is checked
    in tests/unit/test_grpc_direct.py; this checks the bytes through the real loop.)"""
    served = start("serve-1", tmp_path, models=("async_add",))
    try:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{served.grpc_port}")
        rng = np.random.default_rng(1)
        for _ in range(2):
            for elements in (1 << 14, 1 << 18, 3 << 18):  # 64 KiB, 1 MiB, 3 MiB
                data = rng.random((1, elements), dtype=np.float32)
                tensor = grpcclient.InferInput("INPUT0", [1, elements], "FP32")
                tensor.set_data_from_numpy(data)
                result = client.infer("async_add", [tensor])
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data + 1)
        client.close()
    finally:
        stop(served)


def inferences(connection: http.client.HTTPConnection) -> int:
    """The inferences async_add has counted."""
    connection.request("GET", "/v2/models/async_add/stats")
    response = connection.getresponse()
    return int(json.loads(response.read())["model_stats"][0]["inference_count"])


def traced_env(receiver: OtlpReceiver, delay_ms: int) -> dict[str, str]:
    """Tracing on, exporting to `receiver`, spans exported once they have waited `delay_ms`
    in the exporter process at most."""
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": str(delay_ms),
    }


def test_trace_count_counts_the_requests_of_every_front_end(tmp_path: Path) -> None:
    """trace_count is the server's, not each front end's: set to 3 through one front end,
    six requests spread over both are traced three times, and both front ends then show 0
    left; a front end started after that (uvicorn replacing one that died) traces nothing
    either. (trace_rate still counts per front end: docs/tracing.md.)"""
    receiver = OtlpReceiver()
    served = start("serve", tmp_path, env_extra=traced_env(receiver, delay_ms=50))

    def infer(connection: http.client.HTTPConnection, id: str, sampled: bool = False) -> None:
        body = infer_body(1.0)
        body["id"] = id
        headers = {"Content-Type": "application/json"}
        if sampled:  # the client's sampled trace: traced whatever trace_count says
            headers["traceparent"] = f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"
        connection.request("POST", "/v2/models/add_sub/infer", json.dumps(body), headers)
        response = connection.getresponse()
        assert response.status == 200, response.read()
        response.read()

    def ids(spans: list) -> list[str]:
        return sorted(
            str(span.attributes.get("triton.request_id"))
            for span in spans
            if span.name == "InferRequest"
        )

    def marked(*connections: http.client.HTTPConnection) -> list[str]:
        """Everything the front ends of `connections` traced so far, once received: each
        exports its spans in order, so a marker traced through each closes the list."""
        names = [f"mark-{secrets.token_hex(4)}" for _ in connections]
        for name, connection in zip(names, connections, strict=True):
            infer(connection, name, sampled=True)
        return ids(receiver.wait_for(lambda got: set(names) <= set(ids(got)), timeout=60))

    try:
        (survivor, a), (doomed, b) = served.per_front_end().items()
        status, body = request(
            a, "POST", "/v2/trace/setting", {"trace_rate": "1", "trace_count": "3"}
        )
        assert status == 200 and body["trace_count"] == "3", body
        for index in range(6):
            infer((a, b)[index % 2], f"count-{index}")
        for connection in (a, b):
            assert get(connection, "/v2/trace/setting")[1]["trace_count"] == "0"
        traced = marked(a, b)
        assert [i for i in traced if i.startswith("count-")] == ["count-0", "count-1", "count-2"]
        # A front end that joins now takes the settings in force, not the ones it started with.
        os.kill(doomed, signal.SIGKILL)
        # (the connections open until now may have been closed as idle meanwhile)
        connections = served.replaced(doomed)
        joined = next(c for pid, c in connections.items() if pid != survivor)
        for index in range(2):
            infer(joined, f"late-{index}")
        assert not [i for i in marked(joined) if i.startswith("late-")]
    finally:
        stop(served)
        receiver.close()


def test_a_front_end_that_joins_takes_the_log_settings_in_force(tmp_path: Path) -> None:
    """Log settings changed through one front end hold in a front end started after it (uvicorn
    replacing one that died), not the command line's it started with: its requests are logged
    at the verbose level set."""
    served = start("serve", tmp_path)
    try:
        (survivor, a), (doomed, _) = served.per_front_end().items()
        status, body = request(a, "POST", "/v2/logging", {"log_verbose_level": 1})
        assert status == 200 and body["log_verbose_level"] == 1, body
        os.kill(doomed, signal.SIGKILL)
        connections = served.replaced(doomed)
        joined, connection = next((p, c) for p, c in connections.items() if p != survivor)
        status, body = request(connection, "POST", "/v2/models/add_sub/infer", infer_body(1.0))
        assert status == 200, body

        def logged_by_joined() -> bool:
            return any(
                line.startswith("I")  # a verbose line: Triton writes it with I
                and f" {joined} " in line
                and "/v2/models/add_sub/infer" in line
                for line in served.output().splitlines()
            )

        wait_for(logged_by_joined, timeout=60, describe=served.output)
    finally:
        stop(served)


def _exporters(root: int) -> list[int]:
    """The span exporter processes under `root` (observability/span_exporter.py)."""
    found, stack = [], [root]
    while stack:
        for child in children(stack.pop()):
            stack.append(child)
            if "tritonactor.observability.span_exporter" in cmdline(child):
                found.append(child)
    return found


def _ended(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


def test_every_serving_process_exports_from_an_exporter_process_that_ends_with_it(
    tmp_path: Path,
) -> None:
    """Each front end and the engine export their spans from an exporter process of their
    own. Spans wait up to 10 minutes in the exporter processes here, so a request's spans
    (made in a front end and in the engine) arrive because the server, stopping, closes their
    sockets and waits for them to be exported; then every exporter process has ended."""
    receiver = OtlpReceiver()
    served = start("serve", tmp_path, env_extra=traced_env(receiver, delay_ms=600000))
    try:
        processes = [served.engine(), *served.front_ends()]
        # `start` returns once one front end answers: another may still be starting its own.
        wait_for(
            lambda: all(_exporters(pid) for pid in processes),
            timeout=60,
            describe=lambda: f"a process without an exporter: {processes}\n{served.output()}",
        )
        per_process = {pid: _exporters(pid) for pid in processes}
        assert all(len(found) == 1 for found in per_process.values()), per_process
        connection = served.connection()
        body = infer_body(1.0)
        trace_id = secrets.token_hex(16)
        headers = {
            "Content-Type": "application/json",
            "traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01",
        }
        connection.request("POST", "/v2/models/add_sub/infer", json.dumps(body), headers)
        response = connection.getresponse()
        assert response.status == 200, response.read()
        response.read()
        connection.close()
    finally:
        stop(served)
    names = {"InferRequest", "router", "queue", "execute", "compute"}
    spans = receiver.wait_for(
        lambda got: names <= {s.name for s in got if s.trace_id == trace_id}, timeout=60
    )
    receiver.close()
    ours = [s for s in spans if s.trace_id == trace_id]
    assert len({s.span_id for s in ours}) == len(ours)  # ids given in two processes differ
    exporters = [pid for found in per_process.values() for pid in found]
    deadline = time.monotonic() + 60  # a bound on a failure: the exporters end with the server
    while not all(_ended(pid) for pid in exporters):
        assert time.monotonic() < deadline, "an exporter process outlived its server"
        time.sleep(0.05)
