"""How the server reads model repositories, each case with a server of its own: several
repositories, names that clash, configs that do not parse or do not fit, version folders and
policies, model file names, strict model configuration, and settings it must refuse."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.e2e.conftest import SIMPLE_CONFIG, write_config
from tests.onnx_models import add_sub_model, identity_model
from tests.server_process import ServerProcess, free_port, start_server

pytestmark = pytest.mark.e2e

PROJECT_ROOT = Path(__file__).resolve().parents[2]

IDENTITY_CONFIG = """
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: {max_batch_size}
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 4 ] }} ]
"""


def add_model(
    repo: Path, name: str, versions: tuple[int | str, ...] = (1,), config: str | None = ""
) -> Path:
    """An INT32 [batch, 4] identity with a config (`config` None: none; "": the default one)."""
    model = repo / name
    for version in versions:
        identity_model(model / str(version) / "model.onnx", "INT32", ["batch", 4])
    if config is not None:
        write_config(model, config or IDENTITY_CONFIG.format(name=name, max_batch_size=4))
    return model


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Any]:
    """Starts servers for one test and stops them after it."""
    started: list[ServerProcess] = []

    def start(repositories: list[Path], **env: str) -> ServerProcess:
        log_dir = tmp_path / f"server{len(started)}"
        log_dir.mkdir()
        server = start_server(repositories, log_dir, extra_env=env, wait_ready=False)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def index(server: ServerProcess) -> dict[str, list[dict[str, Any]]]:
    entries = httpx.post(f"{server.base}/v2/repository/index", content=b"{}").json()
    by_name: dict[str, list[dict[str, Any]]] = {}
    for entry in entries:
        by_name.setdefault(entry["name"], []).append(entry)
    return by_name


def unavailable_reason(server: ServerProcess, name: str) -> str:
    (entry,) = index(server)[name]
    assert entry["state"] == "UNAVAILABLE", entry
    return entry["reason"]


def infer(server: ServerProcess, name: str, version: str = "") -> dict[str, Any]:
    """An identity request; raises InferenceServerException when refused."""
    client = httpclient.InferenceServerClient(server.url)
    data = np.array([[1, 2, 3, 4]], dtype=np.int32)
    tensor = httpclient.InferInput("INPUT0", [1, 4], "INT32")
    tensor.set_data_from_numpy(data)
    try:
        result = client.infer(name, [tensor], model_version=version)
    finally:
        client.close()
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)
    return result.get_response()


def test_several_repositories_serve_together(tmp_path: Path, serve: Any) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    add_model(first, "alpha")
    add_model(second, "beta")

    server = serve([first, second])  # TRITONACTOR_MODEL_REPOSITORY=a,b

    assert server.env["TRITONACTOR_MODEL_REPOSITORY"] == f"{first},{second}"
    assert index(server) == {
        "alpha": [{"name": "alpha", "version": "1", "state": "READY"}],
        "beta": [{"name": "beta", "version": "1", "state": "READY"}],
    }
    assert infer(server, "alpha")["model_name"] == "alpha"
    assert infer(server, "beta")["model_name"] == "beta"
    assert httpx.get(f"{server.base}/v2/health/ready").status_code == 200


def test_strict_readiness_waits_only_for_a_model_triton_would_have(
    tmp_path: Path, serve: Any
) -> None:
    # A config that does not parse: refused before any version, nothing to wait for (200).
    # A config whose policy selects no version (no version folder): Triton has the model with
    # no version, and is not ready (400). Both: 400.
    repo = tmp_path / "models"
    add_model(repo, "alpha")
    (repo / "garbled").mkdir()
    (repo / "garbled" / "config.pbtxt").write_text("max_batch_size: [")
    server = serve([repo], TRITONACTOR_EXIT_ON_ERROR="false")
    assert unavailable_reason(server, "garbled")
    assert httpx.get(f"{server.base}/v2/health/ready").status_code == 200
    write_config(repo / "empty", IDENTITY_CONFIG.format(name="empty", max_batch_size=4))
    server = serve([repo], TRITONACTOR_EXIT_ON_ERROR="false")
    assert unavailable_reason(server, "empty") == (
        "at least one version must be available under the version policy of model 'empty'"
    )
    assert httpx.get(f"{server.base}/v2/health/ready").status_code == 400


def test_a_repository_given_twice_serves_each_model_once(tmp_path: Path, serve: Any) -> None:
    # The same folder twice is one repository (Triton's when it is the same text; here every
    # spelling of the folder, `a` and `a/.`, counts once).
    add_model(tmp_path / "a", "alpha")
    server = serve([tmp_path / "a", tmp_path / "a" / "."])
    assert index(server) == {"alpha": [{"name": "alpha", "version": "1", "state": "READY"}]}
    assert infer(server, "alpha")["model_name"] == "alpha"


def test_a_name_in_two_repositories_is_served_from_neither(tmp_path: Path, serve: Any) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    add_model(first, "alpha")
    add_model(first, "twice")
    add_model(second, "twice")
    add_model(second, "beta")

    server = serve([first, second], TRITONACTOR_EXIT_ON_ERROR="false")

    assert unavailable_reason(server, "twice") == "model appears in two or more repositories"
    response = httpx.post(
        f"{server.base}/v2/models/twice/infer",
        json={
            "inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "INT32", "data": [1] * 4}]
        },
    )
    assert response.status_code == 404
    assert response.json() == {
        "error": "Request for unknown model: 'twice' has no available versions"
    }
    infer(server, "alpha")
    infer(server, "beta")
    # As Triton's: a model refused before any version was tried holds no version to wait for.
    assert httpx.get(f"{server.base}/v2/health/ready").status_code == 200


def test_config_name_must_match_its_folder(tmp_path: Path, serve: Any) -> None:
    repo = tmp_path / "models"
    add_model(repo, "right", config=IDENTITY_CONFIG.format(name="wrong", max_batch_size=4))
    add_model(repo, "fine")

    server = serve([repo], TRITONACTOR_EXIT_ON_ERROR="false")

    reason = unavailable_reason(server, "right")
    assert (
        "'wrong'" in reason
        and "'right'" in reason
        and "directory name must equal model name" in reason
    )
    infer(server, "fine")
    assert httpx.get(f"{server.base}/v2/models/right").status_code == 404


def test_config_syntax_error_names_line_and_column(tmp_path: Path, serve: Any) -> None:
    repo = tmp_path / "models"
    text = 'name: "typo"\nplatform: "onnxruntime_onnx"\nmax_batch_size 4 4\n'
    add_model(repo, "typo", config=text)
    add_model(repo, "fine")

    server = serve([repo], TRITONACTOR_EXIT_ON_ERROR="false")

    reason = unavailable_reason(server, "typo")
    assert f"{repo / 'typo' / 'config.pbtxt'}:3:" in reason, reason
    infer(server, "fine")


def test_version_folders_and_policies(tmp_path: Path, serve: Any) -> None:
    repo = tmp_path / "models"
    # "01" and "abc" are not versions (Triton skips a leading zero); "0" is one.
    add_model(repo, "folders", versions=(0, "01", "abc", 3), config=_policy("folders", "all { }"))
    add_model(repo, "every", versions=(1, 2, 3), config=_policy("every", "all { }"))
    add_model(
        repo,
        "latest_two",
        versions=(1, 2, 3),
        config=_policy("latest_two", "latest { num_versions: 2 }"),
    )
    add_model(repo, "default", versions=(1, 2, 10))  # latest { num_versions: 1 }: 10, not 2

    server = serve([repo])

    versions = {
        name: [entry["version"] for entry in entries if entry["state"] == "READY"]
        for name, entries in index(server).items()
    }
    assert versions == {
        "default": ["10"],
        "every": ["1", "2", "3"],
        "folders": ["0", "3"],
        "latest_two": ["2", "3"],
    }
    client = httpclient.InferenceServerClient(server.url)
    assert client.get_model_metadata("folders")["versions"] == ["0", "3"]
    assert client.get_model_metadata("latest_two")["versions"] == ["2", "3"]
    client.close()
    assert infer(server, "folders", "0")["model_version"] == "0"
    assert infer(server, "latest_two")["model_version"] == "3"  # the highest ready version
    assert infer(server, "latest_two", "2")["model_version"] == "2"
    assert infer(server, "default")["model_version"] == "10"
    response = httpx.get(f"{server.base}/v2/models/latest_two/versions/1")
    assert response.json() == {
        "error": "Request for unknown model: 'latest_two' version 1 is not found"
    }
    assert httpx.get(f"{server.base}/v2/models/folders/versions/01").status_code == 404


def _policy(name: str, policy: str) -> str:
    return IDENTITY_CONFIG.format(name=name, max_batch_size=4) + f"version_policy {{ {policy} }}\n"


def test_default_model_filename(tmp_path: Path, serve: Any) -> None:
    repo = tmp_path / "models"
    identity_model(repo / "custom" / "1" / "weights.onnx", "INT32", ["batch", 4])
    write_config(
        repo / "custom",
        IDENTITY_CONFIG.format(name="custom", max_batch_size=4)
        + 'default_model_filename: "weights.onnx"\n',
    )
    add_model(
        repo,
        "missing_file",
        config=IDENTITY_CONFIG.format(name="missing_file", max_batch_size=4)
        + 'default_model_filename: "absent.onnx"\n',
    )

    server = serve([repo], TRITONACTOR_EXIT_ON_ERROR="false")

    infer(server, "custom")
    config = httpx.get(f"{server.base}/v2/models/custom/config").json()
    assert config["default_model_filename"] == "weights.onnx"
    entries = index(server)["missing_file"]
    assert all(entry["state"] == "UNAVAILABLE" for entry in entries)
    assert any("absent.onnx" in entry["reason"] for entry in entries), entries


def test_fixed_first_dimension_cannot_batch(tmp_path: Path, serve: Any) -> None:
    repo = tmp_path / "models"
    identity_model(repo / "fixed" / "1" / "model.onnx", "INT32", [3, 4])
    write_config(repo / "fixed", IDENTITY_CONFIG.format(name="fixed", max_batch_size=8))
    identity_model(repo / "fixed_nobatch" / "1" / "model.onnx", "INT32", [3, 4])
    write_config(
        repo / "fixed_nobatch",
        IDENTITY_CONFIG.format(name="fixed_nobatch", max_batch_size=0).replace("[ 4 ]", "[ 3, 4 ]"),
    )

    server = serve([repo], TRITONACTOR_EXIT_ON_ERROR="false")

    reason = unavailable_reason(server, "fixed")
    assert "max_batch_size 8" in reason and "fixed first dimension 3" in reason, reason
    (entry,) = index(server)["fixed_nobatch"]
    assert entry["state"] == "READY"


def test_strict_model_config(tmp_path: Path, serve: Any) -> None:
    repo = tmp_path / "models"
    add_sub_model(repo / "no_config" / "1" / "model.onnx")
    add_sub_model(repo / "with_config" / "1" / "model.onnx")
    write_config(repo / "with_config", SIMPLE_CONFIG.format(name="with_config", max_batch_size=8))

    strict = serve(
        [repo], TRITONACTOR_STRICT_MODEL_CONFIG="true", TRITONACTOR_EXIT_ON_ERROR="false"
    )

    reason = unavailable_reason(strict, "no_config")
    assert "config.pbtxt" in reason and "TRITONACTOR_STRICT_MODEL_CONFIG" in reason, reason
    assert index(strict)["with_config"][0]["state"] == "READY"

    lenient = serve([repo], TRITONACTOR_STRICT_MODEL_CONFIG="false")

    assert index(lenient)["no_config"] == [{"name": "no_config", "version": "1", "state": "READY"}]
    config = httpx.get(f"{lenient.base}/v2/models/no_config/config").json()
    assert config["max_batch_size"] == 4  # auto-completed from the ONNX model
    assert [(t["name"], t["dims"]) for t in config["input"]] == [("INPUT0", [16]), ("INPUT1", [16])]


# --- settings the server must refuse -----------------------------------------------------------

BAD_SETTINGS = [
    pytest.param("TRITONACTOR_NO_SUCH_SETTING", "1", id="unknown-setting"),
    pytest.param("TRITONACTOR_STRICT_MODEL_CONFIG", "maybe", id="bad-boolean"),
    pytest.param("TRITONACTOR_LOG_VERBOSE", "loud", id="bad-integer"),
    pytest.param("TRITONACTOR_MODEL_REPOSITORY", "/no/such/repository", id="missing-repository"),
]


def run_server(
    command: list[str], tmp_path: Path, variable: str, value: str
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRITONACTOR_")}
    env.update(
        {
            "TRITONACTOR_MODEL_REPOSITORY": str(tmp_path),
            "TRITONACTOR_JOURNAL": str(tmp_path / "journal.jsonl"),
            variable: value,
        }
    )
    # From the project root, as the other servers start: the package must be importable.
    return subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=60, cwd=PROJECT_ROOT
    )


def hypercorn(*options: str) -> list[str]:
    bind = f"127.0.0.1:{free_port()}"
    return [sys.executable, "-m", "hypercorn", *options, "tritonactor.app:app", "--bind", bind]


@pytest.mark.parametrize(("variable", "value"), BAD_SETTINGS)
@pytest.mark.parametrize(
    "command",
    [
        pytest.param(["serve"], id="tritonactor-serve"),
        # One process: hypercorn's own exit status then is the app's (see the xfail below).
        pytest.param(["hypercorn", "--workers", "0"], id="hypercorn-in-process"),
    ],
)
def test_bad_setting_stops_the_server(
    tmp_path: Path, command: list[str], variable: str, value: str
) -> None:
    if command[0] == "serve":
        argv = [sys.executable, "-m", "tritonactor.cli", "serve", "--http-port", str(free_port())]
    else:
        argv = hypercorn(*command[1:])

    finished = run_server(argv, tmp_path, variable, value)

    output = finished.stdout + finished.stderr
    assert finished.returncode != 0, output
    assert variable in output
    assert "Traceback" not in output  # a message, not a crash


@pytest.mark.xfail(
    strict=True,
    reason="hypercorn 0.18 exits 0 when its worker process fails to start (pgjones/hypercorn "
    "#269); `tritonactor serve` checks the settings before it starts hypercorn",
)
def test_bad_setting_stops_plain_hypercorn_with_a_failure_status(tmp_path: Path) -> None:
    finished = run_server(hypercorn(), tmp_path, "TRITONACTOR_NO_SUCH_SETTING", "1")
    assert "TRITONACTOR_NO_SUCH_SETTING" in finished.stdout + finished.stderr
    assert finished.returncode != 0
