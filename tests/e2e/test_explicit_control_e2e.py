"""Explicit model control through the real clients: load, unload, config and file overrides,
their checks, the journal's history, and a restart that restores what was loaded."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import SIMPLE_CONFIG, ensemble_config, write_config
from tests.onnx_models import add_sub_model
from tests.server_process import ServerProcess, start_server
from tritonactor.control.override_folders import override_root

EXPLICIT = {"TRITONACTOR_MODEL_CONTROL_MODE": "explicit", "TRITONACTOR_LOAD_MODEL": "simple"}


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("explicit") / "models"
    for name, batch in (("simple", 8), ("simple_nobatch", 0), ("other", 8)):
        add_sub_model(root / name / "1" / "model.onnx", batch=batch > 0)
        write_config(root / name, SIMPLE_CONFIG.format(name=name, max_batch_size=batch))
    (root / "broken" / "1").mkdir(parents=True)
    (root / "broken" / "1" / "model.onnx").write_bytes(b"not an onnx model")
    write_config(root / "broken", 'name: "broken"\nplatform: "onnxruntime_onnx"\n')
    return root


@pytest.fixture()
def server(repo: Path, tmp_path: Path) -> Iterator[ServerProcess]:
    process = start_server([repo], tmp_path, EXPLICIT)
    yield process
    process.stop()


def add_sub(client: httpclient.InferenceServerClient, model: str, batch: bool = True) -> None:
    shape = [1, 16] if batch else [16]
    a = np.arange(16, dtype=np.int32).reshape(shape)
    b = np.ones(shape, dtype=np.int32)
    inputs = [httpclient.InferInput(n, shape, "INT32") for n in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer(model, inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)


def add_sub_config(name: str) -> dict[str, object]:
    """The JSON config of an ONNX add/sub model (`add_sub_model`) of batch size up to 4."""
    tensor = {"data_type": "TYPE_INT32", "dims": [16]}
    return {
        "name": name,
        "platform": "onnxruntime_onnx",
        "max_batch_size": 4,
        "input": [{"name": n, **tensor} for n in ("INPUT0", "INPUT1")],
        "output": [{"name": n, **tensor} for n in ("OUTPUT0", "OUTPUT1")],
    }


def index(server: ServerProcess) -> dict[str, dict[str, str]]:
    entries = httpx.post(f"{server.base}/v2/repository/index", json={}).json()
    return {entry["name"]: entry for entry in entries}


def events(server: ServerProcess, after: int = 0) -> list[dict[str, object]]:
    found: list[dict[str, object]] = []
    while True:
        page = httpx.get(f"{server.base}/v2/repository/events?after={after}&limit=50").json()
        if not page["events"]:
            return found
        found += page["events"]
        after = page["next"]


def test_http_load_and_unload(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.url)
    assert index(server)["simple_nobatch"] == {"name": "simple_nobatch"}
    assert not client.is_model_ready("simple_nobatch")
    # never loaded: not found, as Triton 2.51 answers (it has no available versions once
    # a load was asked for, below)
    for call in (
        lambda: client.get_model_config("simple_nobatch"),
        lambda: add_sub(client, "simple_nobatch", batch=False),
    ):
        with pytest.raises(InferenceServerException, match="'simple_nobatch' is not found"):
            call()
    client.load_model("simple_nobatch")
    assert client.is_model_ready("simple_nobatch")
    add_sub(client, "simple_nobatch", batch=False)
    assert index(server)["simple_nobatch"]["state"] == "READY"
    client.unload_model("simple_nobatch")
    assert not client.is_model_ready("simple_nobatch")
    assert index(server)["simple_nobatch"] == {
        "name": "simple_nobatch",
        "version": "1",
        "state": "UNAVAILABLE",
        "reason": "unloaded",
    }
    with pytest.raises(InferenceServerException, match="has no available versions"):
        add_sub(client, "simple_nobatch", batch=False)
    # A version that was loaded is not at ready state; one never loaded is not found (Triton
    # 2.51's codes and words).
    body = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [16], "data": [0] * 16}]}
    for version, status, words in (
        (1, 503, "version 1 is not at ready state"),
        (2, 404, "version 2 is not found"),
    ):
        url = f"{server.base}/v2/models/simple_nobatch/versions/{version}/infer"
        answer = httpx.post(url, json=body)
        assert answer.status_code == status
        assert answer.json() == {"error": f"Request for unknown model: 'simple_nobatch' {words}"}
    # Unloading what is not loaded, or not there at all, is fine (Triton answers 200 too).
    client.unload_model("simple_nobatch")
    client.unload_model("nosuch")
    assert client.is_server_ready()  # unloaded on purpose: not awaited by readiness


@pytest.fixture()
def ensembles(repo: Path, tmp_path: Path) -> Iterator[ServerProcess]:
    """`other`, an ensemble of it (`ens_other`), one of that (`ens_outer`), and ensembles whose
    step cannot serve: a model that fails to load, a version not there, a model not there."""
    root = tmp_path / "ensembles"
    shutil.copytree(repo, root)
    for name, step, version in (
        ("ens_other", "other", -1),
        ("ens_outer", "ens_other", -1),
        ("ens_broken", "broken", -1),
        ("ens_pinned", "other", 7),
        ("ens_missing", "nosuch", -1),
    ):
        (root / name / "1").mkdir(parents=True)
        write_config(root / name, ensemble_config(name, step, version))
    env = {**EXPLICIT, "TRITONACTOR_LOAD_MODEL": "ens_outer"}
    process = start_server([root], tmp_path, env)
    yield process
    process.stop()


def test_an_ensemble_is_away_while_its_step_model_is(ensembles: ServerProcess) -> None:
    """As Triton 2.51 does (each answer checked against it): unloading a model takes the
    ensembles that run it away (through ensembles of ensembles), with `unload_dependents` or
    without, and loading the model brings them back; an ensemble unloaded while away stays
    unloaded, and loading it loads its steps."""
    server = ensembles
    client = httpclient.InferenceServerClient(server.url)
    grpc_client = grpcclient.InferenceServerClient(server.grpc_url)
    names = ("other", "ens_other", "ens_outer")
    unloaded = {"version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}
    assert all(client.is_model_ready(name) for name in names)  # loaded with its steps
    add_sub(client, "ens_outer")
    for dependents in (False, True):
        client.unload_model("other", unload_dependents=dependents)
        for name in names:
            assert not client.is_model_ready(name)
            assert not grpc_client.is_model_ready(name)
            assert index(server)[name] == {"name": name, **unloaded}
        for call, message in (
            (lambda: add_sub(client, "ens_outer"), "'ens_outer' has no available versions"),
            (lambda: client.get_model_metadata("ens_other"), "'ens_other' has no available"),
            (lambda: client.get_model_config("ens_other"), "'ens_other' has no available"),
            (lambda: client.get_inference_statistics("ens_other"), "'ens_other' is not avail"),
            (lambda: grpc_client.get_model_metadata("ens_other"), "'ens_other' has no avail"),
        ):
            with pytest.raises(InferenceServerException, match=message):
                call()
        assert client.is_server_ready()  # away on purpose: strict readiness does not wait
        ready = httpx.post(f"{server.base}/v2/repository/index", json={"ready": True}).json()
        assert not [entry for entry in ready if entry["name"] in names]
        client.load_model("other")
        assert all(client.is_model_ready(name) for name in names)
        add_sub(client, "ens_outer")
    # Away, then unloaded: stays unloaded (and so does the ensemble of it) when its step
    # comes back; loading it loads what it needs.
    client.unload_model("other")
    client.unload_model("ens_other")
    client.load_model("other")
    assert client.is_model_ready("other")
    assert not client.is_model_ready("ens_other") and not client.is_model_ready("ens_outer")
    assert index(server)["ens_other"] == {"name": "ens_other", **unloaded}
    client.unload_model("other")
    client.load_model("ens_other")
    assert all(client.is_model_ready(name) for name in names)
    add_sub(client, "ens_outer")


def test_an_ensemble_whose_step_cannot_serve_is_refused(ensembles: ServerProcess) -> None:
    """Triton 2.51's refusals, in its words (checked against it), after its steps' loads;
    nothing else changes."""
    server = ensembles
    client = httpclient.InferenceServerClient(server.url)
    for name, reason in (
        (
            "ens_missing",
            "ensemble ens_missing contains models that are not available or ambiguous: nosuch",
        ),
        (
            "ens_pinned",
            "ensemble 'ens_pinned' depends on 'other' whose required version 7 is not loaded.",
        ),
        (
            "ens_broken",
            "ensemble 'ens_broken' depends on 'broken' which has no loaded version. "
            "Model 'broken' loading failed with error: version 1 is at UNAVAILABLE state: ",
        ),
    ):
        response = httpx.post(f"{server.base}/v2/repository/models/{name}/load", json={})
        assert response.status_code == 400, response.text
        assert response.json()["error"].startswith(f"load failed for model '{name}': {reason}")
        entry = index(server)[name]
        assert (entry["state"], entry["reason"][: len(reason)]) == ("UNAVAILABLE", reason)
        assert not client.is_model_ready(name)
        with pytest.raises(InferenceServerException, match=f"'{name}' has no available"):
            add_sub(client, name)
    assert index(server)["broken"]["state"] == "UNAVAILABLE"  # its step's own load failed
    assert all(client.is_model_ready(name) for name in ("other", "ens_other", "ens_outer"))
    for name in ("ens_missing", "ens_pinned", "ens_broken", "broken"):
        client.unload_model(name)
    assert client.is_server_ready()


def test_load_errors_change_nothing(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.url)
    response = httpx.post(f"{server.base}/v2/repository/models/nosuch/load", json={})
    assert response.status_code == 500
    assert response.json() == {
        "error": "failed to load 'nosuch', failed to poll from model repository"
    }
    with pytest.raises(InferenceServerException, match="load failed for model 'broken'"):
        client.load_model("broken")
    assert index(server)["broken"]["state"] == "UNAVAILABLE"
    assert not client.is_server_ready()  # asked for and not ready: strict readiness says no
    client.unload_model("broken")
    assert client.is_server_ready()
    for body, message in (
        ({"parameters": {"bogus": 1}}, "unknown load parameter"),
        ({"parameters": {"config": "{bad"}}, "config"),
        ({"parameters": {"file:1/model.onnx": "AAAA"}}, "config"),
        ({"parameters": []}, "'parameters' must be a JSON object"),
    ):
        response = httpx.post(f"{server.base}/v2/repository/models/simple/load", json=body)
        assert response.status_code == 400, body
        assert message in response.json()["error"]
    assert client.is_model_ready("simple")
    add_sub(client, "simple")


def test_a_named_repository_is_not_supported_and_changes_nothing(server: ServerProcess) -> None:
    """Triton's answers to a load, an unload or an index that names a repository: over HTTP
    the index is the server's and a load or unload 501; over gRPC each is UNIMPLEMENTED."""
    client = httpclient.InferenceServerClient(server.url)
    for action in ("load", "unload"):
        response = httpx.post(f"{server.base}/v2/repository/foo/models/simple/{action}")
        assert response.status_code == 501, response.text
        assert response.json() == {"error": "'repository_name' specification is not supported"}
    named = httpx.post(f"{server.base}/v2/repository/foo/index", json={})
    assert named.status_code == 200 and named.json() == list(index(server).values())
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for call, request in (
            (
                stub.RepositoryModelUnload,
                service_pb2.RepositoryModelUnloadRequest(
                    repository_name="foo", model_name="simple"
                ),
            ),
            (
                stub.RepositoryModelLoad,
                service_pb2.RepositoryModelLoadRequest(repository_name="foo", model_name="other"),
            ),
            (stub.RepositoryIndex, service_pb2.RepositoryIndexRequest(repository_name="foo")),
        ):
            with pytest.raises(grpc.RpcError) as caught:
                call(request)
            assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
            assert caught.value.details() == "'repository_name' specification is not supported"
    assert client.is_model_ready("simple") and not client.is_model_ready("other")
    add_sub(client, "simple")


