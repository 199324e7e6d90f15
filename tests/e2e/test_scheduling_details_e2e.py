"""Scheduling details against a real server with tritonclient, as Triton's own QA checks them:
ensembles with optional inputs and outputs not produced, pruning, the sequence flags and the
statistics of an ensemble; the dynamic batcher cutting a batch when the next request has other
inputs; iterative sequences whose python model reschedules its requests."""

from __future__ import annotations

import queue
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import write_config
from tests.server_process import ServerProcess, start_server

PYTHON_MODELS = Path(__file__).resolve().parent.parent / "python_models"
PICK = (PYTHON_MODELS / "optional_pick" / "config.pbtxt").read_text()


def pick_config(name: str, extra: str = "", required: bool = False) -> str:
    text = PICK.replace('name: "optional_pick"', f'name: "{name}"')
    if required:
        text = text.replace("dims: [ 1 ] optional: true },", "dims: [ 1 ] },", 1)
    return text + extra


def tensors(names: str, optional: bool) -> str:
    flag = " optional: true" if optional else ""
    return ", ".join(
        f'{{ name: "{n}" data_type: TYPE_FP32 dims: [ 1 ]{flag} }}' for n in names.split()
    )


def step(model: str, inputs: dict[str, str], outputs: dict[str, str]) -> str:
    ins = " ".join(f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
    outs = " ".join(f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
    return f'{{ model_name: "{model}" model_version: -1 {ins} {outs} }}'


def ensemble(inputs: str, outputs: str, *steps: str, optional: bool = True) -> str:
    return f"""
platform: "ensemble" max_batch_size: 4
input [ {tensors(inputs, optional)} ]
output [ {tensors(outputs, False)} ]
ensemble_scheduling {{ step [ {", ".join(steps)} ] }}
"""


BOTH = {"INPUT0": "INPUT0", "INPUT1": "INPUT1"}
SAME = {"OUTPUT0": "OUTPUT0", "OUTPUT1": "OUTPUT1"}
ENSEMBLES = {
    "wrap": ensemble("INPUT0 INPUT1", "OUTPUT0 OUTPUT1", step("optional_pick", BOTH, SAME)),
    "wrap_counted": ensemble("INPUT0 INPUT1", "OUTPUT0 OUTPUT1", step("optional_pick", BOTH, SAME)),
    "connect": ensemble(
        "INPUT0 INPUT1",
        "OUTPUT0 OUTPUT1",
        step("optional_pick", BOTH, {"OUTPUT0": "between0", "OUTPUT1": "between1"}),
        step("optional_pick", {"INPUT0": "between0", "INPUT1": "between1"}, SAME),
    ),
    "needs_input": ensemble(
        "INPUT0 INPUT1",
        "A R",
        step("optional_pick", BOTH, {"OUTPUT0": "A", "OUTPUT1": "between"}),
        step("pick_required", {"INPUT0": "between"}, {"OUTPUT0": "R"}),
    ),
    "prune": ensemble(
        "IN",
        "A B",
        step("prune_a", {"INPUT0": "IN"}, {"OUTPUT0": "A"}),
        step("prune_b", {"INPUT0": "IN"}, {"OUTPUT0": "B"}),
        optional=False,
    ),
}
# A queue delay of an hour: a batch that is not cut never leaves in a test's time.
HOUR_DELAY = (
    "dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 3600000000 }"
)
UNARY_COUNTDOWN = (
    (PYTHON_MODELS / "countdown" / "config.pbtxt")
    .read_text()
    .replace('name: "countdown"', 'name: "countdown_unary"')
    .replace("max_batch_size: 2", "max_batch_size: 0")
    .replace("model_transaction_policy { decoupled: true }", "")
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("scheduling") / "models"
    for name in ("optional_pick", "countdown"):
        shutil.copytree(PYTHON_MODELS / name, repo / name)
    copies = {
        "pick_required": pick_config("pick_required", required=True),
        "prune_a": pick_config("prune_a"),
        "prune_b": pick_config("prune_b"),
        "pick_batched": pick_config("pick_batched", HOUR_DELAY),
        "countdown_unary": UNARY_COUNTDOWN,
    }
    for name, text in copies.items():
        source = "countdown" if name.startswith("countdown") else "optional_pick"
        shutil.copytree(PYTHON_MODELS / source / "1", repo / name / "1")
        write_config(repo / name, text)
    for name, text in ENSEMBLES.items():
        write_config(repo / name, f'name: "{name}"\n{text}')
        (repo / name / "1").mkdir()
    process = start_server([repo], tmp_path_factory.mktemp("scheduling-server"))
    yield process
    process.stop()


def grpc_inputs(rows: int = 1, **values: float) -> list[grpcclient.InferInput]:
    inputs = []
    for name, value in values.items():
        tensor = grpcclient.InferInput(name, [rows, 1], "FP32")
        tensor.set_data_from_numpy(np.full((rows, 1), value, dtype=np.float32))
        inputs.append(tensor)
    return inputs


def asked(*names: str) -> list[grpcclient.InferRequestedOutput]:
    return [grpcclient.InferRequestedOutput(name) for name in names]


def produced(result: Any) -> dict[str, float]:
    """The outputs a response holds (gRPC or HTTP result), by name."""
    response = result.get_response()
    if isinstance(response, dict):  # HTTP
        names = [output["name"] for output in response.get("outputs", [])]
    else:
        names = [output.name for output in response.outputs]
    return {name: float(result.as_numpy(name).reshape(-1)[0]) for name in names}


def successes(client: grpcclient.InferenceServerClient, model: str) -> int:
    stats = client.get_inference_statistics(model, as_json=True)["model_stats"][0]
    return int(stats["inference_stats"]["success"].get("count", 0))


# -- ensembles ---------------------------------------------------------------------------------


def test_an_optional_input_left_out_leaves_out_only_what_depends_on_it(
    server: ServerProcess,
) -> None:
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        result = client.infer("wrap", grpc_inputs(INPUT1=5.0), outputs=asked("OUTPUT1"))
        assert produced(result) == {"OUTPUT1": 5.0}
        # Asked for, not produced: left out of the response, as Triton does.
        result = client.infer("wrap", grpc_inputs(INPUT1=5.0), outputs=asked("OUTPUT0"))
        assert produced(result) == {}
    client = httpclient.InferenceServerClient(server.url)
    data = np.full((1, 1), 2.0, dtype=np.float32)
    tensor = httpclient.InferInput("INPUT0", [1, 1], "FP32")
    tensor.set_data_from_numpy(data)
    result = client.infer("wrap", [tensor])
    assert produced(result) == {"OUTPUT0": 2.0}


def test_a_tensor_a_step_did_not_produce_does_not_stop_the_next_step(
    server: ServerProcess,
) -> None:
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        result = client.infer("connect", grpc_inputs(INPUT0=7.0), outputs=asked("OUTPUT0"))
        assert produced(result) == {"OUTPUT0": 7.0}


def test_a_required_input_fed_by_an_absent_tensor_fails_with_the_reason(
    server: ServerProcess,
) -> None:
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        with pytest.raises(InferenceServerException) as caught:
            client.infer("needs_input", grpc_inputs(INPUT0=1.0))
        assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
        message = caught.value.message()
        assert message.startswith("in ensemble 'needs_input', ")
        assert "missing required input(s) ['INPUT0']" in message
        assert "for model 'pick_required'" in message
        assert successes(client, "pick_required") == 0
        # Nothing changed: with INPUT1 the tensor exists and the ensemble serves.
        result = client.infer("needs_input", grpc_inputs(INPUT1=3.0), outputs=asked("R"))
        assert produced(result) == {"R": 3.0}


def test_steps_no_requested_output_needs_never_run(server: ServerProcess) -> None:
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        for _ in range(2):
            result = client.infer("prune", grpc_inputs(IN=4.0), outputs=asked("A"))
            assert produced(result) == {"A": 4.0}
        assert (successes(client, "prune_a"), successes(client, "prune_b")) == (2, 0)
        result = client.infer("prune", grpc_inputs(IN=4.0), outputs=asked("B"))
        assert produced(result) == {"B": 4.0}
        assert (successes(client, "prune_a"), successes(client, "prune_b")) == (2, 1)


def stream_answers(client: grpcclient.InferenceServerClient, count: int, send: Any) -> list[Any]:
    answers: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put(error or result))
    try:
        send()
        return [answers.get(timeout=60) for _ in range(count)]
    finally:
        client.stop_stream()


def test_ensemble_responses_carry_their_requests_sequence_flags(server: ServerProcess) -> None:
    flags = [(True, False), (False, False), (False, True)]

    def send(model: str) -> Any:
        def requests() -> None:
            for index, (start, end) in enumerate(flags):
                client.async_stream_infer(
                    model,
                    grpc_inputs(INPUT0=1.0),
                    request_id=str(index),
                    sequence_id=99,
                    sequence_start=start,
                    sequence_end=end,
                )

        return requests

    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        answers = stream_answers(client, 3, send("wrap"))
        seen = {}
        for answer in answers:
            assert not isinstance(answer, InferenceServerException), answer
            response = answer.get_response()
            parameters = response.parameters
            seen[response.id] = (
                parameters["sequence_start"].bool_param,
                parameters["sequence_end"].bool_param,
                parameters["sequence_id"].int64_param,
            )
        assert seen == {str(i): (*pair, 99) for i, pair in enumerate(flags)}
        # A model that is not an ensemble answers without them, as Triton's do.
        for answer in stream_answers(client, 3, send("optional_pick")):
            assert "sequence_start" not in answer.get_response().parameters
    client = httpclient.InferenceServerClient(server.url)
    tensor = httpclient.InferInput("INPUT0", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 1), dtype=np.float32))
    response = client.infer("wrap", [tensor]).get_response()
    assert response["parameters"] == {
        "sequence_id": 0,
        "sequence_start": False,
        "sequence_end": False,
    }


