"""Ensembles whose step models live in another model repository, served by a real server: a
plain pipeline over HTTP and gRPC, and pipelines behind a decoupled python step (`repeat`),
which make the ensemble decoupled: one response per element over gRPC streaming, with and
without `max_inflight_requests`."""

from __future__ import annotations

import queue
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests import onnx_models
from tests.e2e.conftest import ADD_SUB_FP32_CONFIG as ADD_SUB_FP32
from tests.e2e.conftest import write_config
from tests.server_process import ServerProcess, start_server

PYTHON_MODELS = Path(__file__).resolve().parent.parent / "python_models"


ADD_SUB_INT32 = """
name: "onnx_int_add_sub"
platform: "onnxruntime_onnx"
max_batch_size: 0
input [
  { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "INPUT1" data_type: TYPE_INT32 dims: [ 1 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 1 ] }
]
"""

# (x + y) * (x - y), its steps in the other repository.
PIPELINE = """
name: "far_pipeline"
platform: "ensemble"
max_batch_size: 0
input [
  { name: "X" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] }
]
output [ { name: "RESULT" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [
  { model_name: "onnx_add_sub"
    input_map [ { key: "INPUT0" value: "X" }, { key: "INPUT1" value: "Y" } ]
    output_map [ { key: "OUTPUT0" value: "sum" }, { key: "OUTPUT1" value: "difference" } ] },
  { model_name: "multiply"
    input_map [ { key: "A" value: "sum" }, { key: "B" value: "difference" } ]
    output_map { key: "PRODUCT" value: "RESULT" } }
] }
"""

# `repeat` answers once per element of IN; each element is doubled (x + x) on its own. The
# ensemble does not say it is decoupled: as in Triton, its decoupled step makes it so (the manager
# loads, or waits for, an ensemble's steps before the ensemble).
STREAM = """
name: "{name}"
platform: "ensemble"
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ -1 ] }} ]
output [
  {{ name: "DOUBLED" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "INDEX" data_type: TYPE_UINT32 dims: [ 1 ] }}
]
ensemble_scheduling {{
  max_inflight_requests: {limit}
  step [
    {{ model_name: "repeat" input_map {{ key: "IN" value: "IN" }}
      output_map [ {{ key: "OUT" value: "element" }}, {{ key: "IDX" value: "INDEX" }} ] }},
    {{ model_name: "onnx_int_add_sub"
      input_map [ {{ key: "INPUT0" value: "element" }}, {{ key: "INPUT1" value: "element" }} ]
      output_map {{ key: "OUTPUT0" value: "DOUBLED" }} }}
  ]
}}
"""