def test_a_config_triton_refuses_is_refused_in_its_words(server: ServerProcess) -> None:
    """A reload whose config fails Triton's checks answers 400 with Triton's message (and
    the model serves on with its config); so does a load of a folder whose config does."""
    client = httpclient.InferenceServerClient(server.url)
    config = client.get_model_config("simple")
    for change, message in (
        (
            {"dynamic_batching": {"preferred_batch_size": [16]}},
            "dynamic batching preferred size must be <= max batch size for simple",
        ),
        (
            {"input": [dict(config["input"][0], reshape={"shape": [3]}), config["input"][1]]},
            "model input 'INPUT0' has different size for dims and reshape for simple",
        ),
        (
            {"model_repository_agents": {"agents": [{"name": "checksum"}]}},
            "unable to find 'libtritonrepoagent_checksum.so' for repo agent 'checksum': "
            "tritonactor has no repository agents",
        ),
        (
            {"runtime": "libtriton_pytorch.so"},
            "unable to find backend library 'libtriton_pytorch.so' for model 'simple': "
            "tritonactor's backends are Python packages; the runtime 'libtriton_onnxruntime.so' "
            "names backend 'onnxruntime', another cannot be loaded",
        ),
    ):
        body = {"parameters": {"config": json.dumps(dict(config, **change))}}
        response = httpx.post(f"{server.base}/v2/repository/models/simple/load", json=body)
        assert response.status_code == 400, response.text
        assert response.json()["error"] == (
            f"load failed for model 'simple': version 1 is at UNAVAILABLE state: {message};\n"
        )
        assert client.get_model_config("simple") == config
        add_sub(client, "simple")
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    bad = dict(config, name="other", max_batch_size=-1)
    with pytest.raises(InferenceServerException, match="'max_batch_size' must be non-negative"):
        grpc.load_model("other", config=json.dumps(bad))
    assert index(server)["other"]["reason"] == (
        "'max_batch_size' must be non-negative value for other"
    )
    assert not client.is_model_ready("other")
    client.unload_model("other")


