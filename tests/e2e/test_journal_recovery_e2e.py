"""A journal with a corrupt line in the middle, against the real server in explicit mode: the line
is skipped, reported in the log and kept in `<journal>.rejected`; what the API loaded before and
after it is restored; the model the line was about is shown UNAVAILABLE with the reason, strict
readiness waits for it, and an API load settles it (also for the next restart, though the line
stays where it is: lines are never rewritten)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import SIMPLE_CONFIG, write_config
from tests.onnx_models import add_sub_model
from tests.server_process import ServerProcess, start_server

pytestmark = pytest.mark.e2e

MODELS = ("before", "doubtful", "after")


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    for name in MODELS:
        add_sub_model(root / name / "1" / "model.onnx", batch=True)
        write_config(root / name, SIMPLE_CONFIG.format(name=name, max_batch_size=8))
    return root


@pytest.fixture()
def journal(tmp_path: Path) -> Path:
    return tmp_path / "state" / "journal.jsonl"


@pytest.fixture()
def env(journal: Path) -> dict[str, str]:
    return {"TRITONACTOR_MODEL_CONTROL_MODE": "explicit", "TRITONACTOR_JOURNAL": str(journal)}


def works(client: httpclient.InferenceServerClient, model: str) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [httpclient.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(a)
    np.testing.assert_array_equal(client.infer(model, inputs).as_numpy("OUTPUT0"), a + a)


def index(server: ServerProcess) -> dict[str, dict[str, str]]:
    entries = httpx.post(f"{server.base}/v2/repository/index", json={}, timeout=30).json()
    return {entry["name"]: entry for entry in entries}


def ready(server: ServerProcess) -> int:
    return httpx.get(f"{server.base}/v2/health/ready", timeout=30).status_code


def events(server: ServerProcess) -> list[dict]:
    response = httpx.get(f"{server.base}/v2/repository/events?limit=1000", timeout=30)
    assert response.status_code == 200, response.text
    return response.json()["events"] if isinstance(response.json(), dict) else response.json()


def loaded_then_stopped(repo: Path, tmp_path: Path, env: dict[str, str]) -> None:
    """A server that loads every model through the API, then stops: its journal says so."""
    first = start_server([repo], tmp_path, env)
    try:
        client = httpclient.InferenceServerClient(first.url)
        for name in MODELS:
            client.load_model(name)
    finally:
        first.stop()


def corrupt_load_request(journal: Path, model: str) -> int:
    """Overwrite, in place, eight bytes in the middle of the line that records the API's load of
    `model` (its `versions`, not its name); returns that line's number."""
    data = bytearray(journal.read_bytes())
    start = 0
    for number, line in enumerate(bytes(data).split(b"\n"), start=1):
        if b'"type":"LoadRequested"' in line and f'"model":"{model}"'.encode() in line:
            at = start + line.index(b'"versions"')
            data[at : at + 8] = b"\x00\xff\x00\xff\x00\xff\x00\xff"
            journal.write_bytes(bytes(data))
            return number
        start += len(line) + 1
    raise AssertionError(f"no LoadRequested line for {model}")


@pytest.fixture()
def restarted(
    repo: Path, tmp_path: Path, journal: Path, env: dict[str, str]
) -> Iterator[tuple[ServerProcess, int]]:
    """A server that loaded the three models through the API, stopped; its journal corrupted in
    the line of `doubtful`'s load; a new server started on it."""
    loaded_then_stopped(repo, tmp_path, env)
    line = corrupt_load_request(journal, "doubtful")
    # Not ready (a model it meant to restore could not be): wait until it is live only.
    second = start_server([repo], tmp_path, env, wait_ready=False)
    try:
        yield second, line
    finally:
        second.stop()


def test_the_lines_around_a_corrupt_one_still_count(
    restarted: tuple[ServerProcess, int], journal: Path
) -> None:
    server, line = restarted
    client = httpclient.InferenceServerClient(server.url)
    # Restored: what the API loaded before and after the corrupt line.
    for name in ("before", "after"):
        assert client.is_model_ready(name)
        works(client, name)
    # Not restored, and said so: the index, strict readiness, the log and the kept line.
    assert not client.is_model_ready("doubtful")
    entry = index(server)["doubtful"]
    assert entry["state"] == "UNAVAILABLE", entry
    assert f"line {line} of the journal could not be read" in entry["reason"], entry
    assert entry["reason"].startswith("not restored"), entry
    assert ready(server) == 400
    log = server.log()
    assert re.search(rf"line {line} cannot be read: not JSON .*'doubtful'", log), log
    assert str(journal) + ".rejected" in log
    [kept] = [json.loads(text) for text in Path(f"{journal}.rejected").read_text().splitlines()]
    assert kept["line"] == line
    assert '"model":"doubtful"' in kept["text"] and "\x00\\xff" in kept["text"]
    # Listed in the history at its place.
    [listed] = [e for e in events(server) if e["seq"] == line]
    assert listed["type"] == "JournalLineSkipped" and listed["model"] == "doubtful", listed