def test_an_ensemble_counts_each_request_as_one_execution_of_its_batch_size(
    server: ServerProcess,
) -> None:
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.infer("wrap_counted", grpc_inputs(INPUT0=1.0))
        client.infer("wrap_counted", grpc_inputs(INPUT1=1.0))
        client.infer("wrap_counted", grpc_inputs(rows=3, INPUT0=1.0, INPUT1=2.0))
        stats = client.get_inference_statistics("wrap_counted", "1").model_stats[0]
    assert (stats.execution_count, stats.inference_count) == (3, 5)
    assert {b.batch_size: b.compute_infer.count for b in stats.batch_stats} == {1: 2, 3: 1}
    assert stats.inference_stats.success.count == 3
    assert stats.inference_stats.queue.count == 3
    assert stats.inference_stats.compute_infer.count == 3


# -- the dynamic batcher -----------------------------------------------------------------------


def test_a_batch_is_sent_at_once_when_the_next_request_has_other_inputs(
    server: ServerProcess,
) -> None:
    # In this order, over one stream: A waits (an hour), B cannot join it so A goes; C cannot
    # join B so B goes; D (3 rows) fills C's batch to the preferred 4. Without the rule A would
    # wait its hour and this test would time out.
    requests = [
        ("A", grpc_inputs(INPUT0=1.0)),
        ("B", grpc_inputs(INPUT1=2.0)),
        ("C", grpc_inputs(INPUT0=3.0)),
        ("D", grpc_inputs(rows=3, INPUT0=4.0)),
    ]

    def send() -> None:
        for request_id, inputs in requests:
            client.async_stream_infer("pick_batched", inputs, request_id=request_id)

    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        answers = stream_answers(client, 4, send)
        values = {}
        for answer in answers:
            assert not isinstance(answer, InferenceServerException), answer
            values[answer.get_response().id] = produced(answer)
        assert values == {
            "A": {"OUTPUT0": 1.0},
            "B": {"OUTPUT1": 2.0},
            "C": {"OUTPUT0": 3.0},
            "D": {"OUTPUT0": 4.0},
        }
        stats = client.get_inference_statistics("pick_batched", "1").model_stats[0]
    assert {b.batch_size: b.compute_infer.count for b in stats.batch_stats} == {1: 2, 4: 1}


