"""What one ensemble request runs and answers, in-process: optional inputs left out and step
outputs not produced (a step runs once every tensor it reads is resolved), pruning of the steps
no requested output needs, the sequence parameters of every response, and the ensemble's own
statistics."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path

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
from tritonactor.backends.ensemble import EnsembleBackend, needed_steps, plan_ensemble
from tritonactor.config.model_config import parse_pbtxt
from tritonactor.config.normalize import fill_defaults
from tritonactor.core.errors import ErrorCode, TritonError
from tritonactor.core.types import InferenceRequest, InferenceResponse, RequestedOutput, Tensor
from tritonactor.scheduling.model import ModelVersionActor
from tritonactor.scheduling.router import ModelHandle, Router
from tritonactor.scheduling.signature import ModelSignature

pytestmark = pytest.mark.anyio

Function = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


class Recorded(BackendInstance):
    def __init__(self, backend: RecordingBackend) -> None:
        self.backend = backend

    def execute(self, requests: list[InferenceRequest]) -> list[Result]:
        results: list[Result] = []
        for request in requests:
            with self.backend.lock:
                self.backend.calls.append(sorted(tensor.name for tensor in request.inputs))
            values = {tensor.name: tensor.data for tensor in request.inputs}
            outputs = [
                Tensor(name, "FP32", data.shape, data)
                for name, data in self.backend.function(values).items()
            ]
            results.append(
                InferenceResponse(request.model_name, "1", request.id, outputs, {"own": 1})
            )
        return results


class RecordingModel(BackendModel):
    def __init__(self, backend: RecordingBackend) -> None:
        self.backend = backend

    def create_instance(self, context: InstanceContext) -> BackendInstance:
        return Recorded(self.backend)


class RecordingBackend(Backend):
    """Runs `function` on the inputs present; records the input names of every request."""

    name = "recording"

    def __init__(self, function: Function) -> None:
        self.function = function
        self.lock = threading.Lock()
        self.calls: list[list[str]] = []

    def load_model(self, context: ModelContext) -> BackendModel:
        return RecordingModel(self)


def pick(values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """OUTPUTi for each INPUTi present (nothing for an absent one), as Triton's optional
    identity model does."""
    return {f"OUTPUT{name[-1]}": data for name, data in values.items()}


def plus(values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"Y": values["X"] + 1}


def minus(values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"Y": values["X"] - 1}


def tensors(names: str, optional: bool = False) -> str:
    flag = " optional: true" if optional else ""
    return ", ".join(
        f'{{ name: "{n}" data_type: TYPE_FP32 dims: [ 1 ]{flag} }}' for n in names.split()
    )


PICK = f"""
name: "pick" max_batch_size: 4
input [ {tensors("INPUT0 INPUT1", optional=True)} ]
output [ {tensors("OUTPUT0 OUTPUT1")} ]
"""


def one(name: str) -> str:
    return f'name: "{name}" max_batch_size: 4 input [ {tensors("X")} ] output [ {tensors("Y")} ]'


def ensemble(name: str, inputs: str, outputs: str, steps: str, optional: bool = True) -> str:
    return f"""
