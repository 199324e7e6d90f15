"""Model control modes at startup: explicit loads TRITONACTOR_LOAD_MODEL and lists the rest."""

from __future__ import annotations

from pathlib import Path

import httpx
import tritonclient.http as httpclient

from tests.server_process import start_server


def test_explicit_mode_loads_only_the_listed_models(repository: Path, tmp_path: Path) -> None:
    server = start_server(
        [repository],
        tmp_path,
        {
            "TRITONACTOR_MODEL_CONTROL_MODE": "explicit",
            "TRITONACTOR_LOAD_MODEL": "simple,nosuch",
            "TRITONACTOR_EXIT_ON_ERROR": "false",
        },
        wait_ready=False,
    )
    try:
        client = httpclient.InferenceServerClient(server.url)
        assert client.is_model_ready("simple")
        assert not client.is_model_ready("simple_nobatch")
        index = httpx.post(f"{server.base}/v2/repository/index", json={}).json()
        by_name = {entry["name"]: entry for entry in index}
        assert by_name["simple"]["state"] == "READY"
        # Known on disk, never asked for: listed by name only, as Triton does.
        assert by_name["simple_nobatch"] == {"name": "simple_nobatch"}
        assert by_name["nosuch"]["reason"] == "model 'nosuch' is not in any model repository"
    finally:
        server.stop()