# A batching ensemble over steps that do not batch, and the other way round: as Triton's, the
# ensemble drops a batch of 1 where a step does not batch and adds one where it does.
BATCHED_OVER_UNBATCHED = PIPELINE.replace('"far_pipeline"', '"batched_pipeline"').replace(
    "max_batch_size: 0", "max_batch_size: 8"
)
UNBATCHED_OVER_BATCHED = """
name: "unbatched_add_sub"
platform: "ensemble"
max_batch_size: 0
input [
  { name: "X" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] }
]
output [
  { name: "SUM" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "PRODUCT" data_type: TYPE_FP32 dims: [ 4 ] }
]
ensemble_scheduling { step [
  { model_name: "onnx_add_sub_batched"
    input_map [ { key: "INPUT0" value: "X" }, { key: "INPUT1" value: "Y" } ]
    output_map [ { key: "OUTPUT0" value: "SUM" }, { key: "OUTPUT1" value: "difference" } ] },
  { model_name: "multiply"
    input_map [ { key: "A" value: "SUM" }, { key: "B" value: "difference" } ]
    output_map { key: "PRODUCT" value: "PRODUCT" } }
] }
"""
ENSEMBLES = ("far_pipeline", "batched_pipeline", "unbatched_add_sub")
STREAMS = ("doubled_stream", "doubled_stream_limited", "doubled_stream_last")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("ensemble-repos")
    steps, ensembles = root / "steps", root / "ensembles"
    onnx_models.add_sub_model(
        steps / "onnx_add_sub" / "1" / "model.onnx", "FP32", (4,), batch=False
    )
    write_config(steps / "onnx_add_sub", ADD_SUB_FP32)
    onnx_models.add_sub_model(
        steps / "onnx_int_add_sub" / "1" / "model.onnx", "INT32", (1,), batch=False
    )
    write_config(steps / "onnx_int_add_sub", ADD_SUB_INT32)
    onnx_models.add_sub_model(
        steps / "onnx_add_sub_batched" / "1" / "model.onnx", "FP32", (4,), batch=True
    )
    write_config(
        steps / "onnx_add_sub_batched",
        ADD_SUB_FP32.replace('"onnx_add_sub"', '"onnx_add_sub_batched"').replace(
            "max_batch_size: 0", "max_batch_size: 8"
        ),
    )
    for model in ("multiply", "repeat"):
        shutil.copytree(PYTHON_MODELS / model, steps / model)
    # `repeat` that sends its final flag with its last response.
    shutil.copytree(PYTHON_MODELS / "repeat", steps / "repeat_last")
    write_config(
        steps / "repeat_last",
        (PYTHON_MODELS / "repeat" / "config.pbtxt").read_text().replace('"repeat"', '"repeat_last"')
        + 'parameters { key: "final_with_last" value { string_value: "true" } }\n',
    )
    write_config(ensembles / "far_pipeline", PIPELINE)
    write_config(ensembles / "batched_pipeline", BATCHED_OVER_UNBATCHED)
    write_config(ensembles / "unbatched_add_sub", UNBATCHED_OVER_BATCHED)
    for name, limit in (("doubled_stream", 0), ("doubled_stream_limited", 2)):
        write_config(ensembles / name, STREAM.format(name=name, limit=limit))
    write_config(
        ensembles / "doubled_stream_last",
        STREAM.format(name="doubled_stream_last", limit=0).replace(
            'model_name: "repeat"', 'model_name: "repeat_last"'
        ),
    )
    for name in (*ENSEMBLES, *STREAMS):
        (ensembles / name / "1").mkdir()
    # The ensembles' repository first: nothing about the order may matter.
    server = start_server(
        [ensembles, steps], tmp_path_factory.mktemp("ensemble-repos-server"), wait_ready=False
    )
    yield server
    server.stop()


def test_every_model_of_both_repositories_is_ready(served: ServerProcess) -> None:
    index = httpx.post(f"{served.base}/v2/repository/index", json={}).json()
    states = {entry["name"]: (entry["state"], entry.get("reason", "")) for entry in index}
    assert set(states) == {
        *ENSEMBLES,
        *STREAMS,
        "onnx_add_sub_batched",
        "repeat_last",
        "onnx_add_sub",
        "onnx_int_add_sub",
        "multiply",
        "repeat",
    }
    assert all(state == "READY" for state, _ in states.values()), states


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_an_ensemble_runs_steps_of_another_repository(served: ServerProcess, module: type) -> None:
    client = module.InferenceServerClient(served.url if module is httpclient else served.grpc_url)
    x = np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32)
    y = np.array([0.5, 1.0, 1.5, 2.0], dtype=np.float32)
    tensors = [module.InferInput(name, [4], "FP32") for name in ("X", "Y")]
    tensors[0].set_data_from_numpy(x)
    tensors[1].set_data_from_numpy(y)
    result = client.infer("far_pipeline", tensors)
    np.testing.assert_allclose(result.as_numpy("RESULT"), (x + y) * (x - y))


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_a_batching_ensemble_over_steps_that_do_not_batch(
    served: ServerProcess, module: type
) -> None:
    # The request's batch of 1 is dropped for the steps and given back to the answer.
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    y = np.full((1, 4), 2, dtype=np.float32)
    client = module.InferenceServerClient(served.grpc_url if module is grpcclient else served.url)
    result = client.infer("batched_pipeline", fp32_inputs(module, x, y))
    np.testing.assert_array_equal(result.as_numpy("RESULT"), (x + y) * (x - y))


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_an_ensemble_that_does_not_batch_over_a_step_that_does(
    served: ServerProcess, module: type
) -> None:
    # A batch of 1 is added for the batching step, and taken off again for the step that does
    # not batch and for the ensemble's answer.
    x = np.arange(4, dtype=np.float32)
    y = np.full(4, 2, dtype=np.float32)
    client = module.InferenceServerClient(served.grpc_url if module is grpcclient else served.url)
    result = client.infer("unbatched_add_sub", fp32_inputs(module, x, y))
    np.testing.assert_array_equal(result.as_numpy("SUM"), x + y)
    np.testing.assert_array_equal(result.as_numpy("PRODUCT"), (x + y) * (x - y))


