"""Ensembles in-process: DAG checks at load, and requests through router -> ensemble scheduler ->
step models."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import anyio
import numpy as np
import pytest

from tritonactor.actors import ActorSystem
from tritonactor.backends.base import (
    Backend,
    BackendInstance,
    BackendModel,
    InstanceContext,
    ModelContext,
    Result,
)
from tritonactor.backends.ensemble import EnsembleBackend, plan_ensemble
from tritonactor.config.model_config import parse_pbtxt
from tritonactor.config.normalize import fill_defaults, instance_specs
from tritonactor.core.errors import ErrorCode, TritonError, internal
from tritonactor.core.types import InferenceRequest, InferenceResponse, Tensor
from tritonactor.scheduling.model import ModelVersionActor
from tritonactor.scheduling.router import ModelHandle, Router
from tritonactor.scheduling.signature import ModelSignature

pytestmark = pytest.mark.anyio

Function = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


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
    system: ActorSystem, router: Router, backend: Backend, text: str, repository: Path
) -> None:
    config = fill_defaults(parse_pbtxt(text), gpus=0)
    (repository / config.name / "1").mkdir(parents=True, exist_ok=True)
    context = ModelContext(
        config.name,
        1,
        config,
        repository / config.name,
        repository / config.name / "1",
        repository / config.name / "1" / "model",
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
    assert "step model 'double'" in caught.value.message
    assert "negative input" in caught.value.message
    response = await router.infer(request("chain", 2))  # the next request is served
    np.testing.assert_array_equal(response.outputs[0].data, [12, 18])


async def test_a_step_model_that_is_not_ready_fails_the_request(
    system: ActorSystem, tmp_path: Path
) -> None:
    router = Router()
    await serve(
        system, router, FunctionBackend(double), model_config("double", ["X"], ["Y"]), tmp_path
    )
    (tmp_path / "triple").mkdir()
    await serve(system, router, EnsembleBackend(), CHAIN, tmp_path)
    with pytest.raises(TritonError) as caught:
        await router.infer(request("chain", 1))
    assert caught.value.code is ErrorCode.NOT_FOUND
    assert "step model 'triple'" in caught.value.message


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
            "has a cycle among the steps of models 'a', 'b', 'c'",
        ),
        (
            ensemble(step("a", {"X": "IN"}, {"Y": "OUT"}), inputs="IN,UNUSED"),
            "input 'UNUSED' is not read by any step",
        ),
        (
            ensemble(step("a", {"X": "IN"}, {"Y": "mid"})),
            "output 'OUT' is not produced by any step",
        ),
        (
            ensemble(step("a", {"X": "IN", "Z": "nowhere"}, {"Y": "OUT"})),
            "tensor 'nowhere' read by step 0 (model 'a') is neither an ensemble input",
        ),
        (
            ensemble(
                step("a", {"X": "IN"}, {"Y": "OUT"}) + "," + step("b", {"X": "IN"}, {"Y": "OUT"})
            ),
            "tensor 'OUT' is produced by both step 0 (model 'a') and step 1 (model 'b')",
        ),
        (
            ensemble(step("a", {"X": "IN"}, {"Y": "IN"})),
            "tensor 'IN' is produced by both the ensemble's inputs and step 0",
        ),
        (
            ensemble(step("", {"X": "IN"}, {"Y": "OUT"})),
            "step 0 names no model",
        ),
    ],
)
def test_invalid_dags_are_refused(text: str, reason: str) -> None:
    with pytest.raises(TritonError) as caught:
        plan_ensemble(parse_pbtxt(text))
    assert reason in caught.value.message


def test_a_step_naming_a_model_outside_the_repository_fails_the_load(tmp_path: Path) -> None:
    config = fill_defaults(parse_pbtxt(CHAIN), gpus=0)
    (tmp_path / "double").mkdir()
    context = ModelContext(
        "chain", 1, config, tmp_path / "chain", tmp_path / "chain" / "1", tmp_path / "chain" / "1"
    )
    with pytest.raises(TritonError) as caught:
        EnsembleBackend().load_model(context)
    assert "step model 'triple' is not in the model repository" in caught.value.message


def test_an_ensemble_has_no_instances() -> None:
    assert instance_specs(fill_defaults(parse_pbtxt(CHAIN), gpus=0)) == []
