"""Confinement, end to end: a load request cannot make the server read or run a file outside the
model's folder, whatever the config override or file override names (`..`, absolute paths,
links planted in the folder), and the error never tells whether such a file exists; the folders
file overrides are written to go once their model is unloaded or replaced.
(docs/confinement.md)"""

from __future__ import annotations

import json
import os
import signal
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
from tests.server_process import ServerProcess, start_server
from tritonactor.control.override_folders import LOCK_NAME, override_root

EXPLICIT = {"TRITONACTOR_MODEL_CONTROL_MODE": "explicit", "TRITONACTOR_LOAD_MODEL": "pyid"}

IDENTITY_PY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())]
            )
            for r in requests
        ]
"""

PYID_CONFIG = {
    "backend": "python",
    "max_batch_size": 0,
    "input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [2]}],
    "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [2]}],
}

ADD_SUB_CONFIG = {
    "platform": "onnxruntime_onnx",
    "max_batch_size": 8,
    "input": [{"name": n, "data_type": "TYPE_INT32", "dims": [16]} for n in ("INPUT0", "INPUT1")],
    "output": [
        {"name": n, "data_type": "TYPE_INT32", "dims": [16]} for n in ("OUTPUT0", "OUTPUT1")
    ],
}


def probe_source(marker: Path) -> str:
    # Imported, it leaves a marker; it also mentions auto_complete_config, so a load that
    # reaches auto-complete would import it there too.
    return (
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('imported')\n"
        + IDENTITY_PY
        + "\n    @staticmethod\n    def auto_complete_config(config):\n        return config\n"
    )


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("confine")
    outside = base / "outside"
    outside.mkdir()
    marker = base / "probe-imported"
    (outside / "probe.py").write_text(probe_source(marker))
    (outside / "secret").write_text("not the server's to read\n")
    repo = base / "models"
    (repo / "pyid" / "1").mkdir(parents=True)
    (repo / "pyid" / "1" / "model.py").write_text(IDENTITY_PY)
    write_config(repo / "pyid", 'name: "pyid"\nbackend: "python"\n' + _pbtxt_io())
    # Planted in the folder, pointing out: as if someone with write access to the disk (not
    # an API caller) had left it there.
    (repo / "pyid" / "1" / "planted.py").symlink_to(outside / "probe.py")
    # An operator's link for a repository model (allowed: the repository is theirs).
    (repo / "linked" / "1").mkdir(parents=True)
    (outside / "shared_model.py").write_text(IDENTITY_PY)
    (repo / "linked" / "1" / "model.py").symlink_to(outside / "shared_model.py")
    (repo / "linked" / "1" / "other.py").symlink_to(outside / "shared_model.py")
    write_config(repo / "linked", 'name: "linked"\nbackend: "python"\n' + _pbtxt_io())
    # A model whose version folder is an operator's link to another model's.
    (repo / "vlinked").mkdir()
    (repo / "vlinked" / "1").symlink_to(repo / "pyid" / "1")
    write_config(repo / "vlinked", 'name: "vlinked"\nbackend: "python"\n' + _pbtxt_io())
    add_sub_model(repo / "simple" / "1" / "model.onnx")
    write_config(repo / "simple", SIMPLE_CONFIG.format(name="simple", max_batch_size=8))
    return {"repo": repo, "outside": outside, "marker": marker, "base": base}


def _pbtxt_io() -> str:
    return (
        "max_batch_size: 0\n"
        'input [{ name: "IN" data_type: TYPE_FP32 dims: [2] }]\n'
        'output [{ name: "OUT" data_type: TYPE_FP32 dims: [2] }]\n'
    )


@pytest.fixture(scope="module")
def server(
    layout: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    process = start_server([layout["repo"]], tmp_path_factory.mktemp("confine-server"), EXPLICIT)
    yield process
    process.stop()


def index(server: ServerProcess) -> list[dict[str, str]]:
    return httpx.post(f"{server.base}/v2/repository/index", json={}).json()


def identity(server: ServerProcess, model: str = "pyid") -> None:
    client = httpclient.InferenceServerClient(server.url)
    data = np.array([1.5, -2.0], dtype=np.float32)
    inputs = [httpclient.InferInput("IN", [2], "FP32")]
    inputs[0].set_data_from_numpy(data)
    np.testing.assert_array_equal(client.infer(model, inputs).as_numpy("OUT"), data)


def refused_load(server: ServerProcess, model: str, **config: object) -> str:
    """Load `model` with a config override through tritonclient (HTTP): it must be refused
    with a 400 and leave the index as it was. Returns the error message."""
    before = index(server)
    client = httpclient.InferenceServerClient(server.url)
    with pytest.raises(InferenceServerException) as caught:
        client.load_model(model, config=json.dumps({**PYID_CONFIG, **config}))
    assert caught.value.status() == "400", caught.value
    after = index(server)
    assert after == before
    return caught.value.message()


def overrides_root(server: ServerProcess) -> Path:
    return override_root(Path(server.env["TRITONACTOR_JOURNAL"]))


def override_folders(server: ServerProcess, model: str) -> list[str]:
    root = overrides_root(server)
    return sorted(p.name for p in root.glob(f"{model}-*")) if root.exists() else []


def events_of(server: ServerProcess, kind: str, model: str) -> list[dict[str, object]]:
    found: list[dict[str, object]] = []
    after = 0
    while True:
        page = httpx.get(f"{server.base}/v2/repository/events?after={after}&limit=100").json()
        if not page["events"]:
            return [e for e in found if e["type"] == kind and e["model"] == model]
        found += page["events"]
        after = page["next"]


# --- config overrides ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "filename",
    [
        "../../../outside/probe.py",
        "1/../../../outside/probe.py",
        "../pyid/../../outside/probe.py",
        "planted.py",  # a link inside the folder that points out
    ],
)
def test_a_config_override_cannot_run_a_python_file_outside_the_model(
    server: ServerProcess, layout: dict[str, Path], filename: str
) -> None:
    message = refused_load(server, "pyid", default_model_filename=filename)
    assert f"default_model_filename '{filename}' is outside the model's folder" in message
    assert not layout["marker"].exists()
    identity(server)  # the version that served still serves


def test_an_absolute_model_filename_stays_inside_the_version_folder(
    server: ServerProcess, layout: dict[str, Path]
) -> None:
    # Triton joins a leading '/' to the version folder: the server's own file is never named.
    absolute = str(layout["outside"] / "probe.py")
    message = refused_load(server, "pyid", default_model_filename=absolute)
    assert f"'{layout['repo']}/pyid/1{absolute}'" in message
    assert not layout["marker"].exists()
    identity(server)


def test_the_error_does_not_tell_whether_a_file_outside_exists(
    server: ServerProcess, layout: dict[str, Path]
) -> None:
    assert (layout["outside"] / "secret").exists()
    assert not (layout["outside"] / "missing").exists()
    exists = refused_load(server, "pyid", default_model_filename="../../../outside/secret")
    missing = refused_load(server, "pyid", default_model_filename="../../../outside/missing")
    assert exists.replace("secret", "NAME") == missing.replace("missing", "NAME")
    for absolute in ("/etc/shadow", "/etc/no-such-file"):
        message = refused_load(server, "pyid", default_model_filename=absolute)
        assert f"unable to find '{layout['repo']}/pyid/1{absolute}'" in message


@pytest.mark.parametrize(
    ("field", "config", "described"),
    [
        (
            "label_filename",
            {
                "output": [
                    {
                        "name": "OUT",
                        "data_type": "TYPE_FP32",
                        "dims": [2],
                        "label_filename": "../outside/secret",
                    }
                ]
            },
            "label_filename '../outside/secret' of output 'OUT' is outside the model's folder",
        ),
        (
            "input_data_file",
            {
                "model_warmup": [
                    {
                        "name": "w",
                        "batch_size": 1,
                        "inputs": {
                            "IN": {
                                "data_type": "TYPE_FP32",
                                "dims": [2],
                                "input_data_file": "../../outside/secret",
                            }
                        },
                    }
                ]
            },
            "input_data_file '../../outside/secret' is outside the model's warmup folder",
        ),
        (
            "EXECUTION_ENV_PATH",
            {"parameters": {"EXECUTION_ENV_PATH": {"string_value": "/usr"}}},
            "EXECUTION_ENV_PATH '/usr' is outside the model's folder",
        ),
    ],
)
def test_every_file_a_config_override_names_is_confined(
    server: ServerProcess, field: str, config: dict[str, object], described: str
) -> None:
    message = refused_load(server, "pyid", **config)
    assert described in message, field
    identity(server)


def test_grpc_refuses_the_same_way(server: ServerProcess, layout: dict[str, Path]) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    config = json.dumps({**PYID_CONFIG, "default_model_filename": "../../../outside/probe.py"})
    with pytest.raises(InferenceServerException) as caught:
        client.load_model("pyid", config=config)
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "is outside the model's folder" in caught.value.message()
    assert not layout["marker"].exists()


@pytest.mark.parametrize("model", ["linked", "vlinked"])
def test_an_operators_own_link_in_the_repository_is_followed(
    server: ServerProcess, model: str
) -> None:
    # The repository's config names model.py (by default), through a link the operator made:
    # to a shared file (linked), or of the version folder to another model's (vlinked).
    client = httpclient.InferenceServerClient(server.url)
    client.load_model(model)
    identity(server, model)
    # A caller's config override that restates the config (its model file unchanged, by
    # default or by name) keeps the operator's link.
    for restated in (PYID_CONFIG, {**PYID_CONFIG, "default_model_filename": "model.py"}):
        client.load_model(model, config=json.dumps(restated))
        identity(server, model)
    client.unload_model(model)


def test_a_caller_cannot_aim_a_changed_name_through_an_operators_link(
    server: ServerProcess, layout: dict[str, Path]
) -> None:
    # other.py is an operator's link out of the folder that the repository's config does not
    # name: a caller's config naming it is held to the strict rule.
    client = httpclient.InferenceServerClient(server.url)
    client.load_model("linked")
    message = refused_load(server, "linked", default_model_filename="other.py")
    assert "default_model_filename 'other.py' is outside the model's folder" in message
    identity(server, "linked")
    client.unload_model("linked")


# --- file overrides --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path", ["../escape/model.py", "/../escape/x", "1/../../x", "./../escape/x", "1\\model.py"]
)
def test_a_file_override_cannot_write_outside_the_model_folder(
    server: ServerProcess, layout: dict[str, Path], path: str
) -> None:
    before = index(server)
    client = httpclient.InferenceServerClient(server.url)
    with pytest.raises(InferenceServerException) as caught:
        client.load_model(
            "fresh", config=json.dumps(PYID_CONFIG), files={f"file:{path}": b"import os\n"}
        )
    assert caught.value.status() == "400"
    assert index(server) == before
    assert override_folders(server, "fresh") == []
    assert not (overrides_root(server).parent / "escape").exists()


def test_override_folders_go_when_replaced_and_when_unloaded(
    server: ServerProcess, tmp_path: Path
) -> None:
    client = httpclient.InferenceServerClient(server.url)
    config = json.dumps({"name": "swap", **ADD_SUB_CONFIG})
    first = add_sub_model(tmp_path / "a.onnx").read_bytes()
    client.load_model("swap", config=config, files={"file:1/model.onnx": first})
    [folder] = override_folders(server, "swap")
    # A second override (one more file) replaces the first: once the version it replaced has
    # stopped (its VersionReplaced event), the first folder is gone.
    client.load_model(
        "swap", config=config, files={"file:1/model.onnx": first, "file:notes.txt": b"2"}
    )
    for _ in range(10_000):
        if events_of(server, "VersionReplaced", "swap"):
            break
    else:
        pytest.fail("the replaced version never stopped")
    [replacement] = override_folders(server, "swap")
    assert replacement != folder
    assert client.is_model_ready("swap")
    # The same override again: nothing changes, the folder stays.
    client.load_model(
        "swap", config=config, files={"file:1/model.onnx": first, "file:notes.txt": b"2"}
    )
    assert override_folders(server, "swap") == [replacement]
    # Unloaded: gone.
    client.unload_model("swap")
    assert override_folders(server, "swap") == []
    assert not client.is_model_ready("swap")


def test_a_failed_file_override_leaves_no_folder(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.url)
    config = json.dumps({"name": "broken_files", **ADD_SUB_CONFIG})
    with pytest.raises(InferenceServerException):
        client.load_model(
            "broken_files", config=config, files={"file:1/model.onnx": b"not an onnx model"}
        )
    assert override_folders(server, "broken_files") == []


def test_a_restart_keeps_the_folder_it_restores_and_an_unload_then_removes_it(
    layout: dict[str, Path], tmp_path: Path
) -> None:
    first = start_server([layout["repo"]], tmp_path, EXPLICIT)
    env = {**EXPLICIT, "TRITONACTOR_JOURNAL": first.env["TRITONACTOR_JOURNAL"]}
    config = json.dumps({"name": "kept", **ADD_SUB_CONFIG})
    model_file = add_sub_model(tmp_path / "kept.onnx").read_bytes()
    try:
        client = httpclient.InferenceServerClient(first.url)
        client.load_model("kept", config=config, files={"file:1/model.onnx": model_file})
        [folder] = override_folders(first, "kept")
    finally:
        assert first.stop() == 0
    # What a crash could leave: a folder no load in force uses, and a half-written one.
    root = overrides_root(first)
    (root / f"ghost-{'a' * 32}" / "ghost").mkdir(parents=True)
    (root / ".0123abcd.x1y2z3.partial" / "kept" / "1").mkdir(parents=True)
    # Stopping removed nothing: the journal loads the model again from the same folder, and
    # the start swept away what no load in force uses.
    second = start_server([layout["repo"]], tmp_path, env)
    try:
        assert sorted(p.name for p in root.iterdir() if p.name != LOCK_NAME) == [folder]
        client = httpclient.InferenceServerClient(second.url)
        assert client.is_model_ready("kept")
        client.unload_model("kept")
        assert override_folders(second, "kept") == []
    finally:
        second.stop()


PID_PY = """
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        pid = pb_utils.Tensor("OUT", np.array([os.getpid()], dtype=np.int64))
        return [pb_utils.InferenceResponse([pid]) for _ in requests]