def test_file_override_paths_are_checked(server: ServerProcess, tmp_path: Path) -> None:
    config = json.dumps({"name": "fresh", "backend": "onnxruntime"})
    for path in ("../escape/model.onnx", "/etc/passwd", "1/../../x", "1\\model.onnx"):
        response = httpx.post(
            f"{server.base}/v2/repository/models/fresh/load",
            json={"parameters": {"config": config, f"file:{path}": "AAAA"}},
        )
        assert response.status_code == 400, path
    journal = Path(server.env["TRITONACTOR_JOURNAL"])
    assert not list(override_root(journal).glob("fresh*"))
    assert not (journal.parent / "escape").exists()


def test_grpc_load_with_config_and_file_overrides(server: ServerProcess, tmp_path: Path) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    http = httpclient.InferenceServerClient(server.url)
    # A model no repository holds, from files alone.
    model_file = add_sub_model(tmp_path / "model.onnx")
    config = SIMPLE_CONFIG.format(name="fresh", max_batch_size=4)
    config_json = json.dumps(add_sub_config("fresh"))
    assert "fresh" in config
    client.load_model(
        "fresh", config=config_json, files={"file:1/model.onnx": model_file.read_bytes()}
    )
    assert client.is_model_ready("fresh")
    add_sub(http, "fresh")
    assert http.get_model_config("fresh")["max_batch_size"] == 4
    # A config override of a repository model: its own files, this config.
    override = json.dumps({"max_batch_size": 2, "dynamic_batching": {}})
    client.load_model("other", config=override)
    assert http.get_model_config("other")["max_batch_size"] == 2
    add_sub(http, "other")
    # The same request again changes nothing: no second load.
    loads = [e for e in events(server) if e["type"] == "ModelLoaded" and e["model"] == "other"]
    client.load_model("other", config=override)
    again = [e for e in events(server) if e["type"] == "ModelLoaded" and e["model"] == "other"]
    assert len(again) == len(loads) == 1
    # Without the override, the repository's config comes back: a reload.
    client.load_model("other")
    assert http.get_model_config("other")["max_batch_size"] == 8
    # A plain load of it finds no folder: refused in Triton's words, and, as in Triton, what
    # serves goes on serving (it was unloaded).
    with pytest.raises(InferenceServerException) as caught:
        client.load_model("fresh")
    assert caught.value.message() == "failed to load 'fresh', failed to poll from model repository"
    assert client.is_model_ready("fresh")
    add_sub(http, "fresh")
    client.unload_model("fresh")
    assert not client.is_model_ready("fresh")