def fp32_inputs(module: type, x: np.ndarray, y: np.ndarray) -> list:
    tensors = []
    for name, data in (("X", x), ("Y", y)):
        tensor = module.InferInput(name, list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        tensors.append(tensor)
    return tensors


def stream(served: ServerProcess, model: str, values: list[int]) -> list[tuple[int, int]]:
    """(INDEX, DOUBLED) of every response to one streamed request, until its final flag."""
    client = grpcclient.InferenceServerClient(served.grpc_url)
    answers: queue.Queue[tuple[object, object]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    seen: list[tuple[int, int]] = []
    try:
        tensor = grpcclient.InferInput("IN", [len(values)], "INT32")
        tensor.set_data_from_numpy(np.array(values, dtype=np.int32))
        client.async_stream_infer(
            model, [tensor], request_id="s1", enable_empty_final_response=True
        )
        while True:
            result, error = answers.get(timeout=10)
            assert error is None, str(error)
            response = result.get_response()  # type: ignore[attr-defined]
            assert (response.model_name, response.id) == (model, "s1")
            if response.outputs:
                seen.append(
                    (
                        int(result.as_numpy("INDEX")[0]),  # type: ignore[attr-defined]
                        int(result.as_numpy("DOUBLED")[0]),  # type: ignore[attr-defined]
                    )
                )
            if response.parameters["triton_final_response"].bool_param:
                return seen
    finally:
        client.stop_stream()


@pytest.mark.parametrize("empty_final", [False, True], ids=["plain", "empty-final-asked"])
def test_the_last_response_is_final_when_the_step_ended_with_it(
    served: ServerProcess, empty_final: bool
) -> None:
    # As Triton's: the decoupled step sent its final flag with its last response, so the
    # ensemble's answer made from it is the last, and says so; no empty final follows it.
    client = grpcclient.InferenceServerClient(served.grpc_url)
    answers: queue.Queue[tuple[object, object]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))

    def ask(request_id: str, values: list[int]) -> list[tuple[str, int, bool]]:
        tensor = grpcclient.InferInput("IN", [len(values)], "INT32")
        tensor.set_data_from_numpy(np.array(values, dtype=np.int32))
        client.async_stream_infer(
            "doubled_stream_last",
            [tensor],
            request_id=request_id,
            enable_empty_final_response=empty_final,
        )
        seen = []
        while True:
            result, error = answers.get(timeout=30)
            assert error is None, str(error)
            response = result.get_response()  # type: ignore[attr-defined]
            final = response.parameters["triton_final_response"].bool_param
            seen.append((response.id, len(response.outputs), final))
            if final:
                return seen

    try:
        assert ask("s1", [7, 8, 9]) == [("s1", 2, False), ("s1", 2, False), ("s1", 2, True)]
        # The next message on the stream is the next request's: no empty final came for s1.
        assert ask("s2", [1]) == [("s2", 2, True)]
    finally:
        client.stop_stream()


def test_a_decoupled_step_makes_the_ensemble_stream(served: ServerProcess) -> None:
    seen = stream(served, "doubled_stream", [7, 8, 9, 10])
    assert sorted(seen) == [(0, 14), (1, 16), (2, 18), (3, 20)]
    config = grpcclient.InferenceServerClient(served.grpc_url).get_model_config("doubled_stream")
    assert config.config.model_transaction_policy.decoupled


def test_a_streaming_ensemble_with_max_inflight_requests(served: ServerProcess) -> None:
    values = list(range(40))
    seen = stream(served, "doubled_stream_limited", values)
    assert sorted(seen) == [(i, 2 * v) for i, v in enumerate(values)]


def test_a_streaming_ensemble_refuses_a_single_response_request(served: ServerProcess) -> None:
    tensor = httpclient.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([1], dtype=np.int32))
    with pytest.raises(InferenceServerException, match="decoupled"):
        httpclient.InferenceServerClient(served.url).infer("doubled_stream", [tensor])
