"""A model's versions through explicit loads, as Triton 2.51 answers them (each case sent to it
by a differential review on 2026-12-07): a load one of whose versions fails loads none, a
reload that fails leaves the copies before it serving, a load that changes only the version
policy keeps the versions that stay, and the words of the refusals."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import SIMPLE_CONFIG, write_config
from tests.onnx_models import add_sub_model
from tests.server_process import ServerProcess, start_server, wait_for

EXPLICIT = {"TRITONACTOR_MODEL_CONTROL_MODE": "explicit"}
BROKEN = b"not an onnx model"


def versioned(root: Path, name: str, versions: dict[int, bool], policy: str = "all { }") -> None:
    """`name` with a folder for each of `versions` (False: a model file that fails to load)."""
    for version, good in versions.items():
        path = root / name / str(version) / "model.onnx"
        if good:
            add_sub_model(path)
        else:
            path.parent.mkdir(parents=True)
            path.write_bytes(BROKEN)
    config = SIMPLE_CONFIG.format(name=name, max_batch_size=8)
    write_config(root / name, config + f"version_policy: {{ {policy} }}\n")


def config_json(name: str, policy: dict[str, object], **extra: object) -> str:
    tensor = {"data_type": "TYPE_INT32", "dims": [16]}
    return json.dumps(
        {
            "name": name,
            "platform": "onnxruntime_onnx",
            "max_batch_size": 8,
            "input": [{"name": n, **tensor} for n in ("INPUT0", "INPUT1")],
            "output": [{"name": n, **tensor} for n in ("OUTPUT0", "OUTPUT1")],
            "version_policy": policy,
            **extra,
        }
    )


def add_sub(client: httpclient.InferenceServerClient, model: str, version: str = "") -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(a)
    result = client.infer(model, inputs, model_version=version)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)


def versions_listed(server: ServerProcess, name: str) -> dict[str, tuple[str, str]]:
    entries = httpx.post(f"{server.base}/v2/repository/index", json={}).json()
    return {
        entry["version"]: (entry["state"], entry.get("reason", ""))
        for entry in entries
        if entry["name"] == name and entry.get("version")
    }


def load(server: ServerProcess, name: str, config: str | None = None) -> httpx.Response:
    body = {"parameters": {"config": config}} if config is not None else {}
    return httpx.post(f"{server.base}/v2/repository/models/{name}/load", json=body, timeout=60)


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    versioned(root, "vbad", {1: True, 2: False, 3: True})
    versioned(root, "vm", {1: True, 2: True, 3: True})
    return root


@pytest.fixture()
def server(repo: Path, tmp_path: Path) -> Iterator[ServerProcess]:
    process = start_server([repo], tmp_path, EXPLICIT)
    yield process
    process.stop()


def test_a_load_one_of_whose_versions_fails_loads_none(server: ServerProcess) -> None:
    answer = load(server, "vbad")
    assert answer.status_code == 400
    error = answer.json()["error"]
    # Triton's words: a clause a version, the message ended by one line break
    assert error.startswith("load failed for model 'vbad': version 2 is at UNAVAILABLE state: ")
    assert error.endswith(";\n") and error.count("\n") == 1
    listed = versions_listed(server, "vbad")
    assert listed["1"] == listed["3"] == ("UNAVAILABLE", "unloaded")
    assert listed["2"][0] == "UNAVAILABLE" and listed["2"][1] not in ("", "unloaded")
    client = httpclient.InferenceServerClient(server.url)
    assert not client.is_model_ready("vbad", "1") and not client.is_model_ready("vbad", "3")
    with pytest.raises(InferenceServerException, match="unknown model: 'vbad'"):
        add_sub(client, "vbad")


def test_a_reload_that_fails_leaves_the_copies_before_it_serving(server: ServerProcess) -> None:
    policy = {"specific": {"versions": [1, 3]}}
    assert load(server, "vbad", config_json("vbad", policy)).status_code == 200
    client = httpclient.InferenceServerClient(server.url)
    add_sub(client, "vbad", "3")
    # the same versions and one more, the broken 2, with a parameter the copies would show
    changed = config_json("vbad", {"all": {}}, parameters={"k": {"string_value": "new"}})
    answer = load(server, "vbad", changed)
    assert answer.status_code == 400
    assert "version 2 is at UNAVAILABLE state" in answer.json()["error"]
    for version in ("1", "3"):
        assert client.is_model_ready("vbad", version)
        assert client.get_model_config("vbad", version).get("parameters", {}) == {}
    add_sub(client, "vbad", "1")
    stats = client.get_inference_statistics("vbad", "3")["model_stats"][0]
    assert stats["inference_count"] == 1  # the copy that answered before, not a new one
    listed = versions_listed(server, "vbad")
    assert listed["1"][0] == listed["3"][0] == "READY"


def test_a_load_that_changes_only_the_policy_keeps_the_versions_that_stay(
    server: ServerProcess,
) -> None:
    assert load(server, "vm", config_json("vm", {"all": {}})).status_code == 200
    client = httpclient.InferenceServerClient(server.url)
    for _ in range(3):
        add_sub(client, "vm", "2")
    assert load(
        server, "vm", config_json("vm", {"specific": {"versions": [2, 3]}})
    ).status_code == (200)
    assert not client.is_model_ready("vm", "1")
    stats = client.get_inference_statistics("vm", "2")["model_stats"][0]
    assert stats["inference_count"] == 3  # not loaded again
    assert versions_listed(server, "vm")["1"] == ("UNAVAILABLE", "unloaded")  # Triton's reason
    # a change beside the policy loads them again
    changed = config_json(
        "vm", {"specific": {"versions": [2, 3]}}, parameters={"k": {"string_value": "v"}}
    )
    assert load(server, "vm", changed).status_code == 200
    assert client.get_inference_statistics("vm", "2")["model_stats"][0]["inference_count"] == 0


def test_a_policy_that_selects_no_version_is_refused_in_triton_s_words(
    server: ServerProcess,
) -> None:
    answer = load(server, "vm", config_json("vm", {"specific": {"versions": [8]}}))
    assert answer.status_code == 400
    assert answer.json()["error"] == (
        "load failed for model 'vm': at least one version must be available under the version "
        "policy of model 'vm'\n"
    )


def test_a_grpc_version_is_named_as_a_number(server: ServerProcess) -> None:
    """Triton reads a gRPC `model_version` as a number, and names that number: "01" is 1."""
    assert load(server, "vm", config_json("vm", {"specific": {"versions": [3]}})).status_code == 200
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        for sent, named in (("01", "1"), ("+2", "2"), ("00", "0")):
            with pytest.raises(InferenceServerException) as raised:
                client.get_model_metadata("vm", sent)
            assert raised.value.message() == (
                f"Request for unknown model: 'vm' version {named} is not found"
            )


# A python model whose versions act on files in the folder its config names: version 1 exits
# its process once `die` appears (and fails `initialize` from then on), version 2's
# `initialize` waits for `go`.
DYING_MODEL = """
import json, os, threading, time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        folder = config["parameters"]["folder"]["string_value"]
        version = int(args["model_version"])
        if version == 1:
            if os.path.exists(os.path.join(folder, "died")):
                raise RuntimeError("version 1 cannot start again")
            open(os.path.join(folder, "up"), "w").close()

            def die():
                while not os.path.exists(os.path.join(folder, "die")):
                    time.sleep(0.02)
                open(os.path.join(folder, "died"), "w").close()
                os._exit(1)

            threading.Thread(target=die, daemon=True).start()
        else:
            while not os.path.exists(os.path.join(folder, "go")):
                time.sleep(0.02)

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUT", r.inputs()[0].as_numpy())])
            for r in requests
        ]