def test_bad_input_changes_nothing_and_an_api_load_settles_it(
    restarted: tuple[ServerProcess, int],
    repo: Path,
    tmp_path: Path,
    journal: Path,
    env: dict[str, str],
) -> None:
    server, line = restarted
    client = httpclient.InferenceServerClient(server.url)
    with pytest.raises(InferenceServerException, match="failed to poll from model repository"):
        client.load_model("nowhere")
    assert index(server)["doubtful"]["state"] == "UNAVAILABLE"
    assert ready(server) == 400
    client.load_model("doubtful")
    works(client, "doubtful")
    assert ready(server) == 200
    server.stop()
    # The line stays (never rewritten), but the load after it settles the model for good.
    third = start_server([repo], tmp_path, env)
    try:
        client = httpclient.InferenceServerClient(third.url)
        for name in MODELS:
            assert client.is_model_ready(name)
            works(client, name)
        assert ready(third) == 200
        kept = Path(f"{journal}.rejected").read_text().splitlines()
        assert [json.loads(text)["line"] for text in kept] == [line]
    finally:
        third.stop()


def cut_load_request(journal: Path, model: str) -> int:
    """Cut the line that records the API's load of `model` to its first 40 bytes (before its
    model's name: `{"v":1,"type":"LoadRequested","fields":`), keeping its newline; returns that
    line's number."""
    lines = journal.read_bytes().split(b"\n")
    for number, line in enumerate(lines, start=1):
        if b'"type":"LoadRequested"' in line and f'"model":"{model}"'.encode() in line:
            lines[number - 1] = line[:40]
            assert b'"model"' not in lines[number - 1]
            journal.write_bytes(b"\n".join(lines))
            return number
    raise AssertionError(f"no LoadRequested line for {model}")


def test_a_bad_line_naming_no_model_keeps_readiness_false_until_an_api_load(
    repo: Path, tmp_path: Path, journal: Path, env: dict[str, str]
) -> None:
    loaded_then_stopped(repo, tmp_path, env)
    line = cut_load_request(journal, "doubtful")
    second = start_server([repo], tmp_path, env, wait_ready=False)
    try:
        client = httpclient.InferenceServerClient(second.url)
        for name in ("before", "after"):
            assert client.is_model_ready(name)
        # Which model the line was about is lost: the restore as a whole is in doubt.
        assert not client.is_model_ready("doubtful")
        entry = index(second)[""]
        assert entry["state"] == "UNAVAILABLE", entry
        assert entry["reason"].startswith(
            f"not fully restored: line {line} of the journal could not be read"
        ), entry
        assert ready(second) == 400
        # Bad input settles nothing.
        with pytest.raises(InferenceServerException, match="failed to poll"):
            client.load_model("nowhere")
        assert ready(second) == 400 and "" in index(second)
        client.load_model("doubtful")
        works(client, "doubtful")
        assert "" not in index(second)
        assert ready(second) == 200
    finally:
        second.stop()
    third = start_server([repo], tmp_path, env)
    try:
        assert ready(third) == 200
        assert "" not in index(third)
        client = httpclient.InferenceServerClient(third.url)
        for name in MODELS:
            assert client.is_model_ready(name)
    finally:
        third.stop()


def test_an_api_unload_settles_a_doubt_as_a_load_does(
    repo: Path, tmp_path: Path, journal: Path, env: dict[str, str]
) -> None:
    """docs/journal.md: any load or unload through the API settles what an unreadable line
    left in doubt; an unload of a model that is not loaded did not, before 2026-12-07."""
    loaded_then_stopped(repo, tmp_path, env)
    cut_load_request(journal, "doubtful")
    second = start_server([repo], tmp_path, env, wait_ready=False)
    try:
        client = httpclient.InferenceServerClient(second.url)
        assert ready(second) == 400 and "" in index(second)
        client.unload_model("nowhere")  # a name the server never knew settles nothing
        assert ready(second) == 400 and "" in index(second)
        assert "nowhere" not in index(second)
        client.unload_model("doubtful")  # known, not loaded: the operator's answer
        assert "" not in index(second)
        assert ready(second) == 200
        assert not client.is_model_ready("doubtful")
    finally:
        second.stop()
