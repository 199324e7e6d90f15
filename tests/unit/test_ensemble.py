"""Ensembles in-process: DAG and step checks at load, requests through router -> ensemble
scheduler -> step models, decoupled steps (the ensemble streams) and max_inflight_requests."""

from __future__ import annotations

import itertools
import shutil
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

from tests.python_backend_support import MODELS as PYTHON_MODELS
from tests.python_backend_support import PATIENCE_S
from tritonactor.actors import ActorSystem
from tritonactor.backends.base import (
    Backend,
    BackendInstance,
    BackendModel,
    InstanceContext,
    ModelContext,
    Result,
)
from tritonactor.backends.ensemble import (
    EnsembleBackend,
    batch_reshaped,
    check_steps,
    plan_ensemble,
    plan_flow,
)
from tritonactor.backends.python import PythonBackend
from tritonactor.config.model_config import ConfigError, parse_pbtxt
from tritonactor.config.normalize import fill_defaults, instance_specs
from tritonactor.config.validate_ensemble import check_ensemble
from tritonactor.core.errors import ErrorCode, TritonError, internal
from tritonactor.core.types import InferenceRequest, InferenceResponse, ResponseSender, Tensor
from tritonactor.scheduling.ensemble_stream import ResponseStream
from tritonactor.scheduling.model import ModelVersionActor
from tritonactor.scheduling.router import ModelHandle, Router
from tritonactor.scheduling.signature import ModelSignature

pytestmark = pytest.mark.anyio

# A bound on waits for something that is bound to happen: generous, so that only a hang reaches
# it, however busy the machine.
HANG = 30

Function = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


def model_config(name: str, inputs: list[str], outputs: list[str]) -> str:
    def tensors(names: list[str]) -> str:
        return ", ".join(f'{{ name: "{n}" data_type: TYPE_INT32 dims: [ 2 ] }}' for n in names)

    return f'name: "{name}" input [ {tensors(inputs)} ] output [ {tensors(outputs)} ]'


class FunctionInstance(BackendInstance):
    def __init__(self, function: Function, barrier: threading.Barrier | None) -> None:
        self.function = function
        self.barrier = barrier

    def execute(self, requests: list[InferenceRequest]) -> list[Result]:
        results: list[Result] = []
        for request in requests:
            if self.barrier is not None:
                self.barrier.wait(timeout=5)  # both barrier models must be executing at once
            values = {tensor.name: tensor.data for tensor in request.inputs}
            if any(int(value.flat[0]) < 0 for value in values.values()):
                results.append(internal("negative input"))
                continue
            outputs = [
                Tensor(name, "INT32", data.shape, data)
                for name, data in self.function(values).items()
            ]
            results.append(
                InferenceResponse(
                    request.model_name, str(request.resolved_version), request.id, outputs
                )
            )
        return results


class FunctionModel(BackendModel):
    def __init__(self, function: Function, barrier: threading.Barrier | None) -> None:
        self.function = function
        self.barrier = barrier

    def create_instance(self, context: InstanceContext) -> BackendInstance:
        return FunctionInstance(self.function, self.barrier)


class FunctionBackend(Backend):
    name = "function"

    def __init__(self, function: Function, barrier: threading.Barrier | None = None) -> None:
        self.function = function
        self.barrier = barrier

    def load_model(self, context: ModelContext) -> BackendModel:
        return FunctionModel(self.function, self.barrier)


def double(values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"Y": values["X"] * 2}


def triple(values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"Y": values["X"] * 3}


def add(values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"SUM": values["A"] + values["B"]}


CHAIN = """
name: "chain"
platform: "ensemble"
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 2 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 2 ] } ]
ensemble_scheduling { step [
  { model_name: "double" model_version: -1 input_map { key: "X" value: "IN" }
    output_map { key: "Y" value: "doubled" } },
  { model_name: "triple" model_version: 1 input_map { key: "X" value: "doubled" }
    output_map { key: "Y" value: "OUT" } }
] }
"""

DIAMOND = """
name: "diamond"
platform: "ensemble"
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 2 ] } ]
output [
  { name: "OUT" data_type: TYPE_INT32 dims: [ 2 ] },
  { name: "TWICE" data_type: TYPE_INT32 dims: [ 2 ] }
]
ensemble_scheduling { step [
  { model_name: "add" input_map [ { key: "A" value: "TWICE" }, { key: "B" value: "thrice" } ]
    output_map { key: "SUM" value: "OUT" } },
  { model_name: "double" input_map { key: "X" value: "IN" }
    output_map { key: "Y" value: "TWICE" } },
  { model_name: "triple" input_map { key: "X" value: "IN" }
    output_map { key: "Y" value: "thrice" } }
] }
"""


@pytest.fixture
async def system() -> AsyncIterator[ActorSystem]:
    async with ActorSystem() as actors:
        yield actors


async def serve(
    system: ActorSystem,
    router: Router,
    backend: Backend,
    text: str,
    repository: Path,
    model_file: str = "model",
) -> None:
    config = fill_defaults(parse_pbtxt(text), gpus=0)
    (repository / config.name / "1").mkdir(parents=True, exist_ok=True)
    context = ModelContext(
        config.name,
        1,
        config,
        repository / config.name,
        repository / config.name / "1",
        repository / config.name / "1" / model_file,
    )
    actor = ModelVersionActor(backend, context, infer=router.infer)
    await system.spawn(actor)
    assert actor.scheduler is not None
    router.known.add(config.name)
    router.add(
        ModelHandle(config.name, 1, config, ModelSignature.from_config(config), actor.scheduler)
    )


