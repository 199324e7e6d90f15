"""Lifecycle extras against a real server: lazy loading, the memory budget, memory released by
unload over repeated cycles, and readiness."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import SIMPLE_CONFIG, write_config
from tests.onnx_models import add_constant_model, add_sub_model
from tests.server_process import ServerProcess, start_server, wait_for
from tritonactor.control.budget import process_tree_rss

STUB = "tritonactor.backends.python.stub"  # a python model's process
PYTHON_MODELS = Path(__file__).resolve().parents[1] / "python_models"


def infer(client: httpclient.InferenceServerClient, model: str) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(a)
    np.testing.assert_array_equal(client.infer(model, inputs).as_numpy("OUTPUT1"), a - a)


def infer_python(client: httpclient.InferenceServerClient, model: str) -> None:
    a = np.arange(4, dtype=np.float32)
    inputs = [httpclient.InferInput(n, [4], "FP32") for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(a)
    np.testing.assert_array_equal(client.infer(model, inputs).as_numpy("OUTPUT0"), a + a)


def events(base: str) -> list[dict[str, object]]:
    return httpx.get(f"{base}/v2/repository/events?limit=1000").json()["events"]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lifecycle") / "models"
    for name in ("first", "second"):
        add_sub_model(root / name / "1" / "model.onnx")
        write_config(root / name, SIMPLE_CONFIG.format(name=name, max_batch_size=8))
    # ~40 MB of weights, so that a leak of one copy per cycle would show.
    weights = np.random.default_rng(0).random(10_000_000).astype(np.float32)
    add_constant_model(root / "heavy" / "1" / "model.onnx", weights, batch=False)
    shutil.copytree(PYTHON_MODELS / "add_sub", root / "pyadd")
    (root / "pyadd" / "config.pbtxt").write_text(
        (root / "pyadd" / "config.pbtxt").read_text().replace('"add_sub"', '"pyadd"')
    )
    return root


def test_lazy_loading_loads_on_the_first_request(repo: Path, tmp_path: Path) -> None:
    server = start_server([repo], tmp_path, {"TRITONACTOR_LAZY_LOAD": "true"})
    try:
        client = httpclient.InferenceServerClient(server.url)
        assert client.is_server_ready()  # nothing is due before its first request
        assert not client.is_model_ready("first")
        infer(client, "first")  # waits for the load
        assert client.is_model_ready("first")
        assert not client.is_model_ready("second")
        requested = [e for e in events(server.base) if e["type"] == "LoadRequested"]
        assert [(e["model"], e["fields"]["source"]) for e in requested] == [("first", "request")]
        with pytest.raises(InferenceServerException, match="unknown model: 'nosuch'"):
            infer(client, "nosuch")
    finally:
        server.stop()


def test_lazy_loading_loads_a_model_a_bls_call_asks_for(repo: Path, tmp_path: Path) -> None:
    root = tmp_path / "models"
    shutil.copytree(repo / "pyadd", root / "pyadd")
    shutil.copytree(PYTHON_MODELS / "bls", root / "bls")
    server = start_server([root], tmp_path, {"TRITONACTOR_LAZY_LOAD": "true"})
    try:
        client = httpclient.InferenceServerClient(server.url)
        a = np.arange(4, dtype=np.float32)
        inputs = [httpclient.InferInput(n, [4], "FP32") for n in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(a)
        # bls loads on this request, and its BLS call loads pyadd (it was refused "not ready")
        result = client.infer("bls", inputs, parameters={"model": "pyadd"})
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)
        assert client.is_model_ready("pyadd")
    finally:
        server.stop()


def test_the_memory_budget_refuses_a_load_that_exceeds_it(repo: Path, tmp_path: Path) -> None:
    heavy = sum(f.stat().st_size for f in (repo / "heavy").rglob("*") if f.is_file())
    env = {
        "TRITONACTOR_MODEL_CONTROL_MODE": "explicit",
        "TRITONACTOR_LOAD_MODEL": "first",
        "TRITONACTOR_MEMORY_BUDGET": str(heavy // 2),
    }
    server = start_server([repo], tmp_path, env)
    try:
        client = httpclient.InferenceServerClient(server.url)
        infer(client, "first")
        with pytest.raises(InferenceServerException, match="TRITONACTOR_MEMORY_BUDGET"):
            client.load_model("heavy")
        assert not client.is_model_ready("heavy")
        assert client.is_model_ready("first")
        index = httpx.post(f"{server.base}/v2/repository/index", json={}).json()
        entry = next(e for e in index if e["name"] == "heavy")
        assert entry["state"] == "UNAVAILABLE" and "estimated" in entry["reason"]
    finally:
        server.stop()


def test_memory_stays_flat_over_load_unload_cycles(repo: Path, tmp_path: Path) -> None:
    env = {"TRITONACTOR_MODEL_CONTROL_MODE": "explicit", "TRITONACTOR_LOAD_MODEL": "first"}
    server = start_server([repo], tmp_path, env)
    try:
        client = httpclient.InferenceServerClient(server.url)
        pid = server.process.pid

        def cycle() -> None:
            for model in ("heavy", "pyadd"):
                client.load_model(model)
                assert client.is_model_ready(model)
            infer_python(client, "pyadd")
            assert any(STUB in line for line in _descendants(pid))
            for model in ("heavy", "pyadd"):
                client.unload_model(model)

        for _ in range(3):  # allocator pools and imports settle first
            cycle()
        settled = process_tree_rss(pid)
        for _ in range(17):
            cycle()
        grown = process_tree_rss(pid) - settled
        # One leaked copy of `heavy` would be 40 MB a cycle (680 MB over 17 cycles).
        assert grown < 60_000_000, f"RSS grew by {grown / 1e6:.0f} MB over 17 cycles"
        # Every python model process ended with its unload.
        assert not [line for line in _descendants(pid) if STUB in line]
    finally:
        server.stop()


def _descendants(pid: int) -> list[str]:
    """The command lines of every process below `pid`."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent = int(stat[stat.rfind(")") + 2 :].split()[1])
            parents.setdefault(parent, []).append(int(entry.name))
    found, stack = [], list(parents.get(pid, ()))
    while stack:
        child = stack.pop()
        try:
            found.append(
                (Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ")).decode()
            )
        except OSError:
            continue
        stack.extend(parents.get(child, ()))
    return found


CYCLIC = """
name: "{name}"
platform: "ensemble"
max_batch_size: 0
input [ {{ name: "X" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_INT32 dims: [ 1 ] }} ]
ensemble_scheduling {{ step [ {{ model_name: "{other}"
  input_map {{ key: "X" value: "X" }} output_map {{ key: "Y" value: "Y" }} }} ] }}
"""


def test_ensembles_that_name_each_other_fail_to_load_instead_of_hanging(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    for name, other in (("ring_a", "ring_b"), ("ring_b", "ring_a")):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(CYCLIC.format(name=name, other=other))
    add_sub_model(repo / "first" / "1" / "model.onnx")
    write_config(repo / "first", SIMPLE_CONFIG.format(name="first", max_batch_size=8))
    server = start_server(
        [repo], tmp_path, {"TRITONACTOR_EXIT_ON_ERROR": "false"}, wait_ready=False, timeout=30
    )
    try:
        client = httpclient.InferenceServerClient(server.url)
        deadline = time.monotonic() + 20
        while not client.is_model_ready("first") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert client.is_model_ready("first")  # the startup finished
        index = httpx.post(f"{server.base}/v2/repository/index", json={}).json()
        reasons = {e["name"]: e.get("reason", "") for e in index}
        assert "depends on itself" in reasons["ring_a"], reasons
        assert "depends on itself" in reasons["ring_b"], reasons
        # Refused before any version was tried: no version to wait for (Triton's rule).
        assert client.is_server_ready()
    finally:
        server.stop()


STUCK = """
import time


class TritonPythonModel:
    def initialize(self, args):
        while True:  # never returns
            time.sleep(0.05)

    def execute(self, requests):
        return []
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def test_a_model_whose_initialize_never_returns_does_not_hold_the_server_s_exit(
    tmp_path: Path,
) -> None:
    """Stopped while its start waits for the model, the server ends, its engine and the model's
    process with it (the engine waited for `initialize` for ever, outliving the server and
    holding its ports)."""
    root = tmp_path / "models"
    (root / "stuck" / "1").mkdir(parents=True)
    (root / "stuck" / "1" / "model.py").write_text(STUCK)
    write_config(
        root / "stuck",
        'name: "stuck"\nbackend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]\n',
    )
    env = {"TRITONACTOR_EXIT_TIMEOUT_SECS": "2"}
    server = start_server([root], tmp_path, env, wait_live=False)  # (it never is)
    try:
        wait_for(lambda: any("--name stuck_0" in c for _, c in _server_processes(server)), 60)
        pids = [pid for pid, _ in _server_processes(server)]
    finally:
        server.stop(timeout=10)  # (hypercorn waits for the app's start: killed then)
    assert len(pids) >= 2  # at least the engine and the model's process
    wait_for(lambda: not any(_alive(pid) for pid in pids), 60)


def _server_processes(server: ServerProcess) -> list[tuple[int, str]]:
    """The processes of `server` (its own environment says so: the engine is started apart
    from hypercorn's processes), with their command lines."""
    port = f"TRITONACTOR_HTTP_PORT={server.http_port}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if port not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if _alive(int(entry.name)):
            found.append((int(entry.name), command))
    return found
