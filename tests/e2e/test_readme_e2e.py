"""The README's commands as a new user runs them: `tritonactor serve` on the bundled example
repository, then the README's own client snippet (read from README.md, so that the two cannot
drift apart); and where a plainly started server binds its three endpoints."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server_process import free_port
from tritonactor.app import hypercorn_bind

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PATIENCE_S = 120


def readme_snippet() -> str:
    """The quick start's Python block: the first ```python block of the README."""
    (block,) = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)[:1]
    return block


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("TRITONACTOR_", "OTEL_"))}


def wait_live(process: subprocess.Popen[bytes], port: int, log: Path) -> None:
    """Poll readiness until the server answers 200 (or exits, or the deadline passes)."""
    deadline = time.monotonic() + PATIENCE_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"server exited with {process.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    pytest.fail(f"server not ready:\n{log.read_text()}")


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """`tritonactor serve` with no repository: the bundled examples (ports moved off 8000-8002
    so that the test can run beside anything; the journal in tmp_path)."""
    http, grpc, metrics = free_port(), free_port(), free_port()
    log = tmp_path / "server.log"
    command = [
        sys.executable,
        "-m",
        "tritonactor.cli",
        "serve",
        f"--http-port={http}",
        f"--grpc-port={grpc}",
        f"--metrics-port={metrics}",
        f"--journal={tmp_path / 'journal.jsonl'}",
    ]
    with log.open("wb") as out:
        process = subprocess.Popen(command, env=clean_env(), stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_live(process, http, log)
        yield http, log
    finally:
        process.terminate()
        process.wait(timeout=60)


def test_the_quick_start_serves_the_bundled_model_to_the_readme_snippet(
    served: tuple[int, Path], tmp_path: Path
) -> None:
    port, _ = served
    snippet = readme_snippet().replace("localhost:8000", f"localhost:{port}")
    script = tmp_path / "snippet.py"
    script.write_text(snippet)

    run = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=PATIENCE_S
    )

    assert run.returncode == 0, run.stderr
    # `simple` adds and subtracts: 0..15 + 1, then 0..15 - 1.
    printed = [int(number) for number in re.findall(r"-?\d+", run.stdout)]
    assert printed == [*range(1, 17), *range(-1, 15)], run.stdout


def test_plain_hypercorn_binds_grpc_and_metrics_where_it_binds_http(tmp_path: Path) -> None:
    http = free_port()
    log = tmp_path / "server.log"
    env = {
        **clean_env(),
        "TRITONACTOR_GRPC_PORT": str(free_port()),
        "TRITONACTOR_METRICS_PORT": str(free_port()),
        "TRITONACTOR_JOURNAL": str(tmp_path / "journal.jsonl"),
    }
    command = [sys.executable, "-m", "hypercorn", "tritonactor.app:app", "--bind"]
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*command, f"127.0.0.1:{http}"], env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        wait_live(process, http, log)
        text = log.read_text()
        # Triton's lines, which scripts wait for.
        assert f"Started HTTPService at 127.0.0.1:{http}" in text, text
        assert f"Started GRPCInferenceService at 127.0.0.1:{env['TRITONACTOR_GRPC_PORT']}" in text
        assert f"Started Metrics Service at 127.0.0.1:{env['TRITONACTOR_METRICS_PORT']}" in text
    finally:
        process.terminate()
        process.wait(timeout=60)


@pytest.mark.parametrize(
    ("argv", "bind"),
    [
        (["/x/hypercorn", "tritonactor.app:app"], ("127.0.0.1", 8000)),
        (["/v/hypercorn/__main__.py", "m:app", "--bind", "0.0.0.0:9000"], ("0.0.0.0", 9000)),
        (["/v/bin/hypercorn", "m:app", "--bind=[::1]:9001"], ("::1", 9001)),
        (["/v/bin/hypercorn", "m:app", "-b", "unix:/s", "-b", "10.0.0.1:7"], ("10.0.0.1", 7)),
        (["/v/bin/hypercorn", "m:app", "-b", "unix:/s"], None),
        (["/v/bin/uvicorn", "m:app"], None),
        (["/v/bin/other/__main__.py", "m:app"], None),
        ([], None),
    ],
)
def test_where_hypercorn_binds_is_read_from_its_command_line(
    argv: list[str], bind: tuple[str, int] | None
) -> None:
    assert hypercorn_bind(argv) == bind
