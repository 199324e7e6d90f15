"""`tritonactor serve` run with the flags a Triton user passes: it serves, warns about what it
ignores, and honours --exit-on-error, --strict-readiness and --log-info as tritonserver does."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.e2e.conftest import SIMPLE_CONFIG, write_config
from tests.onnx_models import add_sub_model
from tests.server_process import free_port, start_server

PROJECT_ROOT = Path(__file__).resolve().parents[2]
# A line the text log format writes at info level: `I1201 14:06:53.398774 23734 app.py:36] ...`.
INFO_LINE = re.compile(r"^I\d{4} \d\d:\d\d:\d\d\.\d{6} ", re.MULTILINE)


@dataclass
class Served:
    """A `tritonactor serve` process and the ports it was given."""

    process: subprocess.Popen[bytes]
    http_port: int
    grpc_port: int
    metrics_port: int
    log_path: Path

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def get(self, path: str) -> httpx.Response | None:
        try:
            return httpx.get(f"{self.base}{path}", timeout=2)
        except httpx.HTTPError:
            return None

    def wait_for(self, condition: Callable[[], bool], what: str, timeout: float = 90) -> None:
        """Poll `condition` until it holds; fail with the log if the process exits first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return
            if self.process.poll() is not None:
                pytest.fail(
                    f"server exited with {self.process.returncode} before {what}:\n{self.log()}"
                )
            time.sleep(0.1)
        pytest.fail(f"server never got to {what}:\n{self.log()}")

    def answers(self, path: str, status: int = 200) -> bool:
        response = self.get(path)
        return response is not None and response.status_code == status

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., Served]]:
    """Starts `tritonactor serve REPO FLAGS...` on free ports; stops what it started."""
    started: list[Served] = []

    def start(repository: Path, *flags: str) -> Served:
        ports = free_port(), free_port(), free_port()
        run = tmp_path / f"run{len(started)}"
        run.mkdir()
        argv = [
            sys.executable,
            "-m",
            "tritonactor.cli",
            "serve",
            f"--model-repository={repository}",
            "--http-address=127.0.0.1",
            f"--http-port={ports[0]}",
            "--grpc-address",
            "127.0.0.1",
            "--grpc-port",
            str(ports[1]),
            "--metrics-address=127.0.0.1",
            f"--metrics-port={ports[2]}",
            f"--journal={run / 'journal.jsonl'}",
            *flags,
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TRITONACTOR_", "OTEL_"))}
        env["HOME"] = str(run)
        log_path = run / "server.log"
        with log_path.open("wb") as log_file:
            process = subprocess.Popen(
                argv, env=env, stdout=log_file, stderr=subprocess.STDOUT, cwd=PROJECT_ROOT
            )
        served = Served(process, *ports, log_path)
        started.append(served)
        return served

    yield start
    for served in started:
        served.stop()


def repository(root: Path, broken: bool = False) -> Path:
    """`simple` (Triton's add/sub) and, if asked, `broken` (a model file onnxruntime refuses)."""
    repo = root / "models"
    add_sub_model(repo / "simple" / "1" / "model.onnx")
    write_config(repo / "simple", SIMPLE_CONFIG.format(name="simple", max_batch_size=8))
    if broken:
        (repo / "broken" / "1").mkdir(parents=True)
        (repo / "broken" / "1" / "model.onnx").write_bytes(b"this is not an onnx model")
        write_config(repo / "broken", 'name: "broken"\nplatform: "onnxruntime_onnx"\n')
    return repo


def infer_simple(served: Served) -> None:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{served.http_port}")
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.ones((1, 16), dtype=np.int32)
    inputs = [httpclient.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer("simple", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


# Flags a Triton deployment passes that tritonactor accepts and ignores, each with its variable.
IGNORED = {
    "--http-thread-count=4": "TRITONACTOR_HTTP_THREAD_COUNT",
    "--reuse-grpc-port=false": "TRITONACTOR_REUSE_GRPC_PORT",
    "--grpc-infer-allocation-pool-size=16": "TRITONACTOR_GRPC_INFER_ALLOCATION_POOL_SIZE",
    "--id=triton-a": "TRITONACTOR_ID",
    "--model-load-thread-count=2": "TRITONACTOR_MODEL_LOAD_THREAD_COUNT",
    "--pinned-memory-pool-byte-size=268435456": "TRITONACTOR_PINNED_MEMORY_POOL_BYTE_SIZE",
    "--cuda-memory-pool-byte-size=0:67108864": "TRITONACTOR_CUDA_MEMORY_POOL_BYTE_SIZE",
    "--metrics-interval-ms=1000": "TRITONACTOR_METRICS_INTERVAL_MS",
}


def test_a_triton_command_line_serves_and_names_each_flag_it_ignores(
    tmp_path: Path, serve: Callable[..., Served]
) -> None:
    served = serve(
        repository(tmp_path),
        "--backend-config=python,shm-default-byte-size=1048576",
        "--backend-config=default-max-batch-size=8",
        "--exit-timeout-secs=5",
        "--log-verbose=1",
        "--strict-readiness",
        "true",
        "--exit-on-error=true",
        "--disable-auto-complete-config",
        "--allow-cpu-metrics=false",
        "--trace-config",
        "mode=opentelemetry",
        *IGNORED,
    )
    served.wait_for(lambda: served.answers("/v2/health/ready"), "ready")

    infer_simple(served)
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{served.grpc_port}")
    assert grpc.is_server_ready()
    assert grpc.is_model_ready("simple")

    log = served.log()
    warnings = [line for line in log.splitlines() if line.startswith("W")]
    for flag, variable in IGNORED.items():
        name = flag.split("=", 1)[0]
        assert any(f"{name} ({variable}=" in w and "accepted, ignored" in w for w in warnings), (
            flag,
            log,
        )
    # What is honoured is not warned about.
    assert not any("--backend-config" in w or "--exit-timeout-secs" in w for w in warnings)
    assert re.search(r"^\| TRITONACTOR_EXIT_TIMEOUT_SECS +\| 5 +\|$", log, re.M)
    assert "--timeout-graceful-shutdown 5" in log  # --log-verbose: serve prints the uvicorn command

    metrics = httpx.get(f"http://127.0.0.1:{served.metrics_port}/metrics", timeout=10).text
    assert "nv_inference_request_success{" in metrics
    assert "nv_cpu_memory_total_bytes" not in metrics  # --allow-cpu-metrics=false


@pytest.mark.parametrize("workers", [0, 1])
def test_a_journal_that_cannot_be_written_stops_the_start_in_one_line(
    tmp_path: Path, serve: Callable[..., Served], workers: int
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    journal = blocker / "journal.jsonl"  # under a file: no folder can be made
    served = serve(repository(tmp_path), f"--workers={workers}", f"--journal={journal}")
    code = served.process.wait(timeout=120)
    log = served.log()
    assert code == 1, log
    assert log.strip().splitlines()[-1] == (
        f"tritonactor serve: error: cannot open the control-plane journal {journal} for "
        "writing: Not a directory"
    )
    assert "Traceback" not in log


def test_a_plain_hypercorn_says_why_a_journal_that_cannot_be_written_stops_it(
    tmp_path: Path,
) -> None:
    """hypercorn's workers end with the engine that could not open its journal: the log says
    why (it said nothing, and hypercorn's status was 0)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    journal = blocker / "journal.jsonl"
    with pytest.raises(RuntimeError) as stopped:
        start_server(
            [repository(tmp_path)],
            tmp_path,
            {"TRITONACTOR_JOURNAL": str(journal)},
            args=["--workers", "2"],
            timeout=120,
        )
    assert f"cannot open the control-plane journal {journal} for writing: Not a directory" in str(
        stopped.value
    )


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_a_model_that_fails_to_load_stops_the_server_by_default(
    tmp_path: Path, serve: Callable[..., Served], workers: int
) -> None:
    served = serve(repository(tmp_path, broken=True), f"--workers={workers}")
    try:
        code = served.process.wait(timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the server did not stop:\n{served.log()}")
    log = served.log()
    # One process: uvicorn's lifespan fails; with front ends, the engine `tritonactor serve`
    # starts first fails, before any front end.
    assert code != 0, log
    error = next(line for line in log.splitlines() if "at startup" in line)
    assert error.startswith("E")
    assert "'broken'" in error and "TRITONACTOR_EXIT_ON_ERROR=false" in error
    assert "'simple'" not in error
    if workers:  # `tritonactor serve` ends with the engine's reason (it told a task group's)
        last = log.splitlines()[-1]
        assert last.startswith("tritonactor serve: error: failed to load 1 model(s) at startup")


def test_without_exit_on_error_the_other_models_are_served(
    tmp_path: Path, serve: Callable[..., Served]
) -> None:
    served = serve(repository(tmp_path, broken=True), "--exit-on-error=false")
    served.wait_for(lambda: served.answers("/v2/models/simple/ready"), "serving simple")

    infer_simple(served)
    index = httpx.post(f"{served.base}/v2/repository/index", json={}, timeout=10).json()
    broken = next(entry for entry in index if entry["name"] == "broken")
    assert broken["state"] == "UNAVAILABLE" and broken["reason"]
    assert served.answers("/v2/health/ready", 400)  # strict readiness: a model is missing
    assert served.process.poll() is None


def test_without_strict_readiness_a_live_server_is_ready(
    tmp_path: Path, serve: Callable[..., Served]
) -> None:
    served = serve(
        repository(tmp_path, broken=True), "--exit-on-error=false", "--strict-readiness=false"
    )

    def loads_settled() -> bool:
        response = served.get("/v2/models/simple/ready")
        if response is None or response.status_code != 200:
            return False
        index = httpx.post(f"{served.base}/v2/repository/index", json={}, timeout=10).json()
        return any(e["name"] == "broken" and e.get("state") == "UNAVAILABLE" for e in index)

    served.wait_for(loads_settled, "the startup loads' end")

    assert served.answers("/v2/health/ready")
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{served.grpc_port}")
    assert grpc.is_server_ready()
    assert not grpc.is_model_ready("broken")


def test_log_info_false_keeps_info_lines_out_of_the_log(
    tmp_path: Path, serve: Callable[..., Served]
) -> None:
    served = serve(repository(tmp_path), "--log-info=false", "--http-thread-count", "2")
    served.wait_for(lambda: served.answers("/v2/health/ready"), "ready")
    infer_simple(served)

    settings = httpx.get(f"{served.base}/v2/logging", timeout=10).json()
    assert settings["log_info"] is False and settings["log_warning"] is True
    log = served.log()
    # Warnings still reach the log, info lines (the settings, the loads) do not.
    assert "--http-thread-count (TRITONACTOR_HTTP_THREAD_COUNT=2)" in log
    assert not INFO_LINE.search(log), log