name: "{name}" platform: "ensemble" max_batch_size: 4
input [ {tensors(inputs, optional)} ]
output [ {tensors(outputs)} ]
ensemble_scheduling {{ step [ {steps} ] }}
"""


def step(model: str, inputs: dict[str, str], outputs: dict[str, str]) -> str:
    ins = " ".join(f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
    outs = " ".join(f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
    return f'{{ model_name: "{model}" model_version: -1 {ins} {outs} }}'


BOTH = {"INPUT0": "INPUT0", "INPUT1": "INPUT1"}
WRAP = ensemble(
    "wrap",
    "INPUT0 INPUT1",
    "OUTPUT0 OUTPUT1",
    step("pick", BOTH, {"OUTPUT0": "OUTPUT0", "OUTPUT1": "OUTPUT1"}),
)
# Triton's qa optional_connecting_tensor: the second step reads both tensors the first one
# may produce; a tensor it did not produce feeds an optional input.
CONNECT = ensemble(
    "connect",
    "INPUT0 INPUT1",
    "OUTPUT0 OUTPUT1",
    step("pick", BOTH, {"OUTPUT0": "between0", "OUTPUT1": "between1"})
    + ","
    + step(
        "pick",
        {"INPUT0": "between0", "INPUT1": "between1"},
        {"OUTPUT0": "OUTPUT0", "OUTPUT1": "OUTPUT1"},
    ),
)
# A tensor that may be absent feeds a required input.
REQUIRED = ensemble(
    "required",
    "INPUT0 INPUT1",
    "A R",
    step("pick", BOTH, {"OUTPUT0": "A", "OUTPUT1": "between"})
    + ","
    + step("plus", {"X": "between"}, {"Y": "R"}),
)
# Each step reads one optional ensemble input.
SEPARATE = ensemble(
    "separate",
    "INPUT0 INPUT1",
    "A B",
    step("pick", {"INPUT0": "INPUT0"}, {"OUTPUT0": "A"})
    + ","
    + step("pick", {"INPUT1": "INPUT1"}, {"OUTPUT1": "B"}),
)
# Two branches from one input, and a step fed by one of them.
PRUNE = ensemble(
    "prune",
    "IN",
    "A B C",
    step("plus", {"X": "IN"}, {"Y": "A"})
    + ","
    + step("minus", {"X": "IN"}, {"Y": "lower"})
    + ","
    + step("plus", {"X": "lower"}, {"Y": "B"})
    + ","
    + step("minus", {"X": "lower"}, {"Y": "C"}),
    optional=False,
)


@pytest.fixture
async def system() -> AsyncIterator[ActorSystem]:
    async with ActorSystem() as actors:
        yield actors


class Served:
    def __init__(self, system: ActorSystem, repository: Path) -> None:
        self.system = system
        self.repository = repository
        self.router = Router()
        self.actors: dict[str, ModelVersionActor] = {}
        self.backends = {
            "pick": RecordingBackend(pick),
            "plus": RecordingBackend(plus),
            "minus": RecordingBackend(minus),
        }

    async def add(self, backend: Backend, text: str) -> None:
        config = fill_defaults(parse_pbtxt(text), gpus=0)
        version_dir = self.repository / config.name / "1"
        version_dir.mkdir(parents=True, exist_ok=True)
        context = ModelContext(
            config.name, 1, config, version_dir.parent, version_dir, version_dir / "model"
        )
        actor = ModelVersionActor(backend, context, infer=self.router.infer)
        await self.system.spawn(actor)
        assert actor.scheduler is not None
        self.actors[config.name] = actor
        self.router.known.add(config.name)
        signature = ModelSignature.from_config(config)
        self.router.add(
            ModelHandle(config.name, 1, config, signature, actor.scheduler, actor.statistics)
        )


@pytest.fixture
async def served(system: ActorSystem, tmp_path: Path) -> Served:
    served = Served(system, tmp_path)
    await served.add(served.backends["pick"], PICK)
    await served.add(served.backends["plus"], one("plus"))
    await served.add(served.backends["minus"], one("minus"))
    for text in (WRAP, CONNECT, REQUIRED, SEPARATE, PRUNE):
        await served.add(EnsembleBackend(), text)
    return served


def calls(served: Served, model: str) -> list[list[str]]:
    return served.backends[model].calls


def request(model: str, outputs: str = "", rows: int = 1, **values: float) -> InferenceRequest:
    inputs = [
        Tensor(name, "FP32", (rows, 1), np.full((rows, 1), value, dtype=np.float32))
        for name, value in values.items()
    ]
    return InferenceRequest(
        model, inputs=inputs, outputs=[RequestedOutput(name) for name in outputs.split()]
    )


def outputs_of(response: InferenceResponse) -> dict[str, float]:
    return {tensor.name: float(tensor.data.reshape(-1)[0]) for tensor in response.outputs}


# -- optional inputs and outputs not produced ------------------------------------------------


async def test_an_optional_input_left_out_does_not_stop_the_step_that_reads_it(
    served: Served,
) -> None:
    response = await served.router.infer(request("wrap", "OUTPUT1", INPUT1=5.0))
    assert outputs_of(response) == {"OUTPUT1": 5.0}
    assert calls(served, "pick") == [["INPUT1"]]  # the step ran with what was there


async def test_a_requested_output_that_no_step_produced_is_left_out_of_the_response(
    served: Served,
) -> None:
    # As Triton: no error, the response holds the outputs that were produced.
    response = await served.router.infer(request("wrap", "OUTPUT0 OUTPUT1", INPUT1=5.0))
    assert outputs_of(response) == {"OUTPUT1": 5.0}
    nothing = await served.router.infer(request("wrap", "OUTPUT0", INPUT1=5.0))
    assert nothing.outputs == []
    everything = await served.router.infer(request("wrap", INPUT0=1.0, INPUT1=2.0))
    assert outputs_of(everything) == {"OUTPUT0": 1.0, "OUTPUT1": 2.0}


async def test_a_step_runs_when_a_tensor_it_reads_was_not_produced(served: Served) -> None:
    response = await served.router.infer(request("connect", "OUTPUT0", INPUT0=7.0))
    assert outputs_of(response) == {"OUTPUT0": 7.0}
    # The second step read "between1", which the first did not produce: it ran without it.
    assert calls(served, "pick") == [["INPUT0"], ["INPUT0"]]


async def test_a_step_with_every_tensor_it_reads_absent_is_skipped(served: Served) -> None:
    response = await served.router.infer(request("separate", INPUT0=3.0))
    assert outputs_of(response) == {"A": 3.0}
    assert calls(served, "pick") == [["INPUT0"]]  # the step reading INPUT1 never ran


async def test_an_absent_tensor_for_a_required_input_fails_the_request_and_nothing_else(
    served: Served,
) -> None:
    with pytest.raises(TritonError) as caught:
        await served.router.infer(request("required", INPUT0=1.0))
    assert caught.value.code is ErrorCode.INVALID_ARG
    message = caught.value.message
    assert message.startswith("in ensemble 'required', ")
    assert "missing required input(s) ['X']" in message and "for model 'plus'" in message
    assert calls(served, "plus") == []  # refused by its validation, never executed
    # The ensemble goes on serving: with INPUT1 the tensor "between" exists.
    response = await served.router.infer(request("required", "R", INPUT1=1.0))
    assert outputs_of(response) == {"R": 2.0}


# -- pruning -----------------------------------------------------------------------------------


def test_the_steps_needed_for_some_outputs_are_those_leading_to_them() -> None:
    plan = plan_ensemble(parse_pbtxt(PRUNE))
    assert needed_steps(plan, ["A"]) == {0}
    assert needed_steps(plan, ["B"]) == {1, 2}
    assert needed_steps(plan, ["B", "C"]) == {1, 2, 3}
    assert needed_steps(plan, ["A", "B", "C"]) == {0, 1, 2, 3}


async def test_only_the_steps_leading_to_the_requested_outputs_run(served: Served) -> None:
    response = await served.router.infer(request("prune", "A", IN=10.0))
    assert outputs_of(response) == {"A": 11.0}
    assert (len(calls(served, "plus")), len(calls(served, "minus"))) == (1, 0)
    response = await served.router.infer(request("prune", "C", IN=10.0))
    assert outputs_of(response) == {"C": 8.0}
    assert (len(calls(served, "plus")), len(calls(served, "minus"))) == (1, 2)
    response = await served.router.infer(request("prune", IN=10.0))  # none named: all
    assert outputs_of(response) == {"A": 11.0, "B": 10.0, "C": 8.0}
    assert (len(calls(served, "plus")), len(calls(served, "minus"))) == (3, 4)
    statistics = served.actors["minus"].statistics
    assert statistics.success.count == 4


# -- sequence parameters -----------------------------------------------------------------------


async def test_every_ensemble_response_carries_the_request_sequence_flags(
    served: Served,
) -> None:
    plain = await served.router.infer(request("wrap", INPUT0=1.0))
    # Triton's: always there (0 and false without a sequence), and the steps' own are not.
    assert plain.parameters == {"sequence_id": 0, "sequence_start": False, "sequence_end": False}
    flagged = request("wrap", INPUT0=1.0)
    flagged.parameters.update(sequence_id=42, sequence_start=True)
    response = await served.router.infer(flagged)
    assert response.parameters == {
        "sequence_id": 42,
        "sequence_start": True,
        "sequence_end": False,
    }
    named = request("wrap", INPUT0=1.0)
    named.parameters.update(sequence_id="abc", sequence_end=True)
    response = await served.router.infer(named)
    assert response.parameters == {
        "sequence_id": "abc",
        "sequence_start": False,
        "sequence_end": True,
    }


# -- statistics --------------------------------------------------------------------------------


async def test_an_ensemble_counts_each_request_as_an_execution_of_its_batch_size(
    served: Served,
) -> None:
    router = served.router
    await router.infer(request("wrap", INPUT0=1.0))
    await router.infer(request("wrap", INPUT1=1.0))
    await router.infer(request("wrap", rows=3, INPUT0=1.0, INPUT1=2.0))
    with pytest.raises(TritonError):
        await router.infer(request("required", INPUT0=1.0))
    wrap = served.actors["wrap"].statistics
    assert (wrap.execution_count, wrap.inference_count) == (3, 5)
    assert {b.batch_size: b.compute_infer.count for b in wrap.batch_stats} == {1: 2, 3: 1}
    for duration in (wrap.success, wrap.queue, wrap.compute_input, wrap.compute_infer):
        assert duration.count == 3
    assert wrap.compute_output.count == 3
    assert wrap.compute_infer.ns > 0
    required = served.actors["required"].statistics
    assert (required.success.count, required.fail.count, required.execution_count) == (0, 1, 0)
    assert required.batch_stats == []