def test_events_are_served_in_pages(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.url)
    client.load_model("simple_nobatch")
    client.unload_model("simple_nobatch")
    history = events(server)
    assert [e["seq"] for e in history] == list(range(1, len(history) + 1))
    kinds = [(e["type"], e["model"]) for e in history]
    assert ("ServerStarted", "") in kinds
    assert ("ModelLoaded", "simple") in kinds
    mine = [e for e in history if e["model"] == "simple_nobatch"]
    assert [e["type"] for e in mine][-4:] == [
        "LoadRequested",
        "ModelLoaded",
        "UnloadRequested",
        "ModelUnloaded",
    ]
    assert mine[-4]["fields"]["source"] == "api"
    assert mine[-3]["fields"]["load_seconds"] > 0
    page = httpx.get(f"{server.base}/v2/repository/events?after=1&limit=2").json()
    assert [e["seq"] for e in page["events"]] == [2, 3] and page["next"] == 3
    bad = httpx.get(f"{server.base}/v2/repository/events?limit=0")
    assert bad.status_code == 400
    metadata = httpx.get(f"{server.base}/v2").json()
    assert "repository_events" in metadata["extensions"]
    assert "model_repository" in metadata["extensions"]


def test_a_new_version_that_fails_leaves_the_one_before_serving(tmp_path: Path) -> None:
    """As Triton 2.51 (checked against it, in poll mode): under `latest 1`, a version 2 that
    fails to load leaves version 1 serving (it was retired, and the model served nothing)."""
    root = tmp_path / "models"
    add_sub_model(root / "simple" / "1" / "model.onnx")
    write_config(root / "simple", SIMPLE_CONFIG.format(name="simple", max_batch_size=8))
    server = start_server([root], tmp_path, EXPLICIT)
    try:
        client = httpclient.InferenceServerClient(server.url)
        (root / "simple" / "2").mkdir()
        (root / "simple" / "2" / "model.onnx").write_bytes(b"not an onnx model")
        with pytest.raises(InferenceServerException, match="version 2 is at UNAVAILABLE"):
            client.load_model("simple")
        add_sub(client, "simple")  # version 1's answer
        assert client.is_model_ready("simple", "1")
        versions = {
            entry["version"]: entry["state"]
            for entry in httpx.post(f"{server.base}/v2/repository/index", json={}).json()
            if entry["name"] == "simple"
        }
        assert versions == {"1": "READY", "2": "UNAVAILABLE"}
        add_sub_model(root / "simple" / "2" / "model.onnx")  # mended: version 2 takes over
        client.load_model("simple")
        assert client.is_model_ready("simple", "2") and not client.is_model_ready("simple", "1")
        add_sub(client, "simple")
    finally:
        server.stop()


