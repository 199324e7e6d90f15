"""The answers of a gRPC stream come in the order of its requests, as Triton's (for models that
are not decoupled): one that is ready waits for those before it."""

from __future__ import annotations

import queue
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.server_process import ServerProcess, start_server

pytestmark = pytest.mark.e2e

MODELS = Path(__file__).resolve().parent.parent / "python_models"
PATIENCE_S = 60


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    root = tmp_path_factory.mktemp("stream-order")
    repo = root / "repo"
    shutil.copytree(MODELS / "gated_order", repo / "gated_order")
    gate = root / "gate"
    config = repo / "gated_order" / "config.pbtxt"
    text = config.read_text().replace('string_value: ""', f'string_value: "{gate}"')
    config.write_text(text.replace("count: 1", "count: 2"))  # a second instance runs on
    process = start_server([repo], root)
    yield process, gate
    process.stop()


def wait_for(condition: Any, what: str) -> None:
    deadline = time.monotonic() + PATIENCE_S
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_an_answer_ready_first_waits_for_the_requests_before_it(
    served: tuple[ServerProcess, Path],
) -> None:
    process, gate = served
    gate.unlink(missing_ok=True)
    Path(f"{gate}.entered").unlink(missing_ok=True)
    client = grpcclient.InferenceServerClient(process.grpc_url)
    before = client.get_inference_statistics("gated_order").model_stats[0]
    done_before = before.inference_stats.success.count
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for request_id, value in (("slow", b"block"), ("quick", b"go")):
            tensor = grpcclient.InferInput("TAG", [1, 1], "BYTES")
            tensor.set_data_from_numpy(np.array([[value]], dtype=np.object_))
            client.async_stream_infer("gated_order", [tensor], request_id=request_id)
        wait_for(lambda: Path(f"{gate}.entered").exists(), "the slow request never ran")

        def quick_ran() -> bool:
            stats = client.get_inference_statistics("gated_order").model_stats[0]
            return stats.inference_stats.success.count >= done_before + 1

        # The quick one ran on the second instance and is answered while the slow one holds
        # the first: its answer waits.
        wait_for(quick_ran, "the quick request never ran")
        gate.touch()
        order = []
        for _ in range(2):
            result, error = answers.get(timeout=PATIENCE_S)
            assert error is None, error
            order.append(result.get_response().id)
        assert order == ["slow", "quick"]
    finally:
        gate.touch()  # (a failed test must not leave the stream held by the slow request)
        client.stop_stream()


def test_answers_held_behind_a_slow_request_do_not_stop_the_stream_reading(
    served: tuple[ServerProcess, Path],
) -> None:
    # More requests behind the slow one than the stream's window (128) holds: each leaves the
    # window once answered, so all of them run while the slow one waits; their answers wait.
    process, gate = served
    gate.unlink(missing_ok=True)
    Path(f"{gate}.entered").unlink(missing_ok=True)
    client = grpcclient.InferenceServerClient(process.grpc_url)
    before = client.get_inference_statistics("gated_order").model_stats[0]
    done_before = before.inference_stats.success.count
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    behind = 150
    try:
        for index, value in enumerate([b"block"] + [b"go"] * behind):
            tensor = grpcclient.InferInput("TAG", [1, 1], "BYTES")
            tensor.set_data_from_numpy(np.array([[value]], dtype=np.object_))
            client.async_stream_infer("gated_order", [tensor], request_id=str(index))

        def all_behind_ran() -> bool:
            stats = client.get_inference_statistics("gated_order").model_stats[0]
            return stats.inference_stats.success.count >= done_before + behind

        wait_for(all_behind_ran, "the requests behind the slow one did not all run")
        gate.touch()
        ids = []
        for _ in range(behind + 1):
            result, error = answers.get(timeout=PATIENCE_S)
            assert error is None, error
            ids.append(result.get_response().id)
        assert ids == [str(index) for index in range(behind + 1)]
    finally:
        gate.touch()  # (a failed test must not leave the stream held by the slow request)
        client.stop_stream()