# -- iterative sequences -----------------------------------------------------------------------


def countdown_inputs(steps: int, rows: bool = True) -> list[grpcclient.InferInput]:
    shape = [1, 1] if rows else [1]
    tensor = grpcclient.InferInput("STEPS", shape, "INT32")
    tensor.set_data_from_numpy(np.full(shape, steps, dtype=np.int32))
    return [tensor]


def cells(result: Any) -> dict[str, int]:
    return {
        name: int(result.as_numpy(name).reshape(-1)[0])
        for name in ("LEFT", "CORRID", "START", "ROWS")
    }


def test_an_iterative_request_is_run_again_until_its_model_is_done(
    server: ServerProcess,
) -> None:
    def send() -> None:
        # No correlation ID: each request is a sequence of its own.
        client.async_stream_infer("countdown", countdown_inputs(3), request_id="a")
        client.async_stream_infer("countdown", countdown_inputs(2), request_id="b")

    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        answers = stream_answers(client, 5, send)
    by_request: dict[str, list[dict[str, int]]] = {}
    for answer in answers:
        assert not isinstance(answer, InferenceServerException), answer
        by_request.setdefault(answer.get_response().id, []).append(cells(answer))
    assert [c["LEFT"] for c in by_request["a"]] == [2, 1, 0]
    assert [c["LEFT"] for c in by_request["b"]] == [1, 0]
    assert [c["START"] for c in by_request["a"]] == [1, 0, 0]  # START on the first run only
    corrids = {name: {c["CORRID"] for c in runs} for name, runs in by_request.items()}
    assert all(len(ids) == 1 and 0 not in ids for ids in corrids.values())
    assert corrids["a"] != corrids["b"]


def test_a_non_decoupled_iterative_request_is_answered_once_at_its_end(
    server: ServerProcess,
) -> None:
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        result = client.infer("countdown_unary", countdown_inputs(3, rows=False))
        assert cells(result)["LEFT"] == 0
        assert cells(result)["START"] == 0  # the answer is from its third run
        # With a correlation ID, the first request of the sequence must START it.
        with pytest.raises(InferenceServerException) as caught:
            client.infer("countdown_unary", countdown_inputs(1, rows=False), sequence_id=9)
        assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert "must specify the START flag" in caught.value.message()
        result = client.infer(
            "countdown_unary",
            countdown_inputs(2, rows=False),
            sequence_id=9,
            sequence_start=True,
        )
        assert cells(result) == {"LEFT": 0, "CORRID": 9, "START": 0, "ROWS": 1}
