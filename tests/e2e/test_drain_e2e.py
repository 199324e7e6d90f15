"""The graceful drain (docs/shutdown.md), with real servers, real signals and real clients.

A python model, `gate`, holds every request until a file the test creates exists, so the test
decides when the admitted requests may finish. Sixteen requests are put in flight (HTTP, gRPC
unary and a gRPC stream), the server reports them pending (its metrics), SIGTERM arrives, and:

- new requests are refused with the server's shutting-down message: 503 with a JSON error and
  `Connection: close` on a new or a kept-alive HTTP connection, UNAVAILABLE over gRPC;
- once the gate opens, all sixteen succeed, the server exits 0 and its ports are free;
- with the gate never opened, the exit timeout ends them with a clear error (503 JSON /
  UNAVAILABLE saying the server is shutting down) and the server exits.

Each test waits on events (log lines, metrics, answers), never on the clock.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.server_process import free_port, loopback_env, pending_requests

pytestmark = pytest.mark.e2e

HTTP_REQUESTS = 8
GRPC_REQUESTS = 5
STREAM_REQUESTS = 3
IN_FLIGHT = HTTP_REQUESTS + GRPC_REQUESTS + STREAM_REQUESTS  # 16
SHUTTING_DOWN = "shutting down"
# A bound on waiting for what the server must do; reaching it is a failure.
PATIENCE = 120

MODEL = '''\
import json
import os
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Holds each batch until the gate file exists; answers Y = X."""

    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.gate = config["parameters"]["gate"]["string_value"]

    def execute(self, requests):
        while not os.path.exists(self.gate):
            time.sleep(0.01)
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())]
            )
            for r in requests
        ]

    def finalize(self):
        # A finalize that takes a moment: the server's process must end after it has run.
        time.sleep(0.5)
        with open(self.gate + ".finalized", "w") as done:
            done.write("finalized")
