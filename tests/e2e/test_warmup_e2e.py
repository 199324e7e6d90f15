"""Model warmup behind the real server: every instance of a python model runs the config's warmup
samples (through its stub process) before the model is READY, and again when it replaces an
instance that crashed; a warmup that cannot be built, or that fails, fails the load with its
reason in the repository index."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.onnx_models import add_sub_model
from tests.server_process import ServerProcess, start_server

pytestmark = pytest.mark.e2e

MODELS = Path(__file__).resolve().parent.parent / "python_models"
COUNTER = "warmup_counter"

# Three broken warmups of the `faulty` model (INPUT0 = 0: execute raises; 1: an error response).
FAULTY = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] }} ]
model_warmup [ {{ name: "{sample}" batch_size: 1 inputs {{ key: "{input}" value: {{
  data_type: TYPE_INT32 dims: [ 1 ] {data} }} }} }} ]
"""
BROKEN = {
    "warmup_unknown_input": ("typo", "INPUT_0", "zero_data: true"),
    "warmup_raises": ("zeros", "INPUT0", "zero_data: true"),
    "warmup_refused": ("ones", "INPUT0", 'input_data_file: "one.bin"'),
}

# A real ONNX Runtime model: its warmup batch of 4 requests goes through the worker-thread path.
ONNX = """
name: "onnx_warmed"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
]
model_warmup [ { name: "random" batch_size: 4 count: 2
  inputs { key: "INPUT0" value: { data_type: TYPE_INT32 dims: [ 16 ] random_data: true } }
  inputs { key: "INPUT1" value: { data_type: TYPE_INT32 dims: [ 16 ] zero_data: true } } } ]
"""

T = TypeVar("T")


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 60) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = probe()
        if result is not None:
            return result
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def build_repository(repo: Path) -> None:
    shutil.copytree(MODELS / COUNTER, repo / COUNTER)
    for name, (sample, input_name, data) in BROKEN.items():
        (repo / name / "1").mkdir(parents=True)
        shutil.copy(MODELS / "faulty" / "1" / "model.py", repo / name / "1" / "model.py")
        config = FAULTY.format(name=name, sample=sample, input=input_name, data=data)
        (repo / name / "config.pbtxt").write_text(config)
    (repo / "warmup_refused" / "warmup").mkdir()
    (repo / "warmup_refused" / "warmup" / "one.bin").write_bytes(np.int32(1).tobytes())
    add_sub_model(repo / "onnx_warmed" / "1" / "model.onnx")
    (repo / "onnx_warmed" / "config.pbtxt").write_text(ONNX)


def index_by_name(client: httpclient.InferenceServerClient) -> dict[str, dict[str, Any]]:
    # The version's entry, when there is one: it carries the load's state and reason.
    entries: dict[str, dict[str, Any]] = {}
    for entry in client.get_model_repository_index():
        if entry.get("version") or entry["name"] not in entries:
            entries[entry["name"]] = entry
    return entries


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("warmup_repo")
    build_repository(repo)
    return repo


