"""The dynamic batcher end to end: an ONNX model that reports the batch size it ran with, behind a
real server, answering concurrent tritonclient requests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from onnx import TensorProto, helper, numpy_helper

from tests.e2e.conftest import write_config
from tests.onnx_models import save_model
from tests.server_process import ServerProcess, start_server

CONFIG = """
name: "batch_size_probe"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 4 ] } ]
output [
  { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 4 ] },
  { name: "OUTPUT_BS" data_type: TYPE_INT64 dims: [ 1 ] }
]
instance_group [ { count: 1 kind: KIND_CPU } ]
dynamic_batching { max_queue_delay_microseconds: 600000000 }
"""
# The queue delay (ten minutes) never runs out within a test: a batch is cut only when it is
# full (8 rows), so which requests run together does not depend on when they arrive.


def batch_size_probe_model(path: Path) -> Path:
    """OUTPUT0 = INPUT0 * 2; OUTPUT_BS = [batch, 1] filled with the batch the model ran with."""
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["INPUT0", "two"], ["OUTPUT0"]),
            helper.make_node("Shape", ["INPUT0"], ["shape"]),
            helper.make_node("Slice", ["shape", "zero", "one"], ["batch"]),
            helper.make_node("Reshape", ["batch", "one_by_one"], ["batch_cell"]),
            helper.make_node("Concat", ["batch", "one"], ["target"], axis=0),
            helper.make_node("Expand", ["batch_cell", "target"], ["OUTPUT_BS"]),
        ],
        "batch_size_probe",
        [helper.make_tensor_value_info("INPUT0", TensorProto.INT32, ["batch", 4])],
        [
            helper.make_tensor_value_info("OUTPUT0", TensorProto.INT32, ["batch", 4]),
            helper.make_tensor_value_info("OUTPUT_BS", TensorProto.INT64, ["batch", 1]),
        ],
        initializer=[
            numpy_helper.from_array(np.array(2, dtype=np.int32), "two"),
            numpy_helper.from_array(np.array([0], dtype=np.int64), "zero"),
            numpy_helper.from_array(np.array([1], dtype=np.int64), "one"),
            numpy_helper.from_array(np.array([1, 1], dtype=np.int64), "one_by_one"),
        ],
    )
    return save_model(graph, path)


@pytest.fixture(scope="module")
def batching_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("batching") / "models"
    batch_size_probe_model(repo / "batch_size_probe" / "1" / "model.onnx")
    write_config(repo / "batch_size_probe", CONFIG)
    process = start_server([repo], tmp_path_factory.mktemp("batching_server"))
    yield process
    process.stop()


def _inputs(value: int) -> list[httpclient.InferInput]:
    data = np.arange(4, dtype=np.int32).reshape(1, 4) + value
    tensor = httpclient.InferInput("INPUT0", [1, 4], "INT32")
    tensor.set_data_from_numpy(data)
    return [tensor]


def test_concurrent_requests_are_batched_and_answered_each_with_its_own(
    batching_server: ServerProcess,
) -> None:
    client = httpclient.InferenceServerClient(batching_server.url, concurrency=16)
    try:
        pending = [
            client.async_infer("batch_size_probe", _inputs(100 * i), request_id=f"r{i}")
            for i in range(16)
        ]
        results = [request.get_result(timeout=60) for request in pending]
    finally:
        client.close()
    seen = []
    for i, result in enumerate(results):
        assert result.get_response()["id"] == f"r{i}"
        expected = (np.arange(4, dtype=np.int32) + 100 * i) * 2
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), [expected])
        batch = result.as_numpy("OUTPUT_BS")
        assert batch.shape == (1, 1)
        seen.append(int(batch[0, 0]))
    # Sixteen one-row requests: two full batches of eight.
    assert seen == [8] * 16, seen


def test_a_request_of_several_rows_is_answered_with_its_rows(
    batching_server: ServerProcess,
) -> None:
    # Three rows and five one-row requests fill a batch of eight (a batch is cut only when full).
    client = httpclient.InferenceServerClient(batching_server.url, concurrency=6)
    try:
        data = np.arange(12, dtype=np.int32).reshape(3, 4)
        tensor = httpclient.InferInput("INPUT0", [3, 4], "INT32")
        tensor.set_data_from_numpy(data)
        several = client.async_infer("batch_size_probe", [tensor], request_id="rows")
        singles = [
            client.async_infer("batch_size_probe", _inputs(100 * i), request_id=f"s{i}")
            for i in range(5)
        ]
        result = several.get_result(timeout=60)
        others = [request.get_result(timeout=60) for request in singles]
    finally:
        client.close()
    assert result.get_response()["id"] == "rows"
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data * 2)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT_BS"), [[8]] * 3)
    for i, other in enumerate(others):
        assert other.get_response()["id"] == f"s{i}"
        expected = (np.arange(4, dtype=np.int32) + 100 * i) * 2
        np.testing.assert_array_equal(other.as_numpy("OUTPUT0"), [expected])
        np.testing.assert_array_equal(other.as_numpy("OUTPUT_BS"), [[8]])