def test_restart_restores_what_the_api_loaded(repo: Path, tmp_path: Path) -> None:
    env = {**EXPLICIT, "TRITONACTOR_JOURNAL": str(tmp_path / "state" / "journal.jsonl")}
    first = start_server([repo], tmp_path, env)
    try:
        client = httpclient.InferenceServerClient(first.url)
        client.load_model("other", config=json.dumps({"max_batch_size": 2}))
        client.load_model("simple", config=json.dumps({"max_batch_size": 4}))
        client.load_model("simple_nobatch")
        client.unload_model("simple_nobatch")
    finally:
        first.stop()
    second = start_server([repo], tmp_path, env)
    try:
        client = httpclient.InferenceServerClient(second.url)
        assert client.is_model_ready("simple")  # the startup list
        assert client.get_model_config("simple")["max_batch_size"] == 4  # as last loaded
        assert client.is_model_ready("other")  # loaded through the API, with its override
        assert client.get_model_config("other")["max_batch_size"] == 2
        assert not client.is_model_ready("simple_nobatch")  # unloaded: stays unloaded
        started = [e for e in events(second) if e["type"] == "ServerStarted"]
        assert len(started) == 2  # one journal, both runs
    finally:
        second.stop()


def test_a_load_that_moves_to_a_new_version_is_restored_at_the_new_one(tmp_path: Path) -> None:
    """A load that finds version 2 retires version 1 (policy `latest 1`): a restart serves the
    model at version 2 (the retirement was once replayed as an unload, and the model lost)."""
    repo = tmp_path / "models"
    add_sub_model(repo / "moving" / "1" / "model.onnx", batch=True)
    write_config(repo / "moving", SIMPLE_CONFIG.format(name="moving", max_batch_size=8))
    env = {
        "TRITONACTOR_MODEL_CONTROL_MODE": "explicit",
        "TRITONACTOR_JOURNAL": str(tmp_path / "state" / "journal.jsonl"),
    }
    first = start_server([repo], tmp_path, env)
    try:
        client = httpclient.InferenceServerClient(first.url)
        client.load_model("moving")
        shutil.copytree(repo / "moving" / "1", repo / "moving" / "2")
        client.load_model("moving")
        assert client.is_model_ready("moving", "2")
        assert not client.is_model_ready("moving", "1")
    finally:
        first.stop()
    second = start_server([repo], tmp_path, env)
    try:
        client = httpclient.InferenceServerClient(second.url)
        assert client.is_model_ready("moving", "2")
        add_sub(client, "moving")
    finally:
        second.stop()


