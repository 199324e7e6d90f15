"""An ensemble's statistics as Triton 2.51 keeps them: its compute times are its steps' summed,
and a request counts once every step's execute is over, even a decoupled step that goes on
executing after its last response (its client has its answer then). A real server, python
models, a gRPC stream (tritonclient), the statistics API read back."""

from __future__ import annotations

import queue
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.server_process import start_server

pytestmark = pytest.mark.e2e

# A bound on waiting for an event; reaching it is a failure.
EVENT_TIMEOUT_S = 60.0

LINGERING = '''
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Decoupled: one response with the final flag, then its execute goes on until the file
    GATE exists (a test's switch)."""

    def execute(self, requests):
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            out = pb_utils.Tensor("OUT", value.astype(np.float32))
            request.get_response_sender().send(
                pb_utils.InferenceResponse([out]),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )
        while not os.path.exists(GATE):
            time.sleep(0.01)
        return None
'''
LINGERING_CONFIG = """
name: "lingering"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
ENSEMBLE_CONFIG = """
name: "ens"
platform: "ensemble"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [ { model_name: "lingering" model_version: -1
  input_map { key: "IN" value: "X" } output_map { key: "OUT" value: "Y" } } ] }
"""


def write(repo: Path, gate: Path) -> None:
    (repo / "lingering" / "1").mkdir(parents=True)
    (repo / "lingering" / "1" / "model.py").write_text(f"GATE = {str(gate)!r}\n{LINGERING}")
    (repo / "lingering" / "config.pbtxt").write_text(LINGERING_CONFIG)
    (repo / "ens" / "1").mkdir(parents=True)
    (repo / "ens" / "config.pbtxt").write_text(ENSEMBLE_CONFIG)


def inference_stats(base: str, model: str) -> dict:
    response = httpx.get(f"{base}/v2/models/{model}/stats", timeout=30)
    assert response.status_code == 200, response.text
    return response.json()["model_stats"][0]["inference_stats"]


def test_an_ensemble_counts_a_decoupled_step_once_its_execute_is_over(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    gate = tmp_path / "gate"
    write(repo, gate)
    server = start_server([repo], tmp_path)
    answers: queue.Queue = queue.Queue()
    try:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        tensor = grpcclient.InferInput("X", [4], "FP32")
        tensor.set_data_from_numpy(np.arange(4, dtype=np.float32))
        client.async_stream_infer("ens", [tensor], request_id="1")
        result, error = answers.get(timeout=EVENT_TIMEOUT_S)
        assert error is None, error
        np.testing.assert_array_equal(result.as_numpy("Y"), np.arange(4, dtype=np.float32))
        # The client has its answer; the step still executes: the ensemble has not counted it.
        assert inference_stats(server.base, "ens")["success"]["count"] == 0
        gate.touch()
        deadline = time.monotonic() + EVENT_TIMEOUT_S
        while inference_stats(server.base, "lingering")["success"]["count"] == 0:
            assert time.monotonic() < deadline, "the step never counted its request"
            time.sleep(0.05)
        while (ensemble := inference_stats(server.base, "ens"))["success"]["count"] == 0:
            assert time.monotonic() < deadline, "the ensemble never counted its request"
            time.sleep(0.05)
        step = inference_stats(server.base, "lingering")
        for part in ("compute_input", "compute_infer", "compute_output"):
            assert ensemble[part]["count"] == 1
            assert ensemble[part]["ns"] == step[part]["ns"], part  # one step: its own times
        client.stop_stream()
        client.close()
    finally:
        gate.touch()
        server.stop()