"""


def test_a_version_that_dies_while_another_loads_fails_the_load(tmp_path: Path) -> None:
    """Its news came while its load's other version still loaded: the load fails with it, and
    nothing of the model serves (it was listed READY, and its requests refused)."""
    root, folder = tmp_path / "models", tmp_path / "files"
    folder.mkdir()
    model = root / "vdie"
    for version in (1, 2):
        (model / str(version)).mkdir(parents=True)
        (model / str(version) / "model.py").write_text(DYING_MODEL)
    write_config(
        model,
        'name: "vdie"\nbackend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        "version_policy: { all { } }\n"
        f'parameters {{ key: "folder" value {{ string_value: "{folder}" }} }}\n',
    )
    server = start_server([root], tmp_path, EXPLICIT)
    try:
        answers: list[httpx.Response] = []
        loading = threading.Thread(target=lambda: answers.append(load(server, "vdie")))
        loading.start()
        wait_for(lambda: (folder / "up").exists())
        (folder / "die").touch()  # version 1's process exits; its restarts fail
        wait_for(lambda: "actor 'vdie:1' failed" in server.log())
        (folder / "go").touch()  # version 2 comes up
        loading.join()
        (answer,) = answers
        assert answer.status_code == 400
        assert (
            "version 1 is at UNAVAILABLE state: model version stopped serving"
            in (answer.json()["error"])
        )
        listed = versions_listed(server, "vdie")
        assert listed["1"][0] == "UNAVAILABLE" and "stopped serving" in listed["1"][1]
        assert listed["2"] == ("UNAVAILABLE", "unloaded")
        client = httpclient.InferenceServerClient(server.url)
        assert not client.is_model_ready("vdie", "1") and not client.is_model_ready("vdie", "2")
    finally:
        server.stop()


def test_a_load_that_changes_only_the_policy_is_what_a_restart_loads(
    repo: Path, tmp_path: Path
) -> None:
    """Nothing loaded again, and yet the load is the one in force: a restart loads it (it
    loaded the request before it, every version back)."""
    env = {**EXPLICIT, "TRITONACTOR_JOURNAL": str(tmp_path / "kept.jsonl")}
    server = start_server([repo], tmp_path, env)
    try:
        assert load(server, "vm", config_json("vm", {"all": {}})).status_code == 200
        policy = {"specific": {"versions": [2, 3]}}
        assert load(server, "vm", config_json("vm", policy)).status_code == 200
    finally:
        server.stop()
    server = start_server([repo], tmp_path, env)
    try:
        client = httpclient.InferenceServerClient(server.url)
        assert client.is_model_ready("vm", "2") and client.is_model_ready("vm", "3")
        assert not client.is_model_ready("vm", "1")
        assert client.get_model_config("vm")["version_policy"] == {"specific": {"versions": [2, 3]}}
    finally:
        server.stop()


def test_the_same_load_again_adds_nothing_to_the_journal(server: ServerProcess, repo: Path) -> None:
    journal = Path(server.env["TRITONACTOR_JOURNAL"])
    assert load(server, "vm").status_code == 200
    lines = journal.read_text().count("\n")
    for _ in range(3):
        assert load(server, "vm").status_code == 200
    assert journal.read_text().count("\n") == lines