def test_a_restart_that_finds_a_load_s_files_gone_says_so_and_keeps_the_load(
    tmp_path: Path,
) -> None:
    """The folder holding the files a load through the API gave is removed while the server is
    down: the restart lists the model as failed, naming the folder (it was a traceback and the
    model forgotten), and once the files are back a restart loads it again."""
    repo = tmp_path / "models"
    repo.mkdir()
    journal = tmp_path / "state" / "journal.jsonl"
    env = {"TRITONACTOR_MODEL_CONTROL_MODE": "explicit", "TRITONACTOR_JOURNAL": str(journal)}
    model_file = add_sub_model(tmp_path / "model.onnx")
    config = add_sub_config("given")
    first = start_server([repo], tmp_path, env)
    try:
        client = httpclient.InferenceServerClient(first.url)
        client.load_model(
            "given", config=json.dumps(config), files={"file:1/model.onnx": model_file.read_bytes()}
        )
        assert client.is_model_ready("given")
    finally:
        first.stop()
    [folder] = [p for p in override_root(journal).iterdir() if p.name.startswith("given")]
    aside = tmp_path / "aside"
    folder.rename(aside)
    second = start_server([repo], tmp_path, env, wait_ready=False)
    try:
        [entry] = [e for e in index(second).values() if e["name"] == "given"]
        assert entry["state"] == "UNAVAILABLE"
        assert f"the files its load through the API gave ({folder}) are gone" in entry["reason"]
        assert "Traceback" not in second.log()
    finally:
        second.stop()
    aside.rename(folder)
    third = start_server([repo], tmp_path, env)
    try:
        client = httpclient.InferenceServerClient(third.url)
        assert client.is_model_ready("given")
        add_sub(client, "given")
    finally:
        third.stop()


def test_a_restart_in_another_mode_lists_what_the_api_loaded_before(
    repo: Path, tmp_path: Path
) -> None:
    """Restarted in mode none with lazy loading, a repository model an earlier start loaded
    through the API is listed, not loaded, as any other (it was missing from the index)."""
    journal = tmp_path / "state" / "journal.jsonl"
    first = start_server([repo], tmp_path, {**EXPLICIT, "TRITONACTOR_JOURNAL": str(journal)})
    try:
        httpclient.InferenceServerClient(first.url).load_model("other")
    finally:
        first.stop()
    lazy = {
        "TRITONACTOR_MODEL_CONTROL_MODE": "none",
        "TRITONACTOR_LAZY_LOAD": "true",
        "TRITONACTOR_JOURNAL": str(journal),
    }
    second = start_server([repo], tmp_path, lazy)
    try:
        assert {"simple", "simple_nobatch", "other", "broken"} <= set(index(second))
        assert index(second)["other"] == {"name": "other"}
    finally:
        second.stop()


