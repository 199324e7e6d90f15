"""Unary gRPC calls under load, some of them ended by the client: `tritonactor serve` and
`hypercorn tritonactor.app:app` (each one front end beside the engine, whose lane answers
ModelInfer itself: frontends/grpc/direct.py) against the real tritonclient, from eight threads
at once.

A third of the calls are plain, a third carry a deadline of 0.5-10 ms (grpc-timeout), a third
are cancelled as soon as they are sent. Whatever the timing, each call ends in one of the
answers it may get: its own data back, DEADLINE_EXCEEDED where it had a deadline, CANCELLED
where it was cancelled; nothing else. Afterwards no request is left pending, the model's
statistics count at least the answers the clients got, the log holds no traceback, and every
connection still serves.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import write_config
from tests.onnx_models import identity_model
from tests.server_process import ServerProcess, start_serve, start_server, wait_for

THREADS = 8
CALLS = 90  # per thread and model: a third plain, a third with a deadline, a third cancelled
DEADLINES_S = (0.0005, 0.001, 0.002, 0.005, 0.01)
PATIENCE_S = 120.0
PYTHON_MODELS = Path(__file__).resolve().parent.parent / "python_models"

BATCHED_CONFIG = """
name: "onnx_batched"
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
dynamic_batching { }
"""


@pytest.fixture(scope="module", params=["serve", "hypercorn"])
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("grpc_load")
    repo = root / "models"
    shutil.copytree(PYTHON_MODELS / "identity_fp32", repo / "identity_fp32")
    identity_model(repo / "onnx_batched" / "1" / "model.onnx", "FP32", ["n", 16])
    write_config(repo / "onnx_batched", BATCHED_CONFIG)
    if request.param == "serve":
        server = start_serve(root, {}, "--workers", "1", "--model-repository", str(repo))
    else:
        server = start_server([repo], root)
    yield server
    server.stop()


def _shape(model: str) -> list[int]:
    return [1, 16] if model == "onnx_batched" else [16]


def _calls(server: ServerProcess, model: str, thread: int) -> list[tuple[int, str, Any]]:
    """One thread's calls, on a client (a connection) of its own: (mode, expected, outcome)
    where the outcome is the answer's data, or the error's status."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    outcomes: list[tuple[int, str, Any]] = []
    ended = threading.Semaphore(0)
    cancelled: list[tuple[int, Any]] = []
    try:
        for call in range(CALLS):
            data = np.full(_shape(model), thread * 1000 + call, dtype=np.float32)
            tensor = grpcclient.InferInput("INPUT0", _shape(model), "FP32")
            tensor.set_data_from_numpy(data)
            mode = call % 3
            if mode == 0:
                answer = client.infer(model, [tensor])
                outcomes.append((mode, str(data[..., 0].item()), answer.as_numpy("OUTPUT0")))
            elif mode == 1:
                try:
                    answer = client.infer(
                        model, [tensor], client_timeout=DEADLINES_S[call % len(DEADLINES_S)]
                    )
                    outcomes.append((mode, str(data[..., 0].item()), answer.as_numpy("OUTPUT0")))
                except InferenceServerException as error:
                    outcomes.append((mode, str(data[..., 0].item()), error.status()))
            else:

                def done(result: Any, error: Any, expected: float = data[..., 0].item()) -> None:
                    got = result.as_numpy("OUTPUT0") if error is None else error.status()
                    cancelled.append((expected, got))
                    ended.release()

                client.async_infer(model, [tensor], done).cancel()
        for _ in range(CALLS // 3):
            assert ended.acquire(timeout=PATIENCE_S), "a cancelled call never ended"
        outcomes += [(2, str(expected), got) for expected, got in cancelled]
        # the connection still serves
        data = np.full(_shape(model), -1.0, dtype=np.float32)
        tensor = grpcclient.InferInput("INPUT0", _shape(model), "FP32")
        tensor.set_data_from_numpy(data)
        assert np.array_equal(client.infer(model, [tensor]).as_numpy("OUTPUT0"), data)
    finally:
        client.close()
    return outcomes


def _success_count(server: ServerProcess, model: str) -> int:
    stats = httpx.get(f"{server.base}/v2/models/{model}/stats", timeout=10).json()
    return int(stats["model_stats"][0]["inference_stats"]["success"]["count"])


@pytest.mark.parametrize("model", ["identity_fp32", "onnx_batched"])
def test_calls_plain_with_deadlines_and_cancelled_each_end_as_they_may(
    served: ServerProcess, model: str
) -> None:
    before = _success_count(served, model)
    with ThreadPoolExecutor(THREADS) as pool:
        runs = [pool.submit(_calls, served, model, thread) for thread in range(THREADS)]
        outcomes = [outcome for run in runs for outcome in run.result()]

    assert len(outcomes) == THREADS * CALLS
    answered = 0
    allowed = {0: set(), 1: {"StatusCode.DEADLINE_EXCEEDED"}, 2: {"StatusCode.CANCELLED"}}
    for mode, expected, got in outcomes:
        if isinstance(got, np.ndarray):
            assert got.shape == tuple(_shape(model)), (mode, expected, got)
            assert set(got.reshape(-1).tolist()) == {float(expected)}, (mode, expected, got)
            answered += 1
        else:
            assert got in allowed[mode], (mode, expected, got)
    assert answered >= THREADS * CALLS // 3  # every plain call at least
    # the calls ended early did end early (by the client: a 0.5 ms deadline or a cancel at
    # once leave no time for the answer of most)
    ended = {got for _, _, got in outcomes if isinstance(got, str)}
    assert ended == {"StatusCode.DEADLINE_EXCEEDED", "StatusCode.CANCELLED"}, ended

    wait_for(
        lambda: served.pending(model) == 0,
        timeout=PATIENCE_S,
        describe=lambda: f"requests left pending: {served.pending(model)}",
    )
    # every answer a client got was a success the model counted (a call the client gave up
    # on may have been answered too); and the last plain call of each thread
    assert _success_count(served, model) - before >= answered + THREADS
    log = served.log()
    for word in ("Traceback", "Application error", "Server error", "Exception"):
        assert word not in log, log
