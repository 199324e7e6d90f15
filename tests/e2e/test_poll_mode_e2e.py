"""Poll mode against a real server: models dropped in, removed, changed, half-copied, broken on
reload, and reloaded under traffic."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.e2e.conftest import SIMPLE_CONFIG, ensemble_config, write_config
from tests.onnx_models import add_sub_model
from tests.server_process import ServerProcess, start_server, wait_for

POLL = {"TRITONACTOR_MODEL_CONTROL_MODE": "poll", "TRITONACTOR_REPOSITORY_POLL_SECS": "0.2"}


def make_model(folder: Path, name: str, versions: tuple[int, ...] = (1,), policy: str = "") -> None:
    for version in versions:
        add_sub_model(folder / str(version) / "model.onnx")
    write_config(folder, SIMPLE_CONFIG.format(name=name, max_batch_size=8) + policy)


def drop_in(repo: Path, scratch: Path, name: str, **kwargs: object) -> None:
    """Build the model outside the repository, then move it in: the way docs/poll-mode.md says."""
    staged = scratch / name
    make_model(staged, name, **kwargs)  # type: ignore[arg-type]
    shutil.move(str(staged), str(repo / name))


def events(server: ServerProcess, model: str) -> list[dict[str, object]]:
    page = httpx.get(f"{server.base}/v2/repository/events?limit=1000").json()
    return [e for e in page["events"] if e["model"] == model]


def infer(client: httpclient.InferenceServerClient, model: str) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(a)
    result = client.infer(model, inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("poll") / "models"
    for name in ("steady", "doomed", "policy", "breaks", "busy"):
        make_model(root / name, name, versions=(1, 2) if name == "policy" else (1,))
    return root


@pytest.fixture(scope="module")
def server(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = start_server([repo], tmp_path_factory.mktemp("poll-server"), POLL)
    yield process
    process.stop()


@pytest.fixture()
def client(server: ServerProcess) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(server.url)


def test_a_dropped_model_serves(
    server: ServerProcess, repo: Path, tmp_path: Path, client: httpclient.InferenceServerClient
) -> None:
    assert not client.is_model_ready("dropped")
    drop_in(repo, tmp_path, "dropped")
    wait_for(lambda: client.is_model_ready("dropped"))
    infer(client, "dropped")
    requested = [e for e in events(server, "dropped") if e["type"] == "LoadRequested"]
    assert requested[0]["fields"]["source"] == "poll"


def test_an_ensemble_dropped_in_before_its_step_model_serves_once_it_comes(
    server: ServerProcess, repo: Path, tmp_path: Path, client: httpclient.InferenceServerClient
) -> None:
    # As Triton 2.51 (checked against it): it waits for its step model, then serves.
    staged = tmp_path / "early_ensemble"
    (staged / "1").mkdir(parents=True)
    write_config(staged, ensemble_config("early_ensemble", "late_step"))
    shutil.move(str(staged), str(repo / "early_ensemble"))
    settled = ("ModelLoaded", "LoadFailed")  # (the watcher loaded it, alone)
    wait_for(lambda: any(e["type"] in settled for e in events(server, "early_ensemble")))
    assert not client.is_model_ready("early_ensemble")
    drop_in(repo, tmp_path, "late_step")
    wait_for(lambda: client.is_model_ready("early_ensemble"))
    infer(client, "early_ensemble")


def test_a_deleted_model_is_unloaded_and_forgotten(
    server: ServerProcess, repo: Path, client: httpclient.InferenceServerClient
) -> None:
    assert client.is_model_ready("doomed")
    shutil.rmtree(repo / "doomed")
    wait_for(lambda: not client.is_model_ready("doomed"))
    wait_for(lambda: events(server, "doomed")[-1]["type"] == "ModelRemoved")
    index = httpx.post(f"{server.base}/v2/repository/index", json={}).json()
    assert "doomed" not in {entry["name"] for entry in index}
    assert client.is_server_ready()


def test_a_changed_version_policy_loads_and_unloads_versions(
    repo: Path, client: httpclient.InferenceServerClient
) -> None:
    assert client.is_model_ready("policy", "2") and not client.is_model_ready("policy", "1")
    write_config(
        repo / "policy",
        SIMPLE_CONFIG.format(name="policy", max_batch_size=8) + "version_policy { all { } }\n",
    )
    wait_for(lambda: client.is_model_ready("policy", "1"))
    assert client.is_model_ready("policy", "2")
    write_config(
        repo / "policy",
        SIMPLE_CONFIG.format(name="policy", max_batch_size=8)
        + "version_policy { specific { versions: [1] } }\n",
    )
    wait_for(lambda: not client.is_model_ready("policy", "2"))
    assert client.is_model_ready("policy", "1")


def test_a_half_copied_model_is_not_loaded_early(
    server: ServerProcess, repo: Path, client: httpclient.InferenceServerClient, tmp_path: Path
) -> None:
    folder = repo / "slowcopy"
    model_file = add_sub_model(tmp_path / "model.onnx").read_bytes()
    (folder / "1").mkdir(parents=True)
    write_config(folder, SIMPLE_CONFIG.format(name="slowcopy", max_batch_size=8))
    # Copied in slices over ~3 s, longer than the quiet period (1 s): not one load before the end.
    with (folder / "1" / "model.onnx").open("wb") as target:
        step = max(1, len(model_file) // 10)
        for start in range(0, len(model_file), step):
            target.write(model_file[start : start + step])
            target.flush()
            time.sleep(0.3)  # the slow copy itself, not a wait for anything
            # (seen while the copy goes on: a load begun early, then of the whole file, would
            # leave no trace at the end)
            assert not [e for e in events(server, "slowcopy") if e["type"] == "LoadRequested"]
    wait_for(lambda: client.is_model_ready("slowcopy"), timeout=60)
    infer(client, "slowcopy")
    # A load of the half-copied file would have left an extra LoadRequested, or a LoadFailed.
    kinds = [e["type"] for e in events(server, "slowcopy")]
    assert kinds.count("LoadRequested") == 1 and "LoadFailed" not in kinds, kinds


def test_a_broken_reload_keeps_the_old_model_serving(
    server: ServerProcess, repo: Path, client: httpclient.InferenceServerClient
) -> None:
    infer(client, "breaks")
    (repo / "breaks" / "config.pbtxt").write_text("this is { not a config")
    wait_for(lambda: any(e["type"] == "LoadFailed" for e in events(server, "breaks")))
    failed = [e for e in events(server, "breaks") if e["type"] == "LoadFailed"][-1]
    assert failed["fields"]["serving"] is True
    assert client.is_model_ready("breaks")
    infer(client, "breaks")
    # Polling goes on: fixed, it reloads.
    write_config(repo / "breaks", SIMPLE_CONFIG.format(name="breaks", max_batch_size=4))
    wait_for(lambda: client.get_model_config("breaks")["max_batch_size"] == 4)
    infer(client, "breaks")


def test_a_reload_under_traffic_fails_no_request(
    server: ServerProcess, repo: Path, client: httpclient.InferenceServerClient
) -> None:
    failures: list[BaseException] = []
    done = 0
    counting = threading.Lock()
    stop = threading.Event()

    def traffic() -> None:
        nonlocal done
        own = httpclient.InferenceServerClient(server.url)
        while not stop.is_set():
            try:
                infer(own, "busy")
                with counting:
                    done += 1
            except BaseException as error:
                failures.append(error)

    def more_traffic(what: str) -> None:
        """Returns once 20 more requests have succeeded: traffic ran across `what`."""
        start = done
        wait_for(
            lambda: done >= start + 20,
            timeout=60,
            describe=lambda: f"{done - start} requests answered {what}; failures: {failures[:3]}",
        )

    threads = [threading.Thread(target=traffic) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        more_traffic("before the first reload")
        for batch in (4, 2, 8):
            before = len([e for e in events(server, "busy") if e["type"] == "ModelLoaded"])
            write_config(repo / "busy", SIMPLE_CONFIG.format(name="busy", max_batch_size=batch))
            wait_for(
                lambda before=before: (
                    len([e for e in events(server, "busy") if e["type"] == "ModelLoaded"]) > before
                ),
                timeout=60,
            )
            wait_for(
                lambda batch=batch: client.get_model_config("busy")["max_batch_size"] == batch,
                timeout=60,
            )
            more_traffic(f"after the reload to max_batch_size {batch}")
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert failures == []
    # Each replaced copy finished its requests and stopped; none was unloaded as such.
    kinds = [e["type"] for e in events(server, "busy")]
    wait_for(lambda: [e["type"] for e in events(server, "busy")].count("VersionReplaced") == 3)
    assert "ModelUnloaded" not in kinds


def test_hidden_folders_are_ignored(
    server: ServerProcess, repo: Path, client: httpclient.InferenceServerClient, tmp_path: Path
) -> None:
    # A hidden folder and a visible one appear together: once the visible one is loaded, the
    # poller has seen both settle, and the hidden one got nothing.
    make_model(repo / ".staging", "hidden")
    drop_in(repo, tmp_path, "witness")
    wait_for(lambda: client.is_model_ready("witness"))
    assert not events(server, ".staging") and not events(server, "hidden")
    (repo / ".staging").rename(repo / "hidden")
    wait_for(lambda: client.is_model_ready("hidden"))
    assert client.is_model_ready("steady")


def watchers(server: ServerProcess) -> int:
    """How many repository watcher actors the server's actor tree holds (from its metrics)."""
    text = httpx.get(f"{server.base}/metrics").text
    return sum(
        1
        for line in text.splitlines()
        if line.startswith("tritonactor_actor_mailbox_depth{") and "repository-watcher" in line
    )


def test_a_poll_interval_of_zero_loads_at_start_and_never_polls(
    server: ServerProcess, tmp_path: Path
) -> None:
    # Triton's --repository-poll-secs=0: poll mode without the poller.
    make_model(tmp_path / "models" / "steady", "steady")
    idle = start_server(
        [tmp_path / "models"],
        tmp_path,
        {**POLL, "TRITONACTOR_REPOSITORY_POLL_SECS": "0"},
    )
    try:
        assert httpclient.InferenceServerClient(idle.url).is_model_ready("steady")
        assert watchers(idle) == 0
        assert watchers(server) == 1  # the same mode with an interval has its watcher
    finally:
        idle.stop()