async def serve_steps(
    system: ActorSystem, repository: Path, barrier: threading.Barrier | None = None
) -> Router:
    router = Router()
    await serve(
        system,
        router,
        FunctionBackend(double, barrier),
        model_config("double", ["X"], ["Y"]),
        repository,
    )
    await serve(
        system,
        router,
        FunctionBackend(triple, barrier),
        model_config("triple", ["X"], ["Y"]),
        repository,
    )
    await serve(
        system, router, FunctionBackend(add), model_config("add", ["A", "B"], ["SUM"]), repository
    )
    return router


def request(model: str, value: int, request_id: str = "") -> InferenceRequest:
    data = np.array([value, value + 1], dtype=np.int32)
    return InferenceRequest(model, id=request_id, inputs=[Tensor("IN", "INT32", (2,), data)])


async def test_a_chain_feeds_one_step_into_the_next(system: ActorSystem, tmp_path: Path) -> None:
    router = await serve_steps(system, tmp_path)
    await serve(system, router, EnsembleBackend(), CHAIN, tmp_path)
    response = await router.infer(request("chain", 1, "r1"))
    assert (response.model_name, response.model_version, response.id) == ("chain", "1", "r1")
    assert [tensor.name for tensor in response.outputs] == ["OUT"]
    np.testing.assert_array_equal(response.outputs[0].data, [6, 12])


FAN = """
name: "fan"
platform: "ensemble"
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 2 ] } ]
output [
  { name: "FIRST" data_type: TYPE_INT32 dims: [ 2 ] },
  { name: "SECOND" data_type: TYPE_INT32 dims: [ 2 ] },
  { name: "THIRD" data_type: TYPE_INT32 dims: [ 2 ] }
]
ensemble_scheduling { step [
  { model_name: "seen" input_map { key: "X" value: "IN" }
    output_map { key: "Y" value: "FIRST" } },
  { model_name: "seen" input_map { key: "X" value: "FIRST" }
    output_map { key: "Y" value: "SECOND" } },
  { model_name: "seen" input_map { key: "X" value: "FIRST" }
    output_map { key: "Y" value: "THIRD" } }
] }
"""


