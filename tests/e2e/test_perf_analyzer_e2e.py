"""perf_analyzer against the real server, as the README promises and bench/ relies on: it reads
the model's config and metadata, then measures over HTTP (binary tensors) and gRPC. It runs where
`deploy/install-perf-analyzer.sh` installed it (CI runs that script) and skips elsewhere."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import SIMPLE_CONFIG, write_config
from tests.onnx_models import add_sub_model
from tests.server_process import ServerProcess, start_server

pytestmark = pytest.mark.e2e

INSTALLED = Path.home() / ".cache" / "tritonactor" / "perf-analyzer" / "bin" / "perf_analyzer"


def perf_analyzer() -> str | None:
    """PERF_ANALYZER, the installer's place, or one on PATH."""
    for candidate in (
        os.environ.get("PERF_ANALYZER"),
        str(INSTALLED),
        shutil.which("perf_analyzer"),
    ):
        if candidate and os.access(candidate, os.X_OK):
            version = subprocess.run([candidate, "--version"], capture_output=True, text=True)
            if "Perf Analyzer" in version.stdout + version.stderr:
                return candidate  # not pip's 2 kB placeholder
    return None


BINARY = perf_analyzer()
needs_perf_analyzer = pytest.mark.skipif(
    BINARY is None, reason="perf_analyzer is not installed (deploy/install-perf-analyzer.sh)"
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("perf_analyzer")
    add_sub_model(root / "models" / "simple" / "1" / "model.onnx")
    write_config(root / "models" / "simple", SIMPLE_CONFIG.format(name="simple", max_batch_size=8))
    process = start_server([root / "models"], root)
    yield process
    process.stop()


@needs_perf_analyzer
@pytest.mark.parametrize("protocol", ["http", "grpc", "grpc-streaming"])
def test_perf_analyzer_measures_the_server(server: ServerProcess, protocol: str) -> None:
    """Over HTTP, unary gRPC calls, and one gRPC stream per client (`--streaming`, as
    bench/process_cpu.py measures streams)."""
    assert BINARY is not None
    url = server.url if protocol == "http" else server.grpc_url
    # A count of requests per window, not a time: the run ends on requests answered, however
    # busy the machine; stability 100% accepts the first windows.
    command = [
        BINARY, "-m", "simple", "-u", url, "-i", protocol.removesuffix("-streaming"),
        "--concurrency-range", "2",
        "--measurement-mode", "count_windows", "--measurement-request-count", "50",
        "-s", "100", "--max-trials", "3",
    ]  # fmt: skip
    if protocol.endswith("-streaming"):
        command.append("--streaming")
    run = subprocess.run(command, capture_output=True, text=True, timeout=300)

    assert run.returncode == 0, run.stdout + run.stderr
    throughput = re.search(r"Concurrency: 2, throughput: ([\d.]+) infer/sec", run.stdout)
    assert throughput is not None and float(throughput.group(1)) > 0, run.stdout
    # Every request it sent was answered without error.
    assert "error" not in run.stdout.lower(), run.stdout
