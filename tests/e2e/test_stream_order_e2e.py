"""The answers of a gRPC stream come in the order of its requests, as Triton's (for models that
are not decoupled): one that is ready waits for those before it."""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.e2e.conftest import gated_order_repository
from tests.server_process import ServerProcess, start_server

pytestmark = pytest.mark.e2e

PATIENCE_S = 60


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    root = tmp_path_factory.mktemp("stream-order")
    repo, gate = gated_order_repository(root, instances=2)  # a second instance runs on
    process = start_server([repo], root)
    yield process, gate
    process.stop()


def wait_for(condition: Any, what: str) -> None:
    deadline = time.monotonic() + PATIENCE_S
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


class GatedStream:
    """One stream to `gated_order`, whose "block" request holds an instance until the gate
    opens (the other instance runs the rest)."""

    def __init__(self, served: tuple[ServerProcess, Path]) -> None:
        process, self.gate = served
        self.gate.unlink(missing_ok=True)
        Path(f"{self.gate}.entered").unlink(missing_ok=True)
        self.client = grpcclient.InferenceServerClient(process.grpc_url)
        self.done_before = self.successes()
        self.answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.answers.put((result, error)))

    def successes(self) -> int:
        stats = self.client.get_inference_statistics("gated_order").model_stats[0]
        return int(stats.inference_stats.success.count)

    def send(self, request_id: str, value: bytes) -> None:
        tensor = grpcclient.InferInput("TAG", [1, 1], "BYTES")
        tensor.set_data_from_numpy(np.array([[value]], dtype=np.object_))
        self.client.async_stream_infer("gated_order", [tensor], request_id=request_id)

    def ran_behind(self, count: int) -> None:
        """Wait until the slow request holds its instance and `count` others have run."""
        wait_for(lambda: Path(f"{self.gate}.entered").exists(), "the slow request never ran")
        wait_for(lambda: self.successes() >= self.done_before + count, "the others did not run")

    def ids(self, count: int) -> list[str]:
        self.gate.touch()
        found = []
        for _ in range(count):
            result, error = self.answers.get(timeout=PATIENCE_S)
            assert error is None, error
            found.append(result.get_response().id)
        return found

    def close(self) -> None:
        self.gate.touch()  # (a failed test must not leave the stream held by the slow request)
        self.client.stop_stream()


def test_an_answer_ready_first_waits_for_the_requests_before_it(
    served: tuple[ServerProcess, Path],
) -> None:
    stream = GatedStream(served)
    try:
        stream.send("slow", b"block")
        stream.send("quick", b"go")
        # The quick one runs on the second instance and is answered while the slow one holds
        # the first: its answer waits.
        stream.ran_behind(1)
        assert stream.ids(2) == ["slow", "quick"]
    finally:
        stream.close()


def test_answers_held_behind_a_slow_request_do_not_stop_the_stream_reading(
    served: tuple[ServerProcess, Path],
) -> None:
    # More requests behind the slow one than the stream's window (128) holds: each leaves the
    # window once answered, so all of them run while the slow one waits; their answers wait.
    stream = GatedStream(served)
    behind = 150
    try:
        for index, value in enumerate([b"block"] + [b"go"] * behind):
            stream.send(str(index), value)
        stream.ran_behind(behind)
        assert stream.ids(behind + 1) == [str(index) for index in range(behind + 1)]
    finally:
        stream.close()
