"""Request priorities over the wire (docs/scheduling.md): with `priority_levels`, the requests
that wait in the dynamic batcher run by their `priority` parameter, set by tritonclient over
HTTP and gRPC, not by their arrival."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.e2e.conftest import gated_order_repository
from tests.server_process import ServerProcess, start_server

pytestmark = pytest.mark.e2e

PATIENCE_S = 60


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    root = tmp_path_factory.mktemp("priorities")
    repo, gate = gated_order_repository(root)
    process = start_server([repo], root)
    yield process, gate
    process.stop()


def tag(module: Any, value: str) -> list[Any]:
    tensor = module.InferInput("TAG", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[value.encode()]], dtype=np.object_))
    return [tensor]


def pending(server: ServerProcess) -> int:
    text = httpx.get(f"{server.base}/metrics", timeout=10).text
    found = re.search(
        r'nv_inference_pending_request_count\{[^}]*model="gated_order"[^}]*\} (\S+)', text
    )
    return int(float(found.group(1))) if found else 0


def wait_for(condition: Any, what: str) -> None:
    deadline = time.monotonic() + PATIENCE_S
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_waiting_requests_run_by_priority(
    server: tuple[ServerProcess, Path], protocol: str
) -> None:
    process, gate = server
    gate.unlink(missing_ok=True)
    Path(f"{gate}.entered").unlink(missing_ok=True)
    module: Any = httpclient if protocol == "http" else grpcclient
    url = process.url if protocol == "http" else process.grpc_url

    def infer(value: str, priority: int) -> int:
        client = module.InferenceServerClient(url)
        result = client.infer("gated_order", tag(module, value), priority=priority)
        return int(result.as_numpy("ORDER").reshape(-1)[0])

    with ThreadPoolExecutor(8) as pool:
        blocker = pool.submit(infer, "block", 0)
        wait_for(lambda: Path(f"{gate}.entered").exists(), "the blocker never ran")
        # Low priority first, then high: they wait behind the blocker, in that arrival order.
        low: list[Future[int]] = []
        for index in range(3):
            low.append(pool.submit(infer, f"low{index}", 2))
            wait_for(lambda n=index: pending(process) >= n + 2, "a request did not queue")
        high = [pool.submit(infer, f"high{index}", 1) for index in range(3)]
        wait_for(lambda: pending(process) >= 7, "the high-priority requests did not queue")
        gate.touch()
        first = blocker.result(timeout=PATIENCE_S)
        high_orders = sorted(f.result(timeout=PATIENCE_S) for f in high)
        low_orders = sorted(f.result(timeout=PATIENCE_S) for f in low)

    # The blocker ran first; every high-priority request before every low-priority one.
    assert high_orders == [first + 1, first + 2, first + 3]
    assert low_orders == [first + 4, first + 5, first + 6]