def test_a_restart_that_finds_a_load_s_files_gone_loads_the_repository_s_model(
    repo: Path, tmp_path: Path
) -> None:
    """The API loaded a repository model with files of its own, which are gone at the restart:
    the start loads the repository's model, as a restarted Triton would, and says so (a model
    the startup list names stopped the start before)."""
    journal = tmp_path / "state" / "journal.jsonl"
    env = {**EXPLICIT, "TRITONACTOR_JOURNAL": str(journal)}
    model_file = add_sub_model(tmp_path / "model.onnx")
    first = start_server([repo], tmp_path, env)
    try:
        client = httpclient.InferenceServerClient(first.url)
        config = json.dumps(client.get_model_config("simple"))
        client.load_model(
            "simple", config=config, files={"file:1/model.onnx": model_file.read_bytes()}
        )
    finally:
        first.stop()
    [folder] = [p for p in override_root(journal).iterdir() if p.name.startswith("simple")]
    shutil.rmtree(folder)
    second = start_server([repo], tmp_path, env)  # its startup list names simple
    try:
        client = httpclient.InferenceServerClient(second.url)
        assert client.is_model_ready("simple")
        add_sub(client, "simple")
        assert f"the files its load through the API gave ({folder}) are gone" in second.log()
    finally:
        second.stop()


def test_mode_none_refuses_load_and_unload(repo: Path, tmp_path: Path) -> None:
    server = start_server(
        [repo], tmp_path, {"TRITONACTOR_EXIT_ON_ERROR": "false"}, wait_ready=False
    )
    try:
        for action in ("load", "unload"):
            response = httpx.post(f"{server.base}/v2/repository/models/simple/{action}", json={})
            assert response.status_code == 503
            assert "not allowed if polling is enabled" in response.json()["error"]
    finally:
        server.stop()


def test_a_journal_of_bad_lines_is_skipped_line_by_line_and_the_server_starts(
    repo: Path, tmp_path: Path
) -> None:
    journal = tmp_path / "state" / "journal.jsonl"
    journal.parent.mkdir()
    journal.write_text('{"v": 1, "type": "ServerStarted"}\nnot json at all\n{"v": 1}\n')
    env = {**EXPLICIT, "TRITONACTOR_JOURNAL": str(journal)}
    server = start_server([repo], tmp_path, env, wait_ready=False)
    try:
        client = httpclient.InferenceServerClient(server.url)
        assert client.is_model_ready("simple")
        rejected = journal.with_name("journal.jsonl.rejected").read_text().splitlines()
        assert [json.loads(line)["line"] for line in rejected] == [1, 2, 3]
        assert "not json at all" in rejected[1]
        kinds = [e["type"] for e in events(server)[:4]]
        assert kinds == ["JournalLineSkipped"] * 3 + ["ServerStarted"]
        assert "line 2 cannot be read" in server.log()
        # Lines that name no model leave the whole restore in doubt (docs/journal.md): the
        # server says so, and is not ready until an API load or unload settles it.
        doubt = [e for e in client.get_model_repository_index() if e["name"] == ""]
        assert doubt and doubt[0]["reason"].startswith("not fully restored"), doubt
        assert not client.is_server_ready()
        client.load_model("simple")
        assert client.is_server_ready()
    finally:
        server.stop()


def test_the_index_lists_a_folder_added_after_the_start(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    add_sub_model(repo / "simple" / "1" / "model.onnx")
    write_config(repo / "simple", SIMPLE_CONFIG.format(name="simple", max_batch_size=8))
    server = start_server([repo], tmp_path, EXPLICIT)
    try:
        assert set(index(server)) == {"simple"}
        # As Triton's index: every model folder there is when it is asked, loaded or not.
        add_sub_model(repo / "added" / "1" / "model.onnx")
        write_config(repo / "added", SIMPLE_CONFIG.format(name="added", max_batch_size=8))
        assert index(server)["added"] == {"name": "added"}
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            names = {model.name for model in client.get_model_repository_index().models}
        assert names == {"simple", "added"}
        # Removed before anything loaded it: it leaves the index. A loaded one stays.
        shutil.rmtree(repo / "added")
        shutil.rmtree(repo / "simple")
        assert set(index(server)) == {"simple"}
    finally:
        server.stop()