@pytest.fixture(scope="module")
def server(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    # Not ready by design (three models fail to load): wait for every load to settle.
    process = start_server(
        [repository],
        tmp_path_factory.mktemp("warmup_server"),
        {"TRITONACTOR_EXIT_ON_ERROR": "false"},
        wait_ready=False,
    )
    client = httpclient.InferenceServerClient(process.url)
    names = {COUNTER, "onnx_warmed", *BROKEN}

    def settled() -> bool | None:
        states = {name: entry.get("state") for name, entry in index_by_name(client).items()}
        done = all(states.get(name) in ("READY", "UNAVAILABLE") for name in names)
        return True if done else None

    wait_for("every model to load or fail", settled)
    yield process
    process.stop()


@pytest.fixture
def http(server: ServerProcess) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(server.url)


def records(repository: Path, instance: str) -> list[dict[str, Any]]:
    path = repository / COUNTER / f"record_{instance}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def assert_warmup_sequence(executes: list[dict[str, Any]]) -> None:
    """The config's samples, in order: `zeros` (batch 2) three times, `from_files`, `random`;
    `skipped` (batch_size 0) never."""
    assert [len(execute["requests"]) for execute in executes] == [2, 2, 2, 1, 1]
    for execute in executes[:3]:
        for request in execute["requests"]:
            assert request == {"INPUT0": [[0.0, 0.0, 0.0]], "TEXT": ["", ""], "TEXT_SHAPE": [1, 2]}
    [from_files] = executes[3]["requests"]
    assert from_files == {
        "INPUT0": [[1.5, 2.5, 3.5]],
        "TEXT": ["hello", "warmup"],
        "TEXT_SHAPE": [1, 2],
    }
    [random] = executes[4]["requests"]
    assert all(0.0 <= value < 1.0 for value in random["INPUT0"][0])
    assert random["TEXT"] == ["", ""]  # random BYTES fall back to zero data, as in Triton


def infer(client: httpclient.InferenceServerClient, first: float) -> httpclient.InferResult:
    data = np.array([[first, 0.0, 0.0]], np.float32)
    text = np.array([[b"a", b"b"]], dtype=object)
    inputs = [
        httpclient.InferInput("INPUT0", [1, 3], "FP32"),
        httpclient.InferInput("TEXT", [1, 2], "BYTES"),
    ]
    inputs[0].set_data_from_numpy(data)
    inputs[1].set_data_from_numpy(text)
    return client.infer(COUNTER, inputs)


def test_every_instance_ran_its_warmup_before_the_model_was_ready(
    http: httpclient.InferenceServerClient, repository: Path
) -> None:
    assert http.is_model_ready(COUNTER)
    for instance in (f"{COUNTER}_0_0", f"{COUNTER}_0_1"):
        assert_warmup_sequence(records(repository, instance))
    # The first request served comes after the 5 warmup executes (8 requests) of its instance.
    result = infer(http, 7.0)
    assert result.as_numpy("EXECUTES").tolist() == [[6]]
    assert result.as_numpy("REQUESTS").tolist() == [[9]]


def test_an_instance_restarted_after_a_crash_is_warmed_up_again(
    http: httpclient.InferenceServerClient, repository: Path
) -> None:
    instances = (f"{COUNTER}_0_0", f"{COUNTER}_0_1")
    before = {instance: len(records(repository, instance)) for instance in instances}
    with pytest.raises(InferenceServerException):
        infer(http, -1.0)  # the instance that takes it exits

    def restarted() -> tuple[str, list[dict[str, Any]]] | None:
        for instance in instances:
            executes = records(repository, instance)
            pids = [execute["pid"] for execute in executes]
            new = [execute for execute in executes if execute["pid"] != pids[0]]
            if len(new) == 5:
                return instance, executes
        return None

    instance, executes = wait_for("the crashed instance to be replaced", restarted)
    assert len(executes) == before[instance] + 5
    assert_warmup_sequence(executes[-5:])
    wait_for("the model to be ready again", lambda: http.is_model_ready(COUNTER) or None)
    assert infer(http, 7.0).as_numpy("EXECUTES")[0][0] >= 6


def test_a_failing_warmup_fails_the_load_with_its_reason_in_the_index(
    http: httpclient.InferenceServerClient,
) -> None:
    entries = index_by_name(http)
    for name in BROKEN:
        assert entries[name]["state"] == "UNAVAILABLE", entries[name]
        assert not http.is_model_ready(name)
    # An input the model does not have is sent as given, as Triton's warmup sends it; the one
    # the model requires is then missing.
    assert entries["warmup_unknown_input"]["reason"] == (
        "warmup 'typo' of model 'warmup_unknown_input': missing required input(s) ['INPUT0']; "
        "a warmup sample gives every input the model requires"
    )
    raised = entries["warmup_raises"]["reason"]
    assert raised.startswith("warmup 'zeros' of model 'warmup_raises' failed: ")
    assert "the model was asked to fail" in raised
    # The value 1 came from the sample's file: the model answered it with an error response.
    assert entries["warmup_refused"]["reason"] == (
        "warmup 'ones' of model 'warmup_refused' failed: one is not allowed"
    )


def test_an_onnx_model_is_warmed_up_too(
    http: httpclient.InferenceServerClient, server: ServerProcess
) -> None:
    assert http.is_model_ready("onnx_warmed")
    # No instance_group: two CPU instances, as Triton counts them for ONNX Runtime, each warmed.
    for instance in ("onnx_warmed_0", "onnx_warmed_1"):
        assert f"model 'onnx_warmed' instance '{instance}' ran warmup 'random' 2 time(s)" in (
            server.log()
        )
    # Its executes count, as Triton 2.51 counts its warmup's: 2 instances x 2 times, batches
    # of 4 requests.
    [stats] = http.get_inference_statistics("onnx_warmed")["model_stats"]
    assert (stats["inference_count"], stats["execution_count"]) == (16, 4)
    assert stats["inference_stats"]["success"]["count"] == 16
    assert [(b["batch_size"], b["compute_infer"]["count"]) for b in stats["batch_stats"]] == [
        (4, 4)
    ]
    assert stats["last_inference"] > 0
