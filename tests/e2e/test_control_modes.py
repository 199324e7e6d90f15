"""Model control modes at startup: none loads everything, explicit loads TRITONACTOR_LOAD_MODEL,
poll is refused until it exists."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import tritonclient.http as httpclient

from tests.server_process import ServerProcess, free_port, start_server


def test_explicit_mode_loads_only_the_listed_models(repository: Path, tmp_path: Path) -> None:
    server = start_server(
        [repository],
        tmp_path,
        {"TRITONACTOR_MODEL_CONTROL_MODE": "explicit", "TRITONACTOR_LOAD_MODEL": "simple,nosuch"},
        wait_ready=False,
    )
    try:
        client = httpclient.InferenceServerClient(server.url)
        assert client.is_model_ready("simple")
        assert not client.is_model_ready("simple_nobatch")
        index = httpx.post(f"{server.base}/v2/repository/index", json={}).json()
        by_name = {entry["name"]: entry for entry in index}
        assert by_name["simple"]["state"] == "READY"
        assert "simple_nobatch" not in by_name  # known on disk, never asked for
        assert by_name["nosuch"]["reason"] == "model 'nosuch' is not in any model repository"
    finally:
        server.stop()


def test_poll_mode_is_refused_with_a_clear_message(repository: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRITONACTOR_")}
    env |= {
        "TRITONACTOR_MODEL_REPOSITORY": str(repository),
        "TRITONACTOR_MODEL_CONTROL_MODE": "poll",
    }
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "hypercorn",
            "tritonactor.app:app",
            "--bind",
            f"127.0.0.1:{free_port()}",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    # hypercorn loads the app in a worker process and exits 0 whatever the worker did; the
    # message and the process ending (rather than serving) are what a user sees.
    assert "TRITONACTOR_MODEL_CONTROL_MODE='poll' is not available" in result.stderr
    serve = subprocess.run(
        [sys.executable, "-m", "tritonactor.cli", "serve", "--model-control-mode=poll"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert serve.returncode == 2
    assert "'poll' is not available" in serve.stderr


def test_load_and_unload_answer_503_in_mode_none(server: ServerProcess) -> None:
    for action in ("load", "unload"):
        response = httpx.post(f"{server.base}/v2/repository/models/simple/{action}", json={})
        assert response.status_code == 503
        assert response.json() == {
            "error": "explicit model load / unload is not allowed if polling is enabled"
        }
    assert httpclient.InferenceServerClient(server.url).is_model_ready("simple")
