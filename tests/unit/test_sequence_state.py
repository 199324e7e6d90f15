"""Implicit state in the sequence batcher: state configs checked at load, initial states, and
the state carried from each request's output to the sequence's next request (in-process:
router -> SequenceBatcher -> instance actors, with a test backend computing
STATE_OUT = STATE_IN + IN, OUT = STATE_OUT and remembering nothing itself)."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
from onnx import TensorProto, helper

from tests.onnx_models import save_model
from tests.unit.test_sequence_batcher import until
from tritonactor.actors import ActorSystem, Reply
from tritonactor.backends.base import (
    Backend,
    BackendInstance,
    BackendModel,
    InstanceContext,
    ModelContext,
    Result,
)
from tritonactor.backends.onnxruntime import OnnxRuntimeBackend
from tritonactor.config.model_config import parse_pbtxt
from tritonactor.config.normalize import fill_defaults
from tritonactor.core.errors import ErrorCode, TritonError
from tritonactor.core.types import (
    OUTPUT_BUFFERS,
    InferenceRequest,
    InferenceResponse,
    RequestedOutput,
    Tensor,
)
from tritonactor.scheduling.factory import scheduler_for
from tritonactor.scheduling.model import ModelVersionActor
from tritonactor.scheduling.router import ModelHandle, Router
from tritonactor.scheduling.sequence import NULL_REQUEST, SequenceBatcher
from tritonactor.scheduling.sequence_state import parse_states
from tritonactor.scheduling.signature import ModelSignature

pytestmark = pytest.mark.anyio

STATE = 'input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_INT32 dims: [ {dims} ]'

CONFIG = """
name: "acc"
max_batch_size: {max_batch_size}
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ {dims} ] }} {extra_output} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
sequence_batching {{
  {strategy}
  control_input [
    {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] }} ] }}
  ]
  state [ {{ {state} {initial} }} ]
}}
"""


def config_text(
    max_batch_size: int = 0,
    strategy: str = "",
    dims: str = "1",
    initial: str = "",
    extra_output: str = "",
    state: str | None = None,
) -> str:
    return CONFIG.format(
        max_batch_size=max_batch_size,
        strategy=strategy,
        dims=dims,
        initial=initial,
        extra_output=extra_output,
        state=STATE.format(dims=dims) if state is None else state,
    )


def load_error(text: str, model_dir: Path | None = None) -> TritonError:
    with pytest.raises(TritonError) as caught:
        scheduler_for(parse_pbtxt(text), model_dir=model_dir)
    return caught.value


# -- configs -------------------------------------------------------------------------------------


def test_a_state_config_makes_a_sequence_batcher() -> None:
    assert isinstance(scheduler_for(parse_pbtxt(config_text())), SequenceBatcher)


@pytest.mark.parametrize(
    ("state", "reason"),
    [
        ('output_name: "O" data_type: TYPE_INT32 dims: [ 1 ]', "must specify an input_name"),
        ('input_name: "S" data_type: TYPE_INT32 dims: [ 1 ]', "must specify an output_name"),
        (
            'input_name: "IN" output_name: "O" data_type: TYPE_INT32 dims: [ 1 ]',
            "'IN': input_name is also a model input",
        ),
        (
            'input_name: "READY" output_name: "O" data_type: TYPE_INT32 dims: [ 1 ]',
            "input_name is also a control input",
        ),
        (
            'input_name: "S" output_name: "IN" data_type: TYPE_INT32 dims: [ 1 ]',
            "output_name 'IN' is also a model or control input",
        ),
        ('input_name: "S" output_name: "O" dims: [ 1 ]', "'S' must specify a data_type"),
    ],
)
def test_a_bad_state_fails_the_load_with_its_reason(state: str, reason: str) -> None:
    error = load_error(config_text(state=state))
    assert error.code == ErrorCode.INVALID_ARG
    assert reason in error.message


def test_two_states_may_not_share_a_name() -> None:
    text = config_text().replace(
        "state [ {", 'state [ { input_name: "STATE_IN" output_name: "X" data_type: TYPE_INT32 }, {'
    )
    assert "input_name is given by more than one state" in load_error(text).message


def test_the_state_output_may_be_a_config_output() -> None:
    # Triton lets a client ask for the state output when the config lists it (for debugging).
    extra = ', { name: "STATE_OUT" data_type: TYPE_INT32 dims: [ 1 ] }'
    assert isinstance(scheduler_for(parse_pbtxt(config_text(extra_output=extra))), SequenceBatcher)


def test_a_decoupled_model_cannot_keep_implicit_state() -> None:
    text = config_text() + "model_transaction_policy { decoupled: true }"
    assert load_error(text).code == ErrorCode.UNSUPPORTED


def initial(body: str, name: str = 'name: "init"') -> str:
    return f"initial_state: {{ data_type: TYPE_INT32 {name} {body} }}"


@pytest.mark.parametrize(
    ("dims", "body", "reason"),
    [
        ("2", "dims: [ 2 ]", "must set zero_data or data_file"),
        ("2", "dims: [ 3 ] zero_data: true", "do not match the state dims"),
        ("-1", "dims: [ -1 ] zero_data: true", "has a variable dim"),
        ("2", "dims: [ 2, 1 ] zero_data: true", "has 2 dims but the state has 1"),
        ("2", 'dims: [ 2 ] data_file: "missing"', "cannot be read"),
        ("2", 'dims: [ 2 ] data_file: "../escape"', "is outside the model's initial_state folder"),
        ("2", 'dims: [ 2 ] data_file: "short"', "needs 8 bytes, but data_file"),
    ],
)
def test_a_bad_initial_state_fails_the_load(
    tmp_path: Path, dims: str, body: str, reason: str
) -> None:
    (tmp_path / "initial_state").mkdir()
    (tmp_path / "initial_state" / "short").write_bytes(b"\x01\x00\x00\x00")
    (tmp_path / "escape").write_bytes(bytes(8))
    error = load_error(config_text(dims=dims, initial=initial(body)), tmp_path)
    assert error.code == ErrorCode.INVALID_ARG
    assert reason in error.message


def test_an_initial_state_needs_its_name_and_the_state_type() -> None:
    no_name = config_text(dims="2", initial=initial("dims: [ 2 ] zero_data: true", name=""))
    assert "must specify a name" in load_error(no_name).message
    other = config_text(
        dims="2",
        initial='initial_state: { data_type: TYPE_FP32 name: "i" dims: [ 2 ] zero_data: true }',
    )
    assert "a data_type other than the state's" in load_error(other).message


def test_a_data_file_needs_the_model_directory() -> None:
    text = config_text(dims="2", initial=initial('dims: [ 2 ] data_file: "values"'))
    assert "cannot be read: no model directory" in load_error(text, None).message


def test_initial_states(tmp_path: Path) -> None:
    # No initial_state: zeros, a variable dim taken as 1 (as Triton sizes it).
    (spec,) = parse_states("acc", parse_pbtxt(config_text(dims="-1, 3")), None)
    assert spec.initial.shape == (1, 3) and not spec.initial.any()
    (spec,) = parse_states("acc", parse_pbtxt(config_text(max_batch_size=4, dims="2")), None)
    assert spec.initial.shape == (1, 2)  # the batch dimension leads
    zero = config_text(dims="-1", initial=initial("dims: [ 3 ] zero_data: true"))
    (spec,) = parse_states("acc", parse_pbtxt(zero), None)
    assert spec.initial.tolist() == [0, 0, 0] and spec.initial.dtype == np.int32
    folder = tmp_path / "initial_state"
    folder.mkdir()
    # Little-endian elements, row-major; bytes past what the dims need are ignored.
    (folder / "values").write_bytes(np.array([5, -6, 7], dtype="<i4").tobytes())
    from_file = config_text(dims="2", initial=initial('dims: [ 2 ] data_file: "values"'))
    (spec,) = parse_states("acc", parse_pbtxt(from_file), tmp_path)
    assert spec.initial.tolist() == [5, -6]


# -- serving -------------------------------------------------------------------------------------


class StateInstance(BackendInstance):
    def __init__(self, backend: StateBackend) -> None:
        self.backend = backend

    def execute(self, requests: list[InferenceRequest]) -> list[Result]:
        backend = self.backend
        with backend.lock:
            backend.entered += 1
        if not backend.gate.wait(timeout=10):
            raise RuntimeError("the test never released the instance")
        results: list[Result] = []
        for request in requests:
            tensors = {tensor.name: tensor for tensor in request.inputs}
            backend.offered.append(OUTPUT_BUFFERS in request.context)
            state = tensors["STATE_IN"].data
            with backend.lock:
                backend.seen.append(
                    (request.id, bool(tensors["READY"].data.reshape(-1)[0]), state.tolist())
                )
            new = state + tensors["IN"].data
            if backend.drop_state:
                outputs = [Tensor("OUT", "INT32", new.shape, new)]
            else:
                outputs = [
                    Tensor(name, "INT32", new.shape, new) for name in request.requested_output_names
                ]
            results.append(InferenceResponse("acc", "1", request.id, outputs))
        return results


class StateModel(BackendModel):
    def __init__(self, backend: StateBackend) -> None:
        self.backend = backend

    def create_instance(self, context: InstanceContext) -> BackendInstance:
        return StateInstance(self.backend)


class StateBackend(Backend):
    name = "state"

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.lock = threading.Lock()
        self.seen: list[tuple[str, bool, Any]] = []
        self.drop_state = False
        self.offered: list[bool] = []  # whether each request came with places for its outputs
        self.entered = 0  # executes begun (some may wait at the gate)

    def load_model(self, context: ModelContext) -> BackendModel:
        return StateModel(self)


@pytest.fixture
async def system() -> AsyncIterator[ActorSystem]:
    async with ActorSystem() as actors:
        yield actors


async def serve(system: ActorSystem, backend: StateBackend, text: str) -> Router:
    config = fill_defaults(parse_pbtxt(text), gpus=0)
    ctx = ModelContext("acc", 1, config, Path("."), Path("1"), Path("1/model"))
    actor = ModelVersionActor(backend, ctx)
    await system.spawn(actor)
    assert actor.scheduler is not None
    router = Router()
    router.known.add("acc")
    signature = ModelSignature.from_config(config)
    router.add(ModelHandle("acc", 1, config, signature, actor.scheduler, actor.statistics))
    return router


def step(
    value: int,
    request_id: str,
    corrid: int,
    start: bool = False,
    end: bool = False,
    batching: bool = False,
    outputs: tuple[str, ...] = ("OUT",),
) -> InferenceRequest:
    shape = (1, 1) if batching else (1,)
    return InferenceRequest(
        "acc",
        id=request_id,
        inputs=[Tensor("IN", "INT32", shape, np.full(shape, value, dtype=np.int32))],
        outputs=[RequestedOutput(name) for name in outputs],
        parameters={"sequence_id": corrid, "sequence_start": start, "sequence_end": end},
    )


async def answers(replies: list[Reply[InferenceResponse]]) -> list[InferenceResponse]:
    with anyio.fail_after(10):
        return [await reply.wait() for reply in replies]


def batcher(router: Router) -> SequenceBatcher:
    scheduler = router.resolve("acc").scheduler._actor  # the batcher itself, to read its state
    assert isinstance(scheduler, SequenceBatcher)
    return scheduler


def value(response: InferenceResponse) -> int:
    return int(response.outputs[0].data.reshape(-1)[0])


@pytest.mark.parametrize(
    ("max_batch_size", "strategy"),
    [(0, "oldest { max_candidate_sequences: 2 }"), (4, "direct { }"), (4, "oldest { }")],
)
async def test_interleaved_sequences_keep_separate_states(
    system: ActorSystem, max_batch_size: int, strategy: str
) -> None:
    backend = StateBackend()
    router = await serve(system, backend, config_text(max_batch_size, strategy))
    batching = max_batch_size > 0
    plan = [
        (1, "a0", 1, True, False),
        (100, "b0", 2, True, False),
        (2, "a1", 1, False, False),
        (200, "b1", 2, False, False),
        (3, "a2", 1, False, False),
        (300, "b2", 2, False, True),
        (10, "a3", 1, True, False),  # a second START: the state starts over
        (20, "a4", 1, False, True),
    ]
    replies = [router.submit(step(v, i, c, s, e, batching)) for v, i, c, s, e in plan]
    responses = await answers(replies)
    assert [value(r) for r in responses] == [1, 100, 3, 300, 6, 600, 10, 30]
    # The client asked for OUT only: the state output stays with the batcher.
    assert all([t.name for t in r.outputs] == ["OUT"] for r in responses)
    # A sequence that ended is gone with its state: the same ID starts from zero again.
    again = await answers([router.submit(step(5, "b3", 2, True, True, batching))])
    assert value(again[0]) == 5


async def test_each_sequence_starts_from_its_initial_state(system: ActorSystem) -> None:
    backend = StateBackend()
    text = config_text(dims="2", initial=initial("dims: [ 2 ] zero_data: true"))
    router = await serve(system, backend, text)
    replies = [
        router.submit(step(1, "x0", 9, start=True)),
        router.submit(step(2, "x1", 9, end=True)),
    ]
    responses = await answers(replies)
    assert [r.outputs[0].data.tolist() for r in responses] == [[1, 1], [3, 3]]
    assert [state for _, _, state in backend.seen] == [[0, 0], [1, 1]]


async def test_a_client_may_ask_for_a_state_output_the_config_lists(system: ActorSystem) -> None:
    backend = StateBackend()
    extra = ', { name: "STATE_OUT" data_type: TYPE_INT32 dims: [ 1 ] }'
    router = await serve(system, backend, config_text(extra_output=extra))
    asked = step(4, "a", 1, start=True, outputs=("STATE_OUT",))
    every = step(5, "b", 1, outputs=())  # no outputs named: every config output
    first, second = await answers([router.submit(asked), router.submit(every)])
    assert [(t.name, int(t.data[0])) for t in first.outputs] == [("STATE_OUT", 4)]
    assert [(t.name, int(t.data[0])) for t in second.outputs] == [("OUT", 9), ("STATE_OUT", 9)]


async def test_null_rows_get_a_zero_state_and_change_no_sequence(system: ActorSystem) -> None:
    backend = StateBackend()
    router = await serve(system, backend, config_text(max_batch_size=4, strategy="direct { }"))
    backend.gate.clear()
    first = router.submit(step(1, "a0", 1, start=True, batching=True))
    await until(lambda: backend.entered == 1)  # sequence 1 (slot 0) runs, held at the gate
    second = router.submit(step(10, "b0", 2, start=True, batching=True))
    await until(lambda: batcher(router).queue_depth == 1)  # b0 waits in slot 1 for the instance
    assert backend.entered == 1
    backend.gate.set()
    assert [value(r) for r in await answers([first, second])] == [1, 10]
    assert value((await answers([router.submit(step(2, "a1", 1, batching=True))]))[0]) == 3
    # Sequence 2 (slot 1) ran while slot 0 had nothing ready: a null row with a zero state.
    assert backend.seen == [
        ("a0", True, [[0]]),
        ("", False, [[0]]),
        ("b0", True, [[0]]),
        ("a1", True, [[1]]),
    ]
    assert NULL_REQUEST  # the marker statistics may use to skip such requests


async def test_a_model_that_does_not_return_its_state_output_keeps_the_state(
    system: ActorSystem,
) -> None:
    """Triton serves such a model (its python backend carries no state): the request is
    answered, and the state stays as it was, the initial one here."""
    backend = StateBackend()
    backend.drop_state = True
    router = await serve(system, backend, config_text())
    first, second = await answers(
        [router.submit(step(1, "a", 1, start=True)), router.submit(step(2, "b", 1))]
    )
    assert (value(first), value(second)) == (1, 2)  # 0 + 1, then 0 + 2: the initial state
    statistics = router.resolve("acc").statistics
    assert (statistics.success.count, statistics.fail.count) == (2, 0)
    backend.drop_state = False
    third, fourth = await answers(
        [router.submit(step(3, "c", 1)), router.submit(step(4, "d", 1, end=True))]
    )
    assert (value(third), value(fourth)) == (3, 7)  # the state kept from then on


# -- the ONNX backend with state and control inputs ----------------------------------------------

ONNX_CONFIG = """
name: "acc"
platform: "onnxruntime_onnx"
max_batch_size: 4
sequence_batching {
  control_input [
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] }
  ]
  state [ { input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
}
"""


def onnx_accumulator(path: Path) -> None:
    """STATE_OUT = STATE_IN + IN * READY; OUT = STATE_OUT. All [batch, 1] INT32."""
    shape = ["batch", 1]
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["IN", "READY"], ["GATED"]),
            helper.make_node("Add", ["STATE_IN", "GATED"], ["STATE_OUT"]),
            helper.make_node("Identity", ["STATE_OUT"], ["OUT"]),
        ],
        "accumulator",
        [
            helper.make_tensor_value_info(n, TensorProto.INT32, shape)
            for n in ("IN", "READY", "STATE_IN")
        ],
        [helper.make_tensor_value_info(n, TensorProto.INT32, shape) for n in ("OUT", "STATE_OUT")],
    )
    save_model(graph, path)


def onnx_context(config_text: str, tmp_path: Path) -> ModelContext:
    version_dir = tmp_path / "acc" / "1"
    onnx_accumulator(version_dir / "model.onnx")
    config = OnnxRuntimeBackend().auto_complete_config(parse_pbtxt(config_text), version_dir)
    return ModelContext(
        "acc", 1, config, version_dir.parent, version_dir, version_dir / "model.onnx"
    )


def test_onnx_auto_complete_leaves_control_and_state_tensors_to_the_batcher(
    tmp_path: Path,
) -> None:
    context = onnx_context(ONNX_CONFIG, tmp_path)
    assert [t.name for t in context.config.input] == ["IN"]
    assert [t.name for t in context.config.output] == ["OUT"]
    assert isinstance(scheduler_for(context.config), SequenceBatcher)


def test_onnx_feeds_the_state_and_controls_the_batcher_adds(tmp_path: Path) -> None:
    context = onnx_context(ONNX_CONFIG, tmp_path)
    cpu = InstanceContext("acc_0", "KIND_CPU", 0, 0)
    instance = OnnxRuntimeBackend().load_model(context).create_instance(cpu)

    def row(value: int, ready: int, state: int) -> InferenceRequest:
        tensors = {"IN": value, "READY": ready, "STATE_IN": state}
        return InferenceRequest(
            "acc",
            inputs=[
                Tensor(n, "INT32", (1, 1), np.full((1, 1), v, dtype=np.int32))
                for n, v in tensors.items()
            ],
            outputs=[RequestedOutput("OUT"), RequestedOutput("STATE_OUT")],
        )

    results = instance.execute([row(5, 1, 10), row(7, 0, 0), row(1, 1, 2)])
    got = [[int(t.data[0, 0]) for t in r.outputs] for r in results]  # type: ignore[union-attr]
    assert got == [[15, 15], [0, 0], [3, 3]]


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (('output_name: "STATE_OUT"', 'output_name: "NOPE"'), "state output 'NOPE' is not an"),
        (('input_name: "STATE_IN"', 'input_name: "NOPE"'), "state input 'NOPE' is not an"),
        (("TYPE_INT32 dims: [ 1 ] }", "TYPE_INT64 dims: [ 1 ] }"), "has data type TYPE_INT64"),
    ],
)
def test_onnx_refuses_a_state_the_graph_does_not_have(
    tmp_path: Path, change: tuple[str, str], reason: str
) -> None:
    text = ONNX_CONFIG.replace(*change).replace(
        "sequence_batching",
        'input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\nsequence_batching',
    )
    context = onnx_context(text, tmp_path)
    with pytest.raises(TritonError) as caught:
        OnnxRuntimeBackend().load_model(context)
    assert caught.value.code == ErrorCode.INVALID_ARG
    assert reason in caught.value.message


async def test_a_model_keeping_state_is_never_offered_client_memory_to_write_outputs_into(
    system: ActorSystem,
) -> None:
    # Its state is kept from its outputs: written into a client's shared memory, the next
    # step's state would be whatever the client put there meanwhile.
    backend = StateBackend()
    text = config_text(extra_output=', { name: "STATE_OUT" data_type: TYPE_INT32 dims: [ 1 ] }')
    router = await serve(system, backend, text)
    places = {"OUT": memoryview(bytearray(4)), "STATE_OUT": memoryview(bytearray(4))}
    steps = [step(1, "s0", 7, start=True), step(2, "s1", 7, end=True)]
    for request in steps:
        request.outputs = [RequestedOutput("OUT"), RequestedOutput("STATE_OUT")]
        request.context[OUTPUT_BUFFERS] = lambda _: places
    responses = await answers([router.submit(request) for request in steps])
    assert [value(r) for r in responses] == [1, 3]
    assert backend.offered == [False, False]
