"""The event loop a front end runs on: uvloop's under `tritonactor serve` (uvicorn's `--loop
uvloop`) and under a plain `hypercorn tritonactor.app:app` (the app chooses it where hypercorn's
command line leaves the worker class to its default), the one hypercorn's command line names
otherwise. Each front end says which in its log."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.e2e.test_http_smoke import simple_inputs
from tests.server_process import ServerProcess, start_serve, start_server, wait_for

UVLOOP = "serves on the event loop uvloop.Loop"
ASYNCIO = "serves on the event loop asyncio.unix_events._UnixSelectorEventLoop"


def _infers(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.url)
    wait_for(lambda: client.is_model_ready("simple"), 60, server.log)
    result = client.infer("simple", simple_inputs())
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + 3)


def test_a_plain_hypercorn_serves_on_uvloop(server: ServerProcess) -> None:
    _infers(server)
    log = server.log()
    assert UVLOOP in log, log
    assert ASYNCIO not in log


@pytest.mark.parametrize(
    ("args", "expected"),
    [(["-k", "asyncio"], ASYNCIO), (["--worker-class=uvloop"], UVLOOP)],
)
def test_a_worker_class_named_is_hypercorns(
    repository: Path, tmp_path: Path, args: list[str], expected: str
) -> None:
    # (The repository has a broken model: the server is live, never ready, as the fixture's.)
    settings = {"TRITONACTOR_EXIT_ON_ERROR": "false"}
    server = start_server([repository], tmp_path, settings, wait_ready=False, args=args)
    try:
        _infers(server)
        log = server.log()
        assert expected in log, log
        assert (UVLOOP if expected == ASYNCIO else ASYNCIO) not in log
    finally:
        server.stop()


def test_serves_front_end_serves_on_uvloop(repository: Path, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(repository / "simple", repo / "simple")
    server = start_serve(tmp_path, {}, "--workers", "1", "--model-repository", str(repo))
    try:
        _infers(server)
        log = server.log()
        assert UVLOOP in log, log
        assert ASYNCIO not in log
    finally:
        server.stop()
