"""Passive instance groups (`passive: true`) against a real server, as Triton has them: their
instances are created and initialized, and never given a request; a model whose groups are all
passive is refused at load with the reason (Triton 2.51 loads it and crashes on its first
request)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.server_process import ServerProcess, start_server, wait_for

MODEL = """
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_instance_name"]
        # Each instance made says so: passive ones are made too.
        folder = os.path.join(args["model_repository"], "made")
        os.makedirs(folder, exist_ok=True)
        open(os.path.join(folder, self.name), "w").close()

    def execute(self, requests):
        name = np.array([self.name.encode()], dtype=np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("NAME", name)]) for _ in requests]
"""


def config(groups: str) -> str:
    return f"""
backend: "python"
max_batch_size: 0
input [{{ name: "IN", data_type: TYPE_FP32, dims: [ 1 ] }}]
output [{{ name: "NAME", data_type: TYPE_STRING, dims: [ 1 ] }}]
instance_group [ {groups} ]
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("passive") / "models"
    groups = {
        "passive_mix": "{ count: 2, kind: KIND_CPU, passive: true }, { count: 1, kind: KIND_CPU }",
        "all_passive": "{ count: 1, kind: KIND_CPU, passive: true }",
    }
    for name, group in groups.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(config(group))
        (root / name / "1" / "model.py").write_text(MODEL)
    return root


@pytest.fixture(scope="module")
def server(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    env = {"TRITONACTOR_STRICT_READINESS": "false", "TRITONACTOR_EXIT_ON_ERROR": "false"}
    process = start_server([repo], tmp_path_factory.mktemp("passive-server"), env)
    client = httpclient.InferenceServerClient(process.url)
    wait_for(lambda: client.is_model_ready("passive_mix"), 60, process.log)
    yield process
    process.stop()


def served_by(server: ServerProcess) -> str:
    client = httpclient.InferenceServerClient(server.url)
    tensor = httpclient.InferInput("IN", [1], "FP32")
    tensor.set_data_from_numpy(np.zeros(1, dtype=np.float32))
    return client.infer("passive_mix", [tensor]).as_numpy("NAME")[0].decode()


def test_passive_instances_are_made_and_given_no_request(server: ServerProcess, repo: Path) -> None:
    made = sorted(path.name for path in (repo / "passive_mix" / "made").iterdir())
    assert made == ["passive_mix_0_0", "passive_mix_0_1", "passive_mix_1_0"]
    # Many at once: with three instances serving they would spread over all three.
    with ThreadPoolExecutor(8) as pool:
        names = set(pool.map(lambda _: served_by(server), range(24)))
    assert names == {"passive_mix_1_0"}
    config = httpx.get(f"{server.base}/v2/models/passive_mix/config").json()
    assert [group.get("passive", False) for group in config["instance_group"]] == [True, False]


def test_a_model_whose_groups_are_all_passive_is_refused_with_the_reason(
    server: ServerProcess,
) -> None:
    index = httpx.post(f"{server.base}/v2/repository/index", json={}).json()
    (entry,) = [e for e in index if e["name"] == "all_passive"]
    assert entry["state"] == "UNAVAILABLE"
    assert "every instance group of model all_passive is passive" in entry["reason"]
    assert not httpclient.InferenceServerClient(server.url).is_model_ready("all_passive")