async def test_steps_ready_together_reach_their_model_in_the_configs_order(
    system: ActorSystem, tmp_path: Path
) -> None:
    """Steps that start together reach a shared model (one instance) in the order the config
    lists them, request after request, as when each started in a task of its own in turn."""
    seen: list[int] = []

    def record(values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        seen.append(int(values["X"][0]))
        return {"Y": values["X"] + len(seen)}

    router = Router()
    await serve(
        system, router, FunctionBackend(record), model_config("seen", ["X"], ["Y"]), tmp_path
    )
    await serve(system, router, EnsembleBackend(), FAN, tmp_path)
    for value in (10, 20, 30):
        seen.clear()
        response = await router.infer(request("fan", value))
        outputs = {tensor.name: int(tensor.data[0]) for tensor in response.outputs}
        # The first step saw IN; the second and third, FIRST (IN + 1), in that order.
        assert seen == [value, value + 1, value + 1]
        assert outputs == {"FIRST": value + 1, "SECOND": value + 3, "THIRD": value + 4}


async def test_a_long_chain_runs_every_step(system: ActorSystem, tmp_path: Path) -> None:
    """A chain far longer than the steps one task runs itself (INLINE_DEPTH): each step runs
    once, in order, and no task's stack grows with the chain (1,000 steps run in one task
    would pass Python's recursion limit)."""
    length = 1000
    router = Router()
    seen: list[int] = []

    def plus_one(values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        seen.append(int(values["X"][0]))
        return {"Y": values["X"] + 1}

    await serve(
        system,
        router,
        FunctionBackend(plus_one),
        model_config("plus_one", ["X"], ["Y"]),
        tmp_path,
    )
    names = ["IN", *(f"t{i}" for i in range(1, length)), "OUT"]
    steps = ",\n".join(
        f'{{ model_name: "plus_one" input_map {{ key: "X" value: "{a}" }} '
        f'output_map {{ key: "Y" value: "{b}" }} }}'
        for a, b in itertools.pairwise(names)
    )
    config = CHAIN.split("ensemble_scheduling")[0].replace('"chain"', '"long"')
    await serve(
        system,
        router,
        EnsembleBackend(),
        f"{config}ensemble_scheduling {{ step [ {steps} ] }}",
        tmp_path,
    )
    response = await router.infer(request("long", 1))
    np.testing.assert_array_equal(response.outputs[0].data, [1 + length, 2 + length])
    assert seen == list(range(1, 1 + length))  # each step once, in order


async def test_independent_steps_of_a_diamond_run_concurrently(
    system: ActorSystem, tmp_path: Path
) -> None:
    # "double" and "triple" (one instance each) meet at a barrier of two inside execute():
    # the request completes only if the ensemble runs both at the same time.
    router = await serve_steps(system, tmp_path, threading.Barrier(2))
    await serve(system, router, EnsembleBackend(), DIAMOND, tmp_path)
    response = await router.infer(request("diamond", 1))
    outputs = {tensor.name: tensor.data.tolist() for tensor in response.outputs}
    assert outputs == {"OUT": [5, 10], "TWICE": [2, 4]}


async def test_requests_of_an_ensemble_run_concurrently(
    system: ActorSystem, tmp_path: Path
) -> None:
    router = await serve_steps(system, tmp_path)
    await serve(system, router, EnsembleBackend(), CHAIN, tmp_path)
    results: dict[int, list[int]] = {}

    async def one(value: int) -> None:
        results[value] = (await router.infer(request("chain", value))).outputs[0].data.tolist()

    async with anyio.create_task_group() as group:
        for value in range(20):
            group.start_soon(one, value)
    assert results == {v: [6 * v, 6 * (v + 1)] for v in range(20)}


async def test_a_failing_step_fails_the_request_with_its_model_named(
    system: ActorSystem, tmp_path: Path
) -> None:
    router = await serve_steps(system, tmp_path)
    await serve(system, router, EnsembleBackend(), CHAIN, tmp_path)
    with pytest.raises(TritonError) as caught:
        await router.infer(request("chain", -5))
    assert caught.value.code is ErrorCode.INTERNAL
    assert caught.value.message.startswith("in ensemble 'chain', ")  # Triton's words
    assert "negative input" in caught.value.message
    response = await router.infer(request("chain", 2))  # the next request is served
    np.testing.assert_array_equal(response.outputs[0].data, [12, 18])


async def test_an_ensemble_loads_before_its_step_models_and_serves_once_they_do(
    system: ActorSystem, tmp_path: Path
) -> None:
    # What the watcher, which loads every model at once, may do: the ensemble comes up first,
    # and is away until every step model serves.
    router = Router()
    router.known.update({"double", "triple"})
    await serve(system, router, EnsembleBackend(), CHAIN, tmp_path)
    await serve(
        system, router, FunctionBackend(double), model_config("double", ["X"], ["Y"]), tmp_path
    )
    assert router.hidden() == {("chain", 1)}
    with pytest.raises(TritonError) as caught:
        await router.infer(request("chain", 1))
    assert caught.value.code is ErrorCode.NOT_FOUND
    assert "'chain' is not found" in caught.value.message
    await serve(
        system, router, FunctionBackend(triple), model_config("triple", ["X"], ["Y"]), tmp_path
    )
    response = await router.infer(request("chain", 1))
    np.testing.assert_array_equal(response.outputs[0].data, [6, 12])


async def test_step_models_in_another_repository_serve_the_ensemble(
    system: ActorSystem, tmp_path: Path
) -> None:
    router = await serve_steps(system, tmp_path / "steps")
    await serve(system, router, EnsembleBackend(), CHAIN, tmp_path / "ensembles")
    assert not (tmp_path / "ensembles" / "double").exists()
    response = await router.infer(request("chain", 1))
    np.testing.assert_array_equal(response.outputs[0].data, [6, 12])


def ensemble(steps: str, inputs: str = "IN", outputs: str = "OUT") -> str:
    def tensors(names: str) -> str:
        return ", ".join(
            f'{{ name: "{n}" data_type: TYPE_INT32 dims: [ 2 ] }}' for n in names.split(",")
        )

    return (
        f'name: "e" platform: "ensemble" input [ {tensors(inputs)} ] '
        f"output [ {tensors(outputs)} ] ensemble_scheduling {{ step [ {steps} ] }}"
    )


def step(model: str, inputs: dict[str, str], outputs: dict[str, str]) -> str:
    ins = ", ".join(f'{{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
    outs = ", ".join(f'{{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
    return f'{{ model_name: "{model}" input_map [ {ins} ] output_map [ {outs} ] }}'


NOT_CONNECTED = (
    "output 'OUT' for ensemble 'e' is not written: at least one of its depending tensors"
)


# Triton 2.51's messages for the same DAGs (config/validate_ensemble.py; docs/scheduling.md).
@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (
            ensemble(
                step("a", {"X": "IN", "Z": "loop"}, {"Y": "mid"})
                + ","
                + step("b", {"X": "mid"}, {"Y": "loop"})
                + ","
                + step("c", {"X": "mid"}, {"Y": "OUT"})
            ),
            f"{NOT_CONNECTED}, 'loop', is not connected",
        ),
        (
            ensemble(step("a", {"X": "IN"}, {"Y": "OUT"}), inputs="IN,UNUSED"),
            "ensemble input 'UNUSED' for ensemble e' is not used",
        ),
        (
            ensemble(step("a", {"X": "IN"}, {"Y": "mid"})),
            "ensemble output 'OUT' for ensemble e' is not used",
        ),
        (
            ensemble(step("a", {"X": "IN", "Z": "nowhere"}, {"Y": "OUT"})),
            f"{NOT_CONNECTED}, 'nowhere', is not connected",
        ),
        (
            ensemble(
                step("a", {"X": "IN"}, {"Y": "OUT"}) + "," + step("b", {"X": "IN"}, {"Y": "OUT"})
            ),
            "ensemble tensor 'OUT' can appear in an output map only once for ensemble 'e' step 1",
        ),
        (
            ensemble(step("", {"X": "IN"}, {"Y": "OUT"})),
            "must specify 'model_name' in step 0 of ensemble 'e'",
        ),
    ],
)
def test_invalid_dags_are_refused(text: str, reason: str) -> None:
    with pytest.raises(ConfigError) as caught:
        check_ensemble(parse_pbtxt(text))
    assert str(caught.value) == reason


def test_a_step_writing_an_ensemble_input_is_refused() -> None:
    """Stricter than Triton, which loads it."""
    with pytest.raises(TritonError) as caught:
        plan_ensemble(parse_pbtxt(ensemble(step("a", {"X": "IN"}, {"Y": "IN"}))))
    assert caught.value.message == (
        "ensemble 'e': tensor 'IN' is both an ensemble input and written by step 0 (model 'a')"
    )


async def test_a_step_naming_a_model_no_repository_holds_leaves_the_ensemble_away(
    system: ActorSystem, tmp_path: Path
) -> None:
    # The watcher's load (the manager refuses another one first, in Triton's words,
    # `unserved_step`): the ensemble waits, away, for its step model to come, as Triton's does.
    router = Router()
    await serve(
        system, router, FunctionBackend(double), model_config("double", ["X"], ["Y"]), tmp_path
    )
    await serve(system, router, EnsembleBackend(), CHAIN, tmp_path)
    assert router.hidden() == {("chain", 1)}
    router.known.add("triple")
    await serve(
        system, router, FunctionBackend(triple), model_config("triple", ["X"], ["Y"]), tmp_path
    )
    response = await router.infer(request("chain", 1))
    np.testing.assert_array_equal(response.outputs[0].data, [6, 12])


def test_an_ensemble_has_no_instances() -> None:
    assert instance_specs(fill_defaults(parse_pbtxt(CHAIN), gpus=0)) == []


# -- checks against the step models' configs ------------------------------------------------------

STEP_MODELS = {
    "add": 'name: "add" max_batch_size: 8 input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] },'
    ' { name: "B" data_type: TYPE_FP32 dims: [ 4 ] optional: true } ]'
    ' output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 4 ] } ]',
    "small": 'name: "small" max_batch_size: 2'
    ' input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] } ]'
    ' output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 4 ] } ]',
    "flat": 'name: "flat" max_batch_size: 0'
    ' input [ { name: "A" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]'
    ' output [ { name: "SUM" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]',
    "ints": 'name: "ints" max_batch_size: 8'
    ' input [ { name: "A" data_type: TYPE_INT32 dims: [ 4 ] } ]'
    ' output [ { name: "SUM" data_type: TYPE_INT32 dims: [ 4 ] } ]',
    "wide": 'name: "wide" max_batch_size: 8'
    ' input [ { name: "A" data_type: TYPE_FP32 dims: [ 8 ] } ]'
    ' output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 8 ] } ]',
}


def fp32_ensemble(steps: str, max_batch_size: int = 4) -> str:
    return (
        f'name: "e" platform: "ensemble" max_batch_size: {max_batch_size}'
        ' input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]'
        ' output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]'
        f" ensemble_scheduling {{ step [ {steps} ] }}"
    )


def check(text: str) -> None:
    config = parse_pbtxt(text)
    plan = plan_ensemble(config)
    models = {step.index: parse_pbtxt(STEP_MODELS[step.model_name]) for step in plan.steps}
    check_steps(config, plan, models)


def test_steps_that_match_their_models_pass() -> None:
    # B is optional; a non-batching [-1, 4] model fits a batching ensemble's [4] tensors.
    check(
        fp32_ensemble(
            step("add", {"A": "IN"}, {"SUM": "mid"})
            + ","
            + step("flat", {"A": "mid"}, {"SUM": "OUT"})
        )
    )


@pytest.mark.parametrize(
    ("steps", "reason"),
    [
        (
            step("add", {"A": "IN", "C": "IN"}, {"SUM": "OUT"}),
            "in ensemble e, ensemble tensor IN is mapping to non-existing input C in model add",
        ),
        (
            step("add", {"B": "IN"}, {"SUM": "OUT"}),
            "in ensemble e, input A in model add is not mapped to any ensemble tensors",
        ),
        (
            step("add", {"A": "IN"}, {"TOTAL": "OUT"}),
            "in ensemble e, ensemble tensor OUT is mapped from non-existing output TOTAL in "
            "model add",
        ),
        (
            step("ints", {"A": "IN"}, {"SUM": "OUT"}),
            "in ensemble e, ensemble tensor IN: inconsistent data type: TYPE_FP32 is inferred "
            "from model e while TYPE_INT32 is inferred from model ints",
        ),
        (
            step("wide", {"A": "IN"}, {"SUM": "OUT"}),
            "in ensemble e, ensemble tensor IN: inconsistent shape: [-1,4] is inferred from "
            "model e while [-1,8] is inferred from model wide",
        ),
        (
            step("small", {"A": "IN"}, {"SUM": "OUT"}),
            "ensemble e allows maximum batch size 4, but it contains model small which only "
            "allows maximum batch size to be 2",
        ),
    ],
)
def test_steps_that_do_not_match_their_models_are_refused(steps: str, reason: str) -> None:
    with pytest.raises(TritonError) as caught:
        check(fp32_ensemble(steps))
    assert caught.value.code is ErrorCode.INVALID_ARG
    assert caught.value.message == reason


async def test_a_step_that_does_not_match_its_loaded_model_fails_the_load(
    system: ActorSystem, tmp_path: Path
) -> None:
    router = await serve_steps(system, tmp_path)
    mismatched = CHAIN.replace('key: "X" value: "doubled"', 'key: "Z" value: "doubled"')
    with pytest.raises(TritonError) as caught:
        await serve(system, router, EnsembleBackend(), mismatched, tmp_path)
    assert "is mapping to non-existing input Z in model triple" in caught.value.message


# -- the flow of decoupled steps -----------------------------------------------------------------


def flow_of(steps: str, decoupled: list[bool], inputs: str = "IN", outputs: str = "OUT") -> Any:
    return plan_flow(plan_ensemble(parse_pbtxt(ensemble(steps, inputs, outputs))), decoupled)


def test_the_steps_after_a_decoupled_step_run_in_its_stream() -> None:
    flow = flow_of(
        step("split", {"X": "IN"}, {"Y": "piece"}) + "," + step("b", {"X": "piece"}, {"Y": "OUT"}),
        [True, False],
    )
    assert (flow.stream_of, flow.opens, flow.output_stream) == ((0, 1), (1, 1), 1)
    assert flow.streams_responses
    plain = flow_of(step("a", {"X": "IN"}, {"Y": "OUT"}), [False])
    assert (plain.output_stream, plain.streams_responses) == (0, False)


@pytest.mark.parametrize(
    ("steps", "decoupled", "outputs", "reason"),
    [
        (
            step("split", {"X": "IN"}, {"Y": "piece"})
            + ","
            + step("b", {"X": "piece", "Z": "IN"}, {"Y": "OUT"}),
            [True, False],
            "OUT",
            "in ensemble e, step of model 'b' receives inputs originated from different "
            "decoupled models",
        ),
        (
            step("split", {"X": "IN"}, {"Y": "piece"}) + "," + step("b", {"X": "IN"}, {"Y": "OUT"}),
            [True, False],
            "OUT,piece",
            "in ensemble e, step of model 'e' receives inputs originated from different "
            "decoupled models",
        ),
    ],
)
def test_mixing_streams_is_refused(
    steps: str, decoupled: list[bool], outputs: str, reason: str
) -> None:
    with pytest.raises(TritonError) as caught:
        flow_of(steps, decoupled, outputs=outputs)
    assert caught.value.code is ErrorCode.INVALID_ARG
    assert reason in caught.value.message


# -- decoupled steps -----------------------------------------------------------------------------


class SplitInstance(BackendInstance):
    """Decoupled: one response (Y = the element, I = its index) per element of X, sent from the
    instance's thread, then a bare final flag. A negative element ends the stream with an error
    instead. `sent` counts the responses whose `send` has returned."""

    def __init__(self, on_sent: Callable[[], None] | None) -> None:
        self.on_sent = on_sent

    def execute(self, requests: list[InferenceRequest]) -> list[Result]:
        for request in requests:
            sender = request.sender
            assert sender is not None
            values = request.inputs[0].data
            for index, value in enumerate(values.tolist()):
                if value < 0:
                    sender.send(error=internal("negative element"), final=True)
                    break
                outputs = [
                    Tensor("Y", "INT32", (1,), np.array([value], dtype=np.int32)),
                    Tensor("I", "INT32", (1,), np.array([index], dtype=np.int32)),
                ]
                sender.send(InferenceResponse("split", "1", request.id, outputs))
                if self.on_sent is not None:
                    self.on_sent()
            else:
                sender.send(final=True)
        return [None] * len(requests)


class SplitBackend(Backend):
    name = "split"

    def __init__(self, on_sent: Callable[[], None] | None = None) -> None:
        self.on_sent = on_sent

    def load_model(self, context: ModelContext) -> BackendModel:
        on_sent = self.on_sent

        class Model(BackendModel):
            def create_instance(self, context: InstanceContext) -> BackendInstance:
                return SplitInstance(on_sent)

        return Model()


SPLIT = """
name: "split"
model_transaction_policy { decoupled: true }
input [ { name: "X" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [
  { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "I" data_type: TYPE_INT32 dims: [ 1 ] }
]
"""

ONE = 'name: "{name}" input [ {{ name: "X" data_type: TYPE_INT32 dims: [ 1 ] }} ]' + (
    ' output [ {{ name: "Y" data_type: TYPE_INT32 dims: [ 1 ] }} ]'
    " instance_group [ {{ count: {count} kind: KIND_CPU }} ]"
)

STREAMED = """
name: "streamed"
platform: "ensemble"
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [
  { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "INDEX" data_type: TYPE_INT32 dims: [ 1 ] }
]
ensemble_scheduling { step [
  { model_name: "split" input_map { key: "X" value: "IN" }
    output_map [ { key: "Y" value: "piece" }, { key: "I" value: "INDEX" } ] },
  { model_name: "double" input_map { key: "X" value: "piece" }
    output_map { key: "Y" value: "OUT" } }
] }
"""


class Collected:
    """A response sender's answers, as a gRPC stream would get them."""

    def __init__(self) -> None:
        self.responses: list[InferenceResponse] = []
        self.errors: list[TritonError] = []
        self.finals = 0
        self.done = anyio.Event()
        self.sender = ResponseSender(self.deliver)

    def deliver(
        self, response: InferenceResponse | None, error: TritonError | None, final: bool
    ) -> None:
        if response is not None:
            self.responses.append(response)
        if error is not None:
            self.errors.append(error)
        if final:
            self.finals += 1
            self.done.set()

    def by_index(self) -> dict[int, int]:
        outputs = [{t.name: int(t.data[0]) for t in r.outputs} for r in self.responses]
        return {o["INDEX"]: o["OUT"] for o in outputs}


def start_stream(router: Router, model: str, values: list[int]) -> Collected:
    collected = Collected()
    data = np.array(values, dtype=np.int32)
    streamed = InferenceRequest(model, id="s1", inputs=[Tensor("IN", "INT32", data.shape, data)])
    streamed.sender = collected.sender
    router.submit(streamed)
    return collected


async def stream(router: Router, model: str, values: list[int]) -> Collected:
    collected = start_stream(router, model, values)
    with anyio.fail_after(HANG):
        await collected.done.wait()
    return collected


async def serve_streamed(system: ActorSystem, tmp_path: Path) -> Router:
    router = Router()
    await serve(system, router, SplitBackend(), SPLIT, tmp_path)
    await serve(
        system, router, FunctionBackend(double), ONE.format(name="double", count=1), tmp_path
    )
    await serve(system, router, EnsembleBackend(), STREAMED, tmp_path)
    return router


async def test_a_decoupled_step_makes_the_ensemble_stream_one_response_per_element(
    system: ActorSystem, tmp_path: Path
) -> None:
    router = await serve_streamed(system, tmp_path)
    assert router.resolve("streamed").decoupled  # derived from its step, as Triton does
    collected = await stream(router, "streamed", [3, 4, 5])
    assert collected.by_index() == {0: 6, 1: 8, 2: 10}
    assert {(r.model_name, r.id) for r in collected.responses} == {("streamed", "s1")}
    assert (collected.errors, collected.finals) == ([], 1)
    # An empty input: no response at all, only the final flag.
    empty = await stream(router, "streamed", [])
    assert (empty.responses, empty.finals) == ([], 1)


async def test_a_unary_request_to_a_streaming_ensemble_is_refused(
    system: ActorSystem, tmp_path: Path
) -> None:
    router = await serve_streamed(system, tmp_path)
    data = np.array([1], dtype=np.int32)
    with pytest.raises(TritonError) as caught:
        await router.infer(InferenceRequest("streamed", inputs=[Tensor("IN", "INT32", (1,), data)]))
    assert caught.value.code is ErrorCode.UNSUPPORTED


async def test_an_ensemble_loaded_before_its_decoupled_step_streams_once_declared_decoupled(
    system: ActorSystem, tmp_path: Path
) -> None:
    router = Router()
    router.known.update({"split", "double"})
    declared = STREAMED.replace(
        'name: "streamed"', 'name: "declared" model_transaction_policy { decoupled: true }'
    )
    await serve(system, router, EnsembleBackend(), STREAMED, tmp_path)
    await serve(system, router, EnsembleBackend(), declared, tmp_path)
    await serve(system, router, SplitBackend(), SPLIT, tmp_path)
    await serve(
        system, router, FunctionBackend(double), ONE.format(name="double", count=1), tmp_path
    )
    # Its steps were not there to say so: the ensemble was not made decoupled.
    assert not router.resolve("streamed").decoupled
    data = np.array([1], dtype=np.int32)
    with pytest.raises(TritonError) as caught:
        await router.infer(InferenceRequest("streamed", inputs=[Tensor("IN", "INT32", (1,), data)]))
    assert caught.value.code is ErrorCode.UNSUPPORTED
    assert "its step model 'split' is decoupled" in caught.value.message
    collected = await stream(router, "declared", [1, 2])
    assert collected.by_index() == {0: 2, 1: 4}


async def test_a_decoupled_step_that_fails_ends_the_stream_with_its_error(
    system: ActorSystem, tmp_path: Path
) -> None:
    router = await serve_streamed(system, tmp_path)
    collected = await stream(router, "streamed", [1, 2, -1, 4])
    assert set(collected.by_index()) <= {0, 1}
    assert len(collected.errors) == 1
    assert collected.errors[0].message == ("in ensemble 'streamed', negative element")
    assert collected.finals == 1
    again = await stream(router, "streamed", [7])  # the ensemble still serves
    assert again.by_index() == {0: 14}


async def test_an_ensemble_without_decoupled_steps_answers_a_stream_with_one_final_response(
    system: ActorSystem, tmp_path: Path
) -> None:
    router = await serve_steps(system, tmp_path)
    await serve(system, router, EnsembleBackend(), CHAIN, tmp_path)
    assert not router.resolve("chain").decoupled
    collected = Collected()
    streamed = request("chain", 1)
    streamed.sender = collected.sender
    router.submit(streamed)
    with anyio.fail_after(HANG):
        await collected.done.wait()
    assert [r.outputs[0].data.tolist() for r in collected.responses] == [[6, 12]]
    assert collected.finals == 1


# -- max_inflight_requests -----------------------------------------------------------------------


class Gauge:
    """Counts the executes of a model running at once, and those finished. Each execute waits
    at `gate` until the test opens it: the test decides when they finish."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.gate = threading.Event()
        self.running = 0
        self.most = 0
        self.finished = 0

    def __call__(self, values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        if not self.gate.wait(HANG):
            raise TimeoutError("the test never opened the gate")
        with self.lock:
            self.running -= 1
            self.finished += 1
        return {"Y": values["X"] * 2}


async def until(condition: Callable[[], bool]) -> None:
    """Wait until `condition()` holds (what it reads changes on other threads, so: polled)."""
    with anyio.fail_after(HANG):
        while not condition():
            await anyio.sleep(0.001)


def held_up(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Set once a model thread sends a response while its stream has no room: the send is held
    up (what max_inflight_requests does to a decoupled step that outpaces the next)."""
    held = threading.Event()
    deliver = ResponseStream._deliver

    def watched(self: ResponseStream, *answer: Any) -> None:
        if (
            threading.get_ident() != self._loop_thread
            and answer[0] is not None
            and self._waiting >= self._capacity
        ):
            held.set()
        deliver(self, *answer)

    monkeypatch.setattr(ResponseStream, "_deliver", watched)
    return held


def limited(text: str, limit: int) -> str:
    return text.replace(
        "ensemble_scheduling {", f"ensemble_scheduling {{ max_inflight_requests: {limit}"
    )


SLOW_CHAIN = """
name: "slow_chain"
platform: "ensemble"
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
ensemble_scheduling { step [
  { model_name: "slow" input_map { key: "X" value: "IN" } output_map { key: "Y" value: "OUT" } }
] }
"""


@pytest.mark.parametrize("limit", [0, 2])
async def test_max_inflight_requests_bounds_the_requests_at_a_step(
    system: ActorSystem, tmp_path: Path, limit: int
) -> None:
    router = Router()
    gauge = Gauge()
    await serve(system, router, FunctionBackend(gauge), ONE.format(name="slow", count=4), tmp_path)
    await serve(system, router, EnsembleBackend(), limited(SLOW_CHAIN, limit), tmp_path)
    results: dict[int, int] = {}

    async def one(value: int) -> None:
        data = np.array([value], dtype=np.int32)
        response = await router.infer(
            InferenceRequest("slow_chain", inputs=[Tensor("IN", "INT32", (1,), data)])
        )
        results[value] = int(response.outputs[0].data[0])

    with anyio.fail_after(HANG):
        async with anyio.create_task_group() as group:
            for value in range(8):
                group.start_soon(one, value)
            try:
                # The gate closed, none finishes: four instances, without a limit all get work;
                # with one, the step holds `limit` and the other requests wait for room.
                await until(lambda: gauge.running >= (limit or 4))
                await anyio.wait_all_tasks_blocked()
            finally:
                gauge.gate.set()
    assert results == {v: 2 * v for v in range(8)}
    assert gauge.most == (limit or 4)


@pytest.mark.parametrize("limit", [0, 2])
async def test_max_inflight_requests_holds_up_a_decoupled_step_that_outpaces_the_next(
    system: ActorSystem, tmp_path: Path, limit: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = held_up(monkeypatch)
    gauge = Gauge()
    ahead: list[int] = []
    sent = 0

    def on_sent() -> None:  # on the split instance's thread, once a `send` has returned
        nonlocal sent
        sent += 1
        with gauge.lock:
            ahead.append(sent - gauge.finished)

    router = Router()
    await serve(system, router, SplitBackend(on_sent), SPLIT, tmp_path)
    await serve(
        system, router, FunctionBackend(gauge), ONE.format(name="double", count=4), tmp_path
    )
    await serve(system, router, EnsembleBackend(), limited(STREAMED, limit), tmp_path)
    collected = start_stream(router, "streamed", list(range(20)))
    try:
        # The gate closed, none of the next step's executes finishes.
        if limit:
            # The step full, the split model's next send is held up.
            await until(lambda: gauge.running >= limit and held.is_set())
        else:
            await until(lambda: len(ahead) == 20)  # nothing holds the model up
    finally:
        gauge.gate.set()
    with anyio.fail_after(HANG):
        await collected.done.wait()
    assert collected.by_index() == {i: 2 * i for i in range(20)}
    if limit:
        # Waiting to be taken (limit) + taken, waiting for room (1) + in flight (limit).
        assert max(ahead) <= 2 * limit + 1
        assert gauge.most <= limit
    else:
        assert max(ahead) == 20


async def test_the_steps_a_decoupled_step_opens_run_side_by_side(
    system: ActorSystem, tmp_path: Path
) -> None:
    """Each response of a decoupled step starts the next step at once, while the step before
    runs on: the stream is not read one branch at a time (a step that is the only one to start
    runs in the task that found it ready, but never in the loop reading a decoupled step's
    responses)."""
    gauge = Gauge()
    router = Router()
    await serve(system, router, SplitBackend(), SPLIT, tmp_path)
    await serve(
        system, router, FunctionBackend(gauge), ONE.format(name="double", count=4), tmp_path
    )
    await serve(system, router, EnsembleBackend(), STREAMED, tmp_path)
    collected = start_stream(router, "streamed", [1, 2, 3, 4])
    try:
        # The gate closed, no execute of the next step finishes: all four run at once only if
        # each response was taken while the steps opened by those before it were running.
        await until(lambda: gauge.running == 4)
    finally:
        gauge.gate.set()
    with anyio.fail_after(HANG):
        await collected.done.wait()
    assert collected.by_index() == {0: 2, 1: 4, 2: 6, 3: 8}
    assert gauge.most == 4


class TickerInstance(BackendInstance):
    """Decoupled: two responses, then silence until the request is cancelled (or HANG has
    passed, which fails the test): only the cancellation itself can tell it to stop."""

    def __init__(self, stopped: threading.Event) -> None:
        self.stopped = stopped

    def execute(self, requests: list[InferenceRequest]) -> list[Result]:
        for request in requests:
            sender = request.sender
            assert sender is not None
            give_up = time.monotonic() + HANG
            index = 0
            while time.monotonic() < give_up:
                if sender.is_cancelled():
                    self.stopped.set()
                    break
                if index < 2:
                    outputs = [
                        Tensor(name, "INT32", (1,), np.array([index], dtype=np.int32))
                        for name in ("Y", "I")
                    ]
                    sender.send(InferenceResponse("split", "1", request.id, outputs))
                index += 1
                time.sleep(0.01)
            sender.send(final=True)
        return [None] * len(requests)


class TickerBackend(Backend):
    name = "ticker"

    def __init__(self) -> None:
        self.stopped = threading.Event()

    def load_model(self, context: ModelContext) -> BackendModel:
        stopped = self.stopped

        class Model(BackendModel):
            def create_instance(self, context: InstanceContext) -> BackendInstance:
                return TickerInstance(stopped)

        return Model()


async def test_cancelling_a_streaming_request_cancels_its_decoupled_step(
    system: ActorSystem, tmp_path: Path
) -> None:
    router = Router()
    ticker = TickerBackend()
    await serve(system, router, ticker, SPLIT, tmp_path)
    await serve(
        system, router, FunctionBackend(double), ONE.format(name="double", count=1), tmp_path
    )
    await serve(system, router, EnsembleBackend(), STREAMED, tmp_path)
    collected = Collected()
    data = np.array([0], dtype=np.int32)
    streamed = InferenceRequest("streamed", inputs=[Tensor("IN", "INT32", (1,), data)])
    streamed.sender = collected.sender
    router.submit(streamed)
    with anyio.fail_after(HANG):
        while len(collected.responses) < 2:
            await anyio.sleep(0.01)
        streamed.cancel()  # what a gRPC stream that closes does to its requests
        await collected.done.wait()
    assert await anyio.to_thread.run_sync(ticker.stopped.wait, HANG)
    assert len(collected.responses) == 2


PYTHON_STREAMED = """
name: "python_streamed"
platform: "ensemble"
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [
  { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "INDEX" data_type: TYPE_UINT32 dims: [ 1 ] }
]
ensemble_scheduling { step [
  { model_name: "repeat" input_map { key: "IN" value: "IN" }
    output_map [ { key: "OUT" value: "piece" }, { key: "IDX" value: "INDEX" } ] },
  { model_name: "double" input_map { key: "X" value: "piece" }
    output_map { key: "Y" value: "OUT" } }
] }
"""


@pytest.mark.parametrize("limit", [0, 2])
async def test_max_inflight_requests_holds_up_a_python_decoupled_step(
    system: ActorSystem, tmp_path: Path, limit: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same with the python backend's `repeat` as the decoupled step, served as the server
    serves it (its process read by the event loop, its sender wrapped by the router): the
    responses waiting for the next step stay within the limit."""
    waiting: list[int] = []  # after each delivery, how many wait to be taken
    held = held_up(monkeypatch)
    deliver = ResponseStream._deliver

    def counted(self: ResponseStream, *answer: Any) -> None:
        deliver(self, *answer)
        waiting.append(self._waiting)

    monkeypatch.setattr(ResponseStream, "_deliver", counted)
    shutil.copytree(PYTHON_MODELS / "repeat", tmp_path / "repeat")
    router = Router()
    config = (tmp_path / "repeat" / "config.pbtxt").read_text()
    await serve(system, router, PythonBackend(), config, tmp_path, model_file="model.py")
    gauge = Gauge()
    await serve(
        system, router, FunctionBackend(gauge), ONE.format(name="double", count=4), tmp_path
    )
    await serve(system, router, EnsembleBackend(), limited(PYTHON_STREAMED, limit), tmp_path)
    collected = Collected()
    data = np.arange(40, dtype=np.int32)
    streamed = InferenceRequest("python_streamed", inputs=[Tensor("IN", "INT32", (40,), data)])
    streamed.sender = collected.sender
    router.submit(streamed)
    try:
        # The gate closed, none of the next step's executes finishes.
        if limit:
            # The step full, the model's next send is held up.
            await until(lambda: gauge.running >= limit and held.is_set())
        else:
            await until(lambda: len(waiting) >= 40)  # nothing holds the model up
    finally:
        gauge.gate.set()
    with anyio.fail_after(PATIENCE_S):
        await collected.done.wait()
    assert collected.by_index() == {i: 2 * i for i in range(40)}
    if limit:
        assert max(waiting) <= limit + 1
        assert gauge.most <= limit


class FailsOnZero(BackendInstance):
    """`double`, failing the request whose X is 0."""

    def execute(self, requests: list[InferenceRequest]) -> list[Result]:
        results: list[Result] = []
        for request in requests:
            x = request.inputs[0].data
            if int(x.flat[0]) == 0:
                results.append(internal("zero"))
                continue
            outputs = [Tensor("Y", "INT32", x.shape, x * 2)]
            results.append(InferenceResponse(request.model_name, "1", request.id, outputs))
        return results


async def test_once_a_step_fails_no_further_step_is_routed(
    system: ActorSystem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A decoupled step's responses still queued when a step they opened fails start nothing:
    the run is over, and none of them reaches the next step's model after the failure."""
    from tritonactor.scheduling import ensemble_run

    class FailsOnZeroBackend(Backend):
        name = "function"

        def load_model(self, context: ModelContext) -> BackendModel:
            class Model(BackendModel):
                def create_instance(self, context: InstanceContext) -> BackendInstance:
                    return FailsOnZero()

            return Model()

    failed: list[TritonError] = []
    routed_after: list[str] = []
    fail, route = ensemble_run.EnsembleRun._fail, Router._route

    def noting_fail(run: Any, error: TritonError) -> None:
        failed.append(error)
        fail(run, error)

    def noting_route(router: Router, request: InferenceRequest) -> Any:
        if failed and request.model_name == "double":
            routed_after.append(request.model_name)
        return route(router, request)

    monkeypatch.setattr(ensemble_run.EnsembleRun, "_fail", noting_fail)
    monkeypatch.setattr(Router, "_route", noting_route)
    router = Router()
    await serve(system, router, SplitBackend(), SPLIT, tmp_path)
    await serve(system, router, FailsOnZeroBackend(), ONE.format(name="double", count=4), tmp_path)
    await serve(system, router, EnsembleBackend(), STREAMED, tmp_path)
    for _ in range(5):
        failed.clear()
        collected = await stream(router, "streamed", list(range(300)))
        assert failed and len(collected.errors) == 1, collected.errors
        assert routed_after == []


@pytest.mark.parametrize(
    ("dims", "batching", "batch", "shape", "expected"),
    [
        ((4,), True, 0, (4,), (1, 4)),  # unbatched, fits: gains a batch of 1
        ((-1,), True, 0, (3,), (1, 3)),
        ((4,), True, 0, (2, 4), (2, 4)),  # does not fit: taken as batched already
        ((4,), False, 1, (1, 4), (4,)),  # a batch of 1 that does not fit: loses it
        ((-1, 4), False, 1, (1, 4), (1, 4)),  # fits as it is: kept
        ((4,), False, 2, (2, 4), (2, 4)),  # a batch of 2 cannot be dropped
        ((4,), True, 3, (3, 4), (3, 4)),  # both sides batch: nothing to convert
        ((4,), False, 0, (4,), (4,)),  # neither does
    ],
)
def test_a_tensor_is_reshaped_between_batching_and_not_as_triton_does(
    dims: tuple[int, ...],
    batching: bool,
    batch: int,
    shape: tuple[int, ...],
    expected: tuple[int, ...],
) -> None:
    assert batch_reshaped(dims, batching, batch, shape) == expected


def test_the_plan_keeps_the_ensembles_batching_and_its_outputs_dims_as_reshaped() -> None:
    # As Triton's ensemble reshapes its answer against an output's `reshape` where it has one.
    text = CHAIN.replace(
        'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 2 ] } ]',
        'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1, 2 ] reshape { shape: [ 2 ] } } ]',
    ).replace('platform: "ensemble"', 'platform: "ensemble"\nmax_batch_size: 4')
    plan = plan_ensemble(parse_pbtxt(text))
    assert plan.max_batch_size == 4
    assert plan.output_dims == {"OUT": (2,)}
    assert plan_ensemble(parse_pbtxt(CHAIN)).output_dims == {"OUT": (2,)}