"""

PID_CONFIG = {
    **PYID_CONFIG,
    "output": [{"name": "OUT", "data_type": "TYPE_INT64", "dims": [1]}],
}


def served_pid(server: ServerProcess, model: str) -> int:
    """The pid of the python process that answered a request to `model`."""
    body = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [2], "data": [1, 2]}]}
    response = httpx.post(f"{server.base}/v2/models/{model}/infer", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return int(response.json()["outputs"][0]["data"][0])


def test_a_server_starting_beside_another_leaves_its_override_folders(
    layout: dict[str, Path], tmp_path: Path
) -> None:
    # Two servers whose journals are in one folder (journal-<port>.jsonl each): each has its
    # own override root, and one's start sweeps only its own.
    first = start_server([layout["repo"]], tmp_path, EXPLICIT)
    try:
        client = httpclient.InferenceServerClient(first.url)
        client.load_model(
            "pids", config=json.dumps(PID_CONFIG), files={"file:1/model.py": PID_PY.encode()}
        )
        [folder] = override_folders(first, "pids")
        second = start_server([layout["repo"]], tmp_path, EXPLICIT)
        assert second.stop() == 0
        assert overrides_root(second) != overrides_root(first)
        # What a crash of the second could have left: its next start removes it, and only it.
        ghost = overrides_root(second) / f"pids-{'b' * 32}"
        (ghost / "pids").mkdir(parents=True)
        env = {**EXPLICIT, "TRITONACTOR_JOURNAL": second.env["TRITONACTOR_JOURNAL"]}
        second = start_server([layout["repo"]], tmp_path, env)
        try:
            assert not ghost.exists()
        finally:
            assert second.stop() == 0
        assert override_folders(first, "pids") == [folder]
        assert (overrides_root(first) / folder / "pids" / "1" / "model.py").is_file()
        # The first server still starts the model's process from its folder when one dies.
        killed = served_pid(first, "pids")
        os.kill(killed, signal.SIGKILL)
        assert served_pid(first, "pids") != killed
        client.unload_model("pids")
        assert override_folders(first, "pids") == []
    finally:
        first.stop()


def test_a_server_sharing_a_journal_does_not_sweep_while_the_other_runs(
    layout: dict[str, Path], tmp_path: Path
) -> None:
    # Two servers given one journal share its override root: the second's start leaves even
    # what no load in force uses (the first may be writing it); a start alone sweeps it.
    first = start_server([layout["repo"]], tmp_path, EXPLICIT)
    env = {**EXPLICIT, "TRITONACTOR_JOURNAL": first.env["TRITONACTOR_JOURNAL"]}
    root = overrides_root(first)
    ghost = root / f"ghost-{'c' * 32}"
    (ghost / "ghost").mkdir(parents=True)
    try:
        second = start_server([layout["repo"]], tmp_path, env)
        try:
            assert ghost.is_dir()
        finally:
            assert second.stop() == 0
    finally:
        assert first.stop() == 0
    alone = start_server([layout["repo"]], tmp_path, env)
    try:
        assert not ghost.exists()
    finally:
        alone.stop()