'''

CONFIG = """\
name: "gate"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
parameters { key: "gate" value: { string_value: "%s" } }
"""


@dataclass
class Served:
    process: subprocess.Popen[bytes]
    http_port: int
    grpc_port: int
    metrics_port: int
    log: Path
    gate: Path
    # How many front-end processes log the drain's start.
    front_ends: int

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"


def start(root: Path, kind: str, exit_timeout: int = 30) -> Served:
    """`kind`: "serve-2" (tritonactor serve --workers 2: uvicorn, two front ends and the
    engine), "serve-1" (one front end, in uvicorn's process, and the engine; "-hypercorn": in
    hypercorn's), "serve-0"
    (uvicorn, one process), "serve-0-hypercorn" (--asgi-server hypercorn, one process),
    "hypercorn" (plain `hypercorn tritonactor.app:app`: one worker process)."""
    repo = root / "repo"
    gate = root / "gate-open"
    (repo / "gate" / "1").mkdir(parents=True)
    (repo / "gate" / "1" / "model.py").write_text(MODEL)
    (repo / "gate" / "config.pbtxt").write_text(CONFIG % gate)
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    env = loopback_env(root, http_port, grpc_port, metrics_port)
    env.update(
        {
            "TRITONACTOR_MODEL_REPOSITORY": str(repo),
            "TRITONACTOR_EXIT_TIMEOUT_SECS": str(exit_timeout),
        }
    )
    serve = [sys.executable, "-m", "tritonactor.cli", "serve"]
    if kind == "serve-2":
        command, front_ends = [*serve, "--workers", "2"], 2
    elif kind == "serve-1":
        command, front_ends = [*serve, "--workers", "1"], 1
    elif kind == "serve-0":
        command, front_ends = [*serve, "--workers", "0"], 1
    elif kind == "serve-1-hypercorn":
        command, front_ends = [*serve, "--workers", "1", "--asgi-server", "hypercorn"], 1
    elif kind == "serve-0-hypercorn":
        command, front_ends = [*serve, "--workers", "0", "--asgi-server", "hypercorn"], 1
    else:
        # hypercorn's default: one worker process; "hypercorn-2": two front ends and the engine.
        front_ends = 2 if kind == "hypercorn-2" else 1
        bind = f"127.0.0.1:{http_port}"
        command = [sys.executable, "-m", "hypercorn", "tritonactor.app:app", "--bind", bind]
        command += ["--workers", str(front_ends)]
    log = root / "server.log"
    with log.open("wb") as out:
        # A process group of its own, as a server started from a shell is: a test may signal
        # the whole group, as a terminal's Ctrl-C or systemd does.
        process = subprocess.Popen(
            command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    served = Served(process, http_port, grpc_port, metrics_port, log, gate, front_ends)
    deadline = time.monotonic() + PATIENCE
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"server exited {process.returncode}:\n{served.output()}")
        with contextlib.suppress(requests.RequestException):
            ready = requests.get(f"{served.http}/v2/health/ready", timeout=5).status_code == 200
            # Every front end serving, not only the first: a signal must find each one with
            # its drain in place (a front end still starting just exits).
            if ready and served.output().count(LISTENING) == front_ends:
                return served
        time.sleep(0.1)
    process.kill()
    raise AssertionError(f"server did not start:\n{served.output()}")


@pytest.fixture
def cleanup() -> Iterator[list[Served]]:
    started: list[Served] = []
    yield started
    for served in started:
        served.gate.touch()
        # Its whole group (engine and model processes too), whether or not it still runs.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(served.process.pid, signal.SIGKILL)
        served.process.wait()


def pending(served: Served) -> int:
    return pending_requests(served.metrics_port, "gate")


def wait_for(condition: Any, served: Served, what: str) -> None:
    deadline = time.monotonic() + PATIENCE
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"never saw {what}:\n{served.output()}")
        time.sleep(0.05)


def infer_body(value: int) -> dict[str, Any]:
    return {"inputs": [{"name": "X", "datatype": "INT32", "shape": [1], "data": [value]}]}


OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]


def grpc_inputs(value: int) -> list[grpcclient.InferInput]:
    x = grpcclient.InferInput("X", [1], "INT32")
    x.set_data_from_numpy(np.array([value], dtype=np.int32))
    return [x]


@dataclass
class InFlight:
    http: list[Future[requests.Response]]
    grpc: queue.Queue[tuple[int, Any, Any]]
    stream: queue.Queue[tuple[Any, Any]]
    grpc_clients: list[grpcclient.InferenceServerClient]
    stream_client: grpcclient.InferenceServerClient
    pool: ThreadPoolExecutor


def put_in_flight(served: Served) -> InFlight:
    """Sixteen requests held by the gate: HTTP, gRPC unary, and a gRPC stream."""
    pool = ThreadPoolExecutor(HTTP_REQUESTS)

    def post(value: int) -> requests.Response:
        # Its own connection each (a session per request).
        with requests.Session() as session:
            return session.post(
                f"{served.http}/v2/models/gate/infer", json=infer_body(value), timeout=PATIENCE
            )

    http = [pool.submit(post, value) for value in range(HTTP_REQUESTS)]
    answers: queue.Queue[tuple[int, Any, Any]] = queue.Queue()
    # A connection each (grpcio shares one between channels unless told not to), so that
    # with several front ends the calls are spread over them: each front end must hold its
    # own calls until they are answered, whatever the others do.
    grpc_clients = [
        grpcclient.InferenceServerClient(served.grpc, channel_args=OWN_CONNECTION)
        for _ in range(GRPC_REQUESTS)
    ]
    for value, client in enumerate(grpc_clients, start=100):
        client.async_infer(
            "gate",
            grpc_inputs(value),
            lambda result, error, value=value: answers.put((value, result, error)),
        )
    streamed: queue.Queue[tuple[Any, Any]] = queue.Queue()
    stream_client = grpcclient.InferenceServerClient(served.grpc)
    stream_client.start_stream(lambda result, error: streamed.put((result, error)))
    for value in range(200, 200 + STREAM_REQUESTS):
        stream_client.async_stream_infer("gate", grpc_inputs(value), request_id=str(value))
    wait_for(lambda: pending(served) == IN_FLIGHT, served, f"{IN_FLIGHT} pending requests")
    return InFlight(http, answers, streamed, grpc_clients, stream_client, pool)


# Each serving process's line once its listeners are up.
LISTENING = "Started GRPCInferenceService at"
DRAINING = "in flight may finish within"  # each front end's line when its drain begins


def signal_and_wait_for_drain(served: Served, group: bool = False) -> None:
    """SIGTERM to the server's process, or to its whole process group (python model
    processes and the engine included)."""
    if group:
        os.killpg(served.process.pid, signal.SIGTERM)
    else:
        served.process.send_signal(signal.SIGTERM)
    wait_for(
        lambda: served.output().count(DRAINING) == served.front_ends,
        served,
        "every front end's drain begin",
    )


def ports_free(served: Served) -> None:
    """Nothing listens on the server's ports, and a new server could bind them (as servers do,
    with SO_REUSEADDR: the closed connections' TIME_WAIT remains)."""
    for port in (served.http_port, served.grpc_port, served.metrics_port):
        with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port)):
            pass
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", port))


@pytest.mark.parametrize(
    "kind",
    [
        "serve-2",
        "serve-1",
        "serve-0",
        "serve-1-hypercorn",
        "hypercorn",
        "hypercorn-2",
        "serve-2-group",
        "serve-1-group",
        "serve-0-group",
    ],
)
def test_sigterm_lets_every_admitted_request_finish(
    kind: str, tmp_path: Path, cleanup: list[Served]
) -> None:
    # "-group": the signal goes to the whole process group; the python model processes in it
    # must not die of it mid-request.
    group = kind.endswith("-group")
    kind = kind.removesuffix("-group")
    served = start(tmp_path, kind)
    cleanup.append(served)
    # A kept-alive connection, used once before the signal.
    kept = http.client.HTTPConnection("127.0.0.1", served.http_port, timeout=PATIENCE)
    kept.request("GET", "/v2/health/live")
    live = kept.getresponse()
    live.read()
    assert live.status == 200
    flight = put_in_flight(served)

    signal_and_wait_for_drain(served, group)

    # New requests are refused, with the message.
    with pytest.raises(InferenceServerException) as refused:
        flight.grpc_clients[0].infer("gate", grpc_inputs(7))
    assert refused.value.status() == "StatusCode.UNAVAILABLE"
    assert SHUTTING_DOWN in refused.value.message()
    with grpcclient.InferenceServerClient(served.grpc) as fresh:
        with pytest.raises(InferenceServerException) as refused:
            fresh.infer("gate", grpc_inputs(8))
        assert refused.value.status() == "StatusCode.UNAVAILABLE"
    if kind.startswith("hypercorn"):
        # hypercorn's worker is stopped by its parent, which closes its HTTP listener and idle
        # connections at once (docs/shutdown.md: a new connection waits in the backlog of the
        # parent's copy of the listening socket until the server exits). The kept-alive
        # connection is closed, unless the request reached the app first.
        try:
            kept.request("POST", "/v2/models/gate/infer", body=json.dumps(infer_body(10)))
            answer = kept.getresponse()
        except (http.client.HTTPException, OSError):
            pass
        else:
            assert answer.status == 503
            assert SHUTTING_DOWN in json.loads(answer.read())["error"]
    else:
        fresh_http = requests.post(
            f"{served.http}/v2/models/gate/infer", json=infer_body(9), timeout=30
        )
        assert fresh_http.status_code == 503
        assert SHUTTING_DOWN in fresh_http.json()["error"]
        assert fresh_http.headers["connection"] == "close"
        kept.request("POST", "/v2/models/gate/infer", body=json.dumps(infer_body(10)))
        answer = kept.getresponse()
        assert answer.status == 503
        assert SHUTTING_DOWN in json.loads(answer.read())["error"]
        assert answer.getheader("connection") == "close"
    kept.close()
    # A request sent on the open stream is refused the same way (its refusal comes after the
    # answers of the stream's requests before it: a stream answers in order, as Triton's);
    # the stream stays open.
    flight.stream_client.async_stream_infer("gate", grpc_inputs(11), request_id="11")
    # Nothing new was admitted.
    assert pending(served) == IN_FLIGHT

    served.gate.touch()
    for value, future in enumerate(flight.http):
        response = future.result(timeout=PATIENCE)
        assert response.status_code == 200, response.text
        assert response.json()["outputs"][0]["data"] == [value]
    for _ in range(GRPC_REQUESTS):
        value, result, error = flight.grpc.get(timeout=PATIENCE)
        assert error is None, error
        assert result.as_numpy("Y").tolist() == [value]
    for _ in range(STREAM_REQUESTS):
        result, error = flight.stream.get(timeout=PATIENCE)
        assert error is None, error
        assert result.as_numpy("Y").tolist() == [int(result.get_response().id)]
    result, error = flight.stream.get(timeout=PATIENCE)  # the refusal of "11"
    assert result is None and SHUTTING_DOWN in error.message(), (result, error)
    # Its requests answered, the server ends the stream (the client need not) and exits.
    result, error = flight.stream.get(timeout=PATIENCE)
    assert result is None, result
    assert error.status() == "StatusCode.UNAVAILABLE" and SHUTTING_DOWN in error.message()
    assert served.process.wait(timeout=PATIENCE) == 0, served.output()
    # The model's finalize ran before the server's process ended (with front ends, the last
    # one waits for the engine to stop its models). hypercorn's parent stops its other workers
    # as soon as one has ended, and exits: its engine, not tied to it, finalizes on its own.
    finalized = served.gate.with_name("gate-open.finalized")
    if kind == "hypercorn-2":
        wait_for(finalized.exists, served, "the engine's finalize of the model")
    assert finalized.exists(), served.output()
    flight.stream_client.stop_stream()
    flight.stream_client.close()
    for client in flight.grpc_clients:
        client.close()
    flight.pool.shutdown()
    ports_free(served)
    assert "Traceback" not in served.output(), served.output()


# "hypercorn-2": its engine is not tied to the server's process, and stops a model stuck in a
# request after the front ends have left: the ports must be closed by then all the same.
@pytest.mark.parametrize("kind", ["serve-0-hypercorn", "serve-1", "serve-2", "hypercorn-2"])
def test_the_exit_timeout_ends_what_is_left_with_a_clear_error(
    kind: str, tmp_path: Path, cleanup: list[Served]
) -> None:
    # The gate never opens.
    served = start(tmp_path, kind, exit_timeout=2)
    cleanup.append(served)
    flight = put_in_flight(served)

    signal_and_wait_for_drain(served)

    for future in flight.http:
        response = future.result(timeout=PATIENCE)
        assert response.status_code == 503, response.text
        error = response.json()["error"]
        assert SHUTTING_DOWN in error and "exit timeout (2 s)" in error, error
    for _ in range(GRPC_REQUESTS):
        _, result, error = flight.grpc.get(timeout=PATIENCE)
        assert result is None
        assert error.status() == "StatusCode.UNAVAILABLE", error
        assert "exit timeout (2 s)" in error.message(), error
    result, error = flight.stream.get(timeout=PATIENCE)
    assert result is None
    assert error.status() == "StatusCode.UNAVAILABLE", error
    assert "exit timeout (2 s)" in error.message(), error
    flight.stream_client.stop_stream()
    flight.stream_client.close()
    for client in flight.grpc_clients:
        client.close()
    flight.pool.shutdown()
    assert served.process.wait(timeout=PATIENCE) == 0, served.output()
    ports_free(served)
