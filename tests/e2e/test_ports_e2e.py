"""Ports (docs/operations.md, "Ports"): a second server started on an address the first one
holds (HTTP, gRPC or metrics) fails with a message naming it and leaves the first one all its
traffic, however either is started (`tritonactor serve` with uvicorn or hypercorn, one or two
front ends, or a plain `hypercorn tritonactor.app:app`); and the three listeners bind one
address by default, whichever way."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.server_process import free_port
from tritonactor.frontends.listen import proc_address

pytestmark = pytest.mark.e2e

MODELS = Path(__file__).resolve().parent.parent / "python_models"
# How a server is started: `tritonactor serve` (ASGI server, front ends) or plain hypercorn.
KINDS = {
    "serve-uvicorn-0": ("serve", "uvicorn", 0),
    "serve-uvicorn-1": ("serve", "uvicorn", 1),
    "serve-uvicorn-2": ("serve", "uvicorn", 2),
    "serve-hypercorn-2": ("serve", "hypercorn", 2),
    "hypercorn-1": ("hypercorn", "hypercorn", 1),
    "hypercorn-2": ("hypercorn", "hypercorn", 2),
}
ENDPOINTS = ("http", "grpc", "metrics")
REQUESTS = 12


@dataclass
class Started:
    """A server process (the leader of its own process group) and its ports."""

    kind: str
    process: subprocess.Popen[bytes]
    ports: dict[str, int]
    log_path: Path
    scheme: str = "http"
    verify: object = True

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.ports['http']}"

    @property
    def base(self) -> str:
        return f"{self.scheme}://{self.url}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.ports['grpc']}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 120, **client: object) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"{self.kind} exited {self.process.returncode}:\n{self.log()}")
            with contextlib.suppress(httpx.HTTPError):
                answer = httpx.get(f"{self.base}/v2/health/ready", timeout=2, **client)
                if answer.status_code == 200:
                    return
            time.sleep(0.1)
        raise AssertionError(f"{self.kind} did not become ready:\n{self.log()}")

    def wait_exit(self, timeout: float = 120) -> int:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            stop(self)
            raise AssertionError(f"{self.kind} did not stop:\n{self.log()}") from None


def repository(root: Path) -> Path:
    repo = root / "repo"
    if not repo.exists():
        shutil.copytree(MODELS / "add_sub", repo / "add_sub")
    return repo


def launch(
    kind: str,
    root: Path,
    ports: Mapping[str, int] | None = None,
    env: Mapping[str, str] | None = None,
    flags: tuple[str, ...] = (),
    hypercorn_flags: tuple[str, ...] = (),
    host: str | None = "127.0.0.1",
    name: str = "server",
) -> Started:
    """Start a server the `kind` way on `ports` (free ones by default) with settings `env`
    (TRITONACTOR_*); `flags` go to `tritonactor serve`, `hypercorn_flags` to hypercorn.
    `host`: every listener's address (None: say none, so each takes its default)."""
    how, asgi, workers = KINDS[kind]
    given = dict(ports or {})
    chosen = {name: given[name] if name in given else free_port() for name in ENDPOINTS}
    variables = {k: v for k, v in os.environ.items() if not k.startswith(("TRITONACTOR_", "TA_"))}
    variables.update(
        {
            "TRITONACTOR_MODEL_REPOSITORY": str(repository(root)),
            "TRITONACTOR_JOURNAL": str(root / f"journal-{name}.jsonl"),
            "TRITONACTOR_GRPC_PORT": str(chosen["grpc"]),
            "TRITONACTOR_METRICS_PORT": str(chosen["metrics"]),
        }
    )
    if host is not None:
        variables["TRITONACTOR_GRPC_HOST"] = host
        variables["TRITONACTOR_METRICS_HOST"] = host
    variables.update(env or {})
    if how == "serve":
        command = [sys.executable, "-m", "tritonactor.cli", "serve", f"--workers={workers}"]
        command += [f"--asgi-server={asgi}", f"--http-port={chosen['http']}"]
        if host is not None:
            command.append(f"--http-address={host}")
        command += flags
    else:
        command = [sys.executable, "-m", "hypercorn", "tritonactor.app:app"]
        command += ["--bind", f"{host or '127.0.0.1'}:{chosen['http']}", "--workers", str(workers)]
        command += hypercorn_flags
    log_path = root / f"{name}.log"
    with log_path.open("wb") as out:
        process = subprocess.Popen(
            command, env=variables, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    return Started(kind, process, chosen, log_path)


def stop(started: Started) -> None:
    """SIGTERM to the server's process group, as a process manager sends it; SIGKILL to what
    is left of it after a minute."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(started.process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        started.process.wait(60)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            os.killpg(started.process.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(started.process.pid, signal.SIGKILL)
    started.process.wait()


def inference_count(started: Started) -> int:
    stats = httpx.get(f"{started.base}/v2/models/add_sub/stats", timeout=10).json()
    return stats["model_stats"][0]["inference_count"]


def infer_each_way(started: Started, count: int) -> None:
    """`count` requests over HTTP and `count` over gRPC, each on a new connection (a new
    connection is where a server sharing the port would take its part)."""
    body = {
        "inputs": [
            {"name": name, "datatype": "FP32", "shape": [4], "data": [1.0, 2.0, 3.0, 4.0]}
            for name in ("INPUT0", "INPUT1")
        ]
    }
    for _ in range(count):
        with httpx.Client(timeout=30) as client:
            answer = client.post(f"{started.base}/v2/models/add_sub/infer", json=body)
        assert answer.status_code == 200, answer.text
        assert answer.json()["outputs"][0]["data"] == [2.0, 4.0, 6.0, 8.0]
    data = np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32)
    for _ in range(count):
        client = grpcclient.InferenceServerClient(started.grpc_url)
        inputs = []
        for name in ("INPUT0", "INPUT1"):
            tensor = grpcclient.InferInput(name, [4], "FP32")
            tensor.set_data_from_numpy(data)
            inputs.append(tensor)
        result = client.infer("add_sub", inputs)
        client.close()
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data * 2)


@pytest.fixture(scope="module", params=list(KINDS))
def first(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    root = tmp_path_factory.mktemp(request.param)
    started = launch(request.param, root, name="first")
    try:
        started.wait_ready()
        yield started, root
    finally:
        stop(started)


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_a_second_server_on_a_taken_port_fails_naming_it(
    first: tuple[Started, Path], endpoint: str
) -> None:
    server, root = first
    before = inference_count(server)
    port = server.ports[endpoint]
    second = launch(server.kind, root, ports={endpoint: port}, name=f"second-{endpoint}")
    code = second.wait_exit()
    log = second.log()
    label = {"http": "HTTP", "grpc": "gRPC", "metrics": "metrics"}[endpoint]
    if (server.kind, endpoint) == ("hypercorn-1", "http"):
        # A plain hypercorn with one worker binds HTTP itself, before the app exists, without
        # SO_REUSEPORT: its own error (docs/operations.md, "Ports").
        assert "OSError: [Errno 98] Address already in use" in log, log
    else:
        assert f"{label}: cannot listen on 127.0.0.1:{port}: address already in use" in log, log
    if server.kind.startswith("serve") or (server.kind, endpoint) == ("hypercorn-1", "http"):
        # A plain hypercorn whose worker fails exits 0 (hypercorn 0.18 keeps the status of
        # the workers it stopped last): `tritonactor serve` exits non-zero (docs/operations.md).
        assert code != 0, log
    # The first server still takes every connection and answers every request.
    infer_each_way(server, REQUESTS)
    assert inference_count(server) == before + 2 * REQUESTS
    metrics = httpx.get(f"http://127.0.0.1:{server.ports['metrics']}/metrics", timeout=10)
    assert metrics.status_code == 200
    assert f'nv_inference_count{{model="add_sub",version="1"}} {before + 2 * REQUESTS}' in (
        metrics.text
    )


def listening_addresses(port: int) -> set[str]:
    """The addresses of the sockets that listen on `port` (from /proc/net/tcp and tcp6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, _, hex_port = fields[1].partition(":")
            if fields[3] == "0A" and int(hex_port, 16) == port:
                found.add(str(proc_address(address)))
    return found


@pytest.mark.parametrize("kind", ["serve-uvicorn-1", "serve-uvicorn-2", "hypercorn-2"])
def test_the_three_listeners_bind_the_http_address_by_default(kind: str, tmp_path: Path) -> None:
    # No address given for gRPC and metrics: each takes the HTTP one (tritonactor serve's
    # default, 0.0.0.0; hypercorn's --bind, here 127.0.0.1).
    started = launch(kind, tmp_path, host=None)
    try:
        started.wait_ready()
        expected = "0.0.0.0" if kind.startswith("serve") else "127.0.0.1"
        for endpoint in ENDPOINTS:
            assert listening_addresses(started.ports[endpoint]) == {expected}, endpoint
    finally:
        stop(started)


def group_listening(leader: int) -> dict[int, set[int]]:
    """The ports the sockets of process group `leader`'s processes listen on, by process."""
    inodes: dict[str, set[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            if int(stat.read_text().rpartition(")")[2].split()[2]) != leader:
                continue
            pid = int(stat.parent.name)
            for fd in (stat.parent / "fd").iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target.startswith("socket:["):
                        inode = target.removeprefix("socket:[").removesuffix("]")
                        inodes.setdefault(inode, set()).add(pid)
    found: dict[int, set[int]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:
                port = int(fields[1].partition(":")[2], 16)
                for pid in inodes[fields[9]]:
                    found.setdefault(pid, set()).add(port)
    return found


def wait_serving_on_chosen_ports(started: Started) -> set[int]:
    """Wait until the server (all its ports 0) serves HTTP; the ports its processes listen on."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if started.process.poll() is not None:
            raise AssertionError(f"exited {started.process.returncode}:\n{started.log()}")
        # The ASGI server's parent (the group's leader) holds the HTTP socket.
        http = group_listening(started.process.pid).get(started.process.pid, set())
        if http:
            started.ports["http"] = min(http)
            started.wait_ready()
            return set().union(*group_listening(started.process.pid).values())
        time.sleep(0.1)
    raise AssertionError(f"no HTTP socket:\n{started.log()}")


@pytest.mark.parametrize("kind", ["serve-uvicorn-2", "serve-hypercorn-2", "hypercorn-2"])
def test_two_servers_on_port_0_each_have_their_own_engine_and_sockets(
    kind: str, tmp_path: Path
) -> None:
    # The same command twice (one journal, one repository, every port 0): two servers, not the
    # second's front ends joining the first's engine and accepting on its gRPC socket.
    zero = {name: 0 for name in ENDPOINTS}
    same = {"TRITONACTOR_JOURNAL": str(tmp_path / "journal.jsonl")}
    one = launch(kind, tmp_path, ports=zero, env=same, name="same")
    two = None
    try:
        ports_one = wait_serving_on_chosen_ports(one)
        two = launch(kind, tmp_path, ports=zero, env=same, name="same-again")
        ports_two = wait_serving_on_chosen_ports(two)
        assert len(ports_one) == len(ports_two) == 3, (ports_one, ports_two)  # HTTP, gRPC, metrics
        assert not ports_one & ports_two, (ports_one, ports_two)
        for started in (one, two):
            ready = httpx.get(f"{started.base}/v2/models/add_sub/ready", timeout=10)
            assert ready.status_code == 200
    finally:
        if two is not None:
            stop(two)
        stop(one)


HELD_MODEL = """
import os
import time
from pathlib import Path

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        gate = Path(os.environ["HELD_GATE"])
        (gate / "initializing").touch()
        while not (gate / "go").exists():  # the test lets it go
            time.sleep(0.05)

    def execute(self, requests):
        return [pb_utils.InferenceResponse([]) for _ in requests]
"""


@pytest.mark.parametrize("kind", ["serve-uvicorn-1", "serve-uvicorn-0", "hypercorn-2"])
def test_grpc_refuses_connections_until_the_models_have_loaded(kind: str, tmp_path: Path) -> None:
    """As tritonserver's endpoints, which open once its models have loaded: while a model of
    the startup load is in `initialize`, a gRPC connection is refused (it was taken, and then
    answered nothing until the load ended), and so are the metrics' and `tritonactor serve`'s
    HTTP; then gRPC serves."""
    repo = repository(tmp_path)
    (repo / "held" / "1").mkdir(parents=True)
    (repo / "held" / "config.pbtxt").write_text('name: "held"\nbackend: "python"\n')
    (repo / "held" / "1" / "model.py").write_text(HELD_MODEL)
    gate = tmp_path / "gate"
    gate.mkdir()
    started = launch(kind, tmp_path, env={"HELD_GATE": str(gate)})
    try:
        deadline = time.monotonic() + 120
        while not (gate / "initializing").exists():
            assert started.process.poll() is None, started.log()
            assert time.monotonic() < deadline, started.log()
            time.sleep(0.1)
        # (a plain hypercorn's HTTP port is hypercorn's, listening from its start: docs)
        endpoints = ("http", "grpc", "metrics") if kind.startswith("serve") else ("grpc", "metrics")
        for endpoint in endpoints:
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", started.ports[endpoint]), timeout=10)
        (gate / "go").touch()
        started.wait_ready()
        client = grpcclient.InferenceServerClient(started.grpc_url)
        try:
            assert client.is_server_ready() and client.is_model_ready("held")
        finally:
            client.close()
    finally:
        stop(started)
