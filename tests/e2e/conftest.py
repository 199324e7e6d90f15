"""Shared end-to-end fixtures: a generated model repository and a real server process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.onnx_models import add_sub_model, identity_model, string_identity_model
from tests.server_process import ServerProcess, start_server

SIMPLE_CONFIG = """
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: {max_batch_size}
input [
  {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }},
  {{ name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }}
]
output [
  {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] }},
  {{ name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] }}
]
"""


def write_config(model_dir: Path, text: str) -> None:
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(text)


def build_repository(root: Path) -> Path:
    """A Triton repository exercising the foundation: batching and non-batching add/sub, a model
    with no config (auto-complete), BYTES and FP16 identities, several versions, a broken model."""
    repo = root / "models"
    add_sub_model(repo / "simple" / "1" / "model.onnx")
    write_config(repo / "simple", SIMPLE_CONFIG.format(name="simple", max_batch_size=8))

    add_sub_model(repo / "simple_nobatch" / "1" / "model.onnx", batch=False)
    write_config(
        repo / "simple_nobatch", SIMPLE_CONFIG.format(name="simple_nobatch", max_batch_size=0)
    )

    add_sub_model(repo / "autocomplete" / "1" / "model.onnx", datatype="FP32")

    string_identity_model(repo / "strings" / "1" / "model.onnx")
    identity_model(repo / "half" / "1" / "model.onnx", "FP16", ["batch", 4])

    for version in (1, 2, 3):
        add_sub_model(repo / "versioned" / str(version) / "model.onnx")
    write_config(
        repo / "versioned",
        SIMPLE_CONFIG.format(name="versioned", max_batch_size=8)
        + "version_policy { specific { versions: [1, 3] } }\n",
    )

    add_sub_model(repo / "two_instances" / "1" / "model.onnx")
    write_config(
        repo / "two_instances",
        SIMPLE_CONFIG.format(name="two_instances", max_batch_size=8)
        + "instance_group [ { count: 2 kind: KIND_CPU } ]\n",
    )

    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "1" / "model.onnx").write_bytes(b"this is not an onnx model")
    write_config(repo / "broken", 'name: "broken"\nplatform: "onnxruntime_onnx"\n')
    return repo


@pytest.fixture(scope="session")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_repository(tmp_path_factory.mktemp("repo"))


@pytest.fixture(scope="session")
def server(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server for the read-mostly tests. Not ready by design (it has a broken model), so it
    waits for liveness and then for the good models."""
    process = start_server([repository], tmp_path_factory.mktemp("server"), wait_ready=False)
    yield process
    process.stop()
