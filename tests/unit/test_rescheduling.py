"""Requests a model releases with Triton's RESCHEDULE flag: the sequence batcher with
`iterative_sequence` runs them again next in their sequence's slot (in-process through router,
batcher and instance actors, and at the level of the batcher's messages); every other scheduler
fails them."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

from tritonactor.actors import Actor, ActorRef, ActorSystem, Reply
from tritonactor.backends.base import (
    RESCHEDULE,
    Backend,
    BackendInstance,
    BackendModel,
    InstanceContext,
    ModelContext,
    Result,
)
from tritonactor.config.model_config import parse_pbtxt
from tritonactor.config.normalize import fill_defaults
from tritonactor.core.errors import ErrorCode, TritonError
from tritonactor.core.types import (
    InferenceRequest,
    InferenceResponse,
    RequestedOutput,
    ResponseSender,
    Tensor,
)
from tritonactor.scheduling.messages import Execute, Infer, InstanceGone, InstanceIdle, Rescheduled
from tritonactor.scheduling.model import ModelVersionActor
from tritonactor.scheduling.router import ModelHandle, Router
from tritonactor.scheduling.sequence import SequenceBatcher
from tritonactor.scheduling.signature import ModelSignature

pytestmark = pytest.mark.anyio

# Bounds a wait for an event that is bound to happen: reached only when something is broken.
WAIT = 30

ITERATIVE = """
name: "iter"
max_batch_size: {max_batch_size}
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
{decoupled}
sequence_batching {{
  iterative_sequence: true
  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "END" control [ {{ kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 }} ] }}
  ]
}}
"""

REFUSED = "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE"


class Countdown(BackendInstance):
    """IN is how many executions a request needs: each one but the last releases it with
    RESCHEDULE (a decoupled request also gets a response per execution). The answer holds how
    many executions it took. Records every row: (id, START, END, CORRID, rows in the batch)."""

    def __init__(self, backend: CountdownBackend) -> None:
        self.backend = backend
        self.left: dict[int, int] = {}

    def execute(self, requests: list[InferenceRequest]) -> list[Result]:
        backend = self.backend
        backend.entered.set()
        if not backend.gate.wait(timeout=WAIT):
            raise RuntimeError("the test never released the instance")
        results: list[Result] = []
        for request in requests:
            value = {t.name: int(t.data.reshape(-1)[0]) for t in request.inputs}
            corrid = value["CORRID"]
            with backend.lock:
                row = (request.id, value["START"], value["END"], corrid, len(requests))
                backend.rows.append(row)
            if value["START"]:
                self.left[corrid] = value["IN"]
            self.left[corrid] -= 1
            done = value["IN"] - self.left[corrid]
            data = np.full(request.inputs[0].shape, done, dtype=np.int32)
            response = InferenceResponse(
                "iter", "1", request.id, [Tensor("OUT", "INT32", data.shape, data)]
            )
            if request.sender is not None:
                request.sender.send(response, final=not self.left[corrid])
                response = None  # type: ignore[assignment]
            results.append(RESCHEDULE if self.left[corrid] else response)
        return results


class CountdownModel(BackendModel):
    def __init__(self, backend: CountdownBackend) -> None:
        self.backend = backend

    def create_instance(self, context: InstanceContext) -> BackendInstance:
        return Countdown(self.backend)


class CountdownBackend(Backend):
    name = "countdown"

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.lock = threading.Lock()
        self.rows: list[tuple[str, int, int, int, int]] = []

    def load_model(self, context: ModelContext) -> BackendModel:
        return CountdownModel(self)


class OnceBackend(Backend):
    """Releases its first request with RESCHEDULE, then answers OUT = IN."""

    name = "once"

    def __init__(self) -> None:
        self.executed = 0

    def load_model(self, context: ModelContext) -> BackendModel:
        backend = self

        class Instance(BackendInstance):
            def execute(self, requests: list[InferenceRequest]) -> list[Result]:
                results: list[Result] = []
                for request in requests:
                    backend.executed += 1
                    tensor = request.inputs[0]
                    response = InferenceResponse(
                        request.model_name,
                        "1",
                        request.id,
                        [Tensor("OUT", "INT32", tensor.shape, tensor.data)],
                    )
                    results.append(RESCHEDULE if backend.executed == 1 else response)
                return results

        class Model(BackendModel):
            def create_instance(self, context: InstanceContext) -> BackendInstance:
                return Instance()

        return Model()


@pytest.fixture
async def system() -> AsyncIterator[ActorSystem]:
    async with ActorSystem() as actors:
        yield actors


async def serve(system: ActorSystem, backend: Backend, text: str) -> Router:
    config = fill_defaults(parse_pbtxt(text), gpus=0)
    ctx = ModelContext(config.name, 1, config, Path("."), Path("1"), Path("1/model"))
    actor = ModelVersionActor(backend, ctx)
    await system.spawn(actor)
    assert actor.scheduler is not None
    router = Router()
    router.known.add(config.name)
    signature = ModelSignature.from_config(config)
    router.add(ModelHandle(config.name, 1, config, signature, actor.scheduler))
    return router


def request(
    value: int, request_id: str, batching: bool = False, model: str = "iter", **parameters: Any
) -> InferenceRequest:
    shape = (1, 1) if batching else (1,)
    return InferenceRequest(
        model,
        id=request_id,
        inputs=[Tensor("IN", "INT32", shape, np.full(shape, value, dtype=np.int32))],
        outputs=[RequestedOutput("OUT")],
        parameters=dict(parameters),
    )


async def answer(reply: Reply[InferenceResponse]) -> int:
    with anyio.fail_after(WAIT):
        response = await reply.wait()
    return int(response.outputs[0].data.reshape(-1)[0])


# -- iterative sequences -----------------------------------------------------------------------


async def test_an_iterative_request_runs_again_next_in_its_slot_until_the_model_is_done(
    system: ActorSystem,
) -> None:
    backend = CountdownBackend()
    router = await serve(system, backend, ITERATIVE.format(max_batch_size=0, decoupled=""))
    # No correlation ID: an iterative sequence is one request, and gets an ID of its own.
    assert await answer(router.submit(request(3, "a"))) == 3
    # START on its first execution only (as Triton), END never: the request ends it.
    assert backend.rows == [("a", 1, 0, 1, 1), ("a", 0, 0, 1, 1), ("a", 0, 0, 1, 1)]
    assert await answer(router.submit(request(1, "b"))) == 1
    assert backend.rows[-1] == ("b", 1, 0, 2, 1)


async def test_requests_without_an_id_are_sequences_of_their_own_batched_together(
    system: ActorSystem,
) -> None:
    backend = CountdownBackend()
    router = await serve(system, backend, ITERATIVE.format(max_batch_size=2, decoupled=""))
    backend.gate.clear()
    a = router.submit(request(3, "a", batching=True))
    assert await anyio.to_thread.run_sync(backend.entered.wait, WAIT)  # [a] runs, held
    b = router.submit(request(2, "b", batching=True))  # the second slot
    c = router.submit(request(1, "c", batching=True))  # no slot free: waits for one
    backend.gate.set()
    assert [await answer(a), await answer(b), await answer(c)] == [3, 2, 1]
    assert [(r[0], r[3], r[4]) for r in backend.rows] == [
        ("a", 1, 1),
        ("a", 1, 2),  # a rescheduled, next in its slot, batched with b, new
        ("b", 2, 2),
        ("a", 1, 2),
        ("b", 2, 2),
        ("c", 3, 1),  # c had to wait for a slot: freed when a and b were answered
    ]
    assert [r[1] for r in backend.rows] == [1, 0, 1, 0, 0, 1]  # START: first run only


async def test_an_iterative_sequence_with_an_id_starts_and_ends_with_its_request(
    system: ActorSystem,
) -> None:
    backend = CountdownBackend()
    router = await serve(system, backend, ITERATIVE.format(max_batch_size=0, decoupled=""))
    assert await answer(router.submit(request(2, "a", sequence_id=7, sequence_start=True))) == 2
    assert {row[3] for row in backend.rows} == {7}
    # Answered, the sequence is over: as in Triton, the ID needs START again.
    with pytest.raises(TritonError) as caught:
        await answer(router.submit(request(1, "b", sequence_id=7)))
    assert caught.value.code is ErrorCode.INVALID_ARG
    assert "must specify the START flag" in caught.value.message
    assert len(backend.rows) == 2  # the refused request ran nowhere
    assert await answer(router.submit(request(1, "c", sequence_id=7, sequence_start=True))) == 1


async def test_a_bad_correlation_id_is_refused_by_an_iterative_model_too(
    system: ActorSystem,
) -> None:
    backend = CountdownBackend()
    router = await serve(system, backend, ITERATIVE.format(max_batch_size=0, decoupled=""))
    with pytest.raises(TritonError) as caught:
        await answer(router.submit(request(1, "a", sequence_id=-3, sequence_start=True)))
    assert caught.value.code is ErrorCode.INVALID_ARG
    assert backend.rows == []
    assert await answer(router.submit(request(1, "b"))) == 1


class Collected:
    def __init__(self) -> None:
        self.values: list[int] = []
        self.finals = 0
        self.done = anyio.Event()
        self.sender = ResponseSender(self.deliver)

    def deliver(
        self, response: InferenceResponse | None, error: TritonError | None, final: bool
    ) -> None:
        assert error is None
        if response is not None:
            self.values.append(int(response.outputs[0].data.reshape(-1)[0]))
        if final:
            self.finals += 1
            self.done.set()


async def test_a_decoupled_iterative_request_answers_from_each_of_its_executions(
    system: ActorSystem,
) -> None:
    backend = CountdownBackend()
    decoupled = "model_transaction_policy { decoupled: true }"
    router = await serve(system, backend, ITERATIVE.format(max_batch_size=0, decoupled=decoupled))
    collected = Collected()
    streamed = request(3, "a")
    streamed.sender = collected.sender
    router.submit(streamed)
    with anyio.fail_after(WAIT):
        await collected.done.wait()
    assert (collected.values, collected.finals) == ([1, 2, 3], 1)
    assert [row[1] for row in backend.rows] == [1, 0, 0]


# -- the batcher's messages --------------------------------------------------------------------


class FakeInstance(Actor[Execute]):
    """Stands for an instance actor: keeps the batches it is given."""

    def __init__(self) -> None:
        super().__init__("fake_0")
        self.batches: list[list[Infer]] = []
        self.arrived = anyio.Event()

    async def receive(self, message: Execute) -> None:
        self.batches.append(message.batch)
        self.arrived.set()
        self.arrived = anyio.Event()

    async def next_batch(self, seen: int) -> list[Infer]:
        with anyio.fail_after(WAIT):
            while len(self.batches) <= seen:
                await self.arrived.wait()
        return self.batches[seen]


def controls(item: Infer) -> tuple[int, int, int]:
    value = {t.name: int(t.data.reshape(-1)[0]) for t in item.request.inputs}
    return value["START"], value["END"], value["CORRID"]


async def batcher_with_instance(
    system: ActorSystem,
) -> tuple[ActorRef[Any], FakeInstance, ActorRef[Any]]:
    config = fill_defaults(parse_pbtxt(ITERATIVE.format(max_batch_size=0, decoupled="")), gpus=0)
    scheduler = await system.spawn(SequenceBatcher("iter", config))
    fake = FakeInstance()
    instance = await system.spawn(fake)
    await scheduler.tell(InstanceIdle(instance))
    return scheduler, fake, instance


async def test_the_batcher_runs_a_rescheduled_request_again_as_a_continuation(
    system: ActorSystem,
) -> None:
    scheduler, fake, instance = await batcher_with_instance(system)
    item = Infer(request(5, "a"), Reply())
    await scheduler.tell(item)
    (sent,) = await fake.next_batch(0)
    assert sent.request is item.request and controls(sent) == (1, 0, 1)
    await scheduler.tell(Rescheduled(sent))
    await scheduler.tell(InstanceIdle(instance))
    (again,) = await fake.next_batch(1)
    assert again.request is item.request and controls(again) == (0, 0, 1)
    assert len(again.request.inputs) == 4  # IN and the three controls, not doubled
    again.reply.set(InferenceResponse("iter", "1", "a"))
    await scheduler.tell(InstanceIdle(instance))
    # Its sequence ended with the answer: a new request gets a new ID, in the freed slot.
    await scheduler.tell(Infer(request(5, "b"), Reply()))
    (other,) = await fake.next_batch(2)
    assert controls(other) == (1, 0, 2)


async def test_a_cancelled_request_ends_its_iterative_sequence_once_the_running_one_is_over(
    system: ActorSystem,
) -> None:
    """Sequence 7's request a still runs (a decoupled model answers it after its execute
    returned) when its next request, queued, is cancelled: the sequence ends as Triton ends it,
    but its slot stays bound until a is over (another sequence got it, a then failed as lost)."""
    scheduler, fake, instance = await batcher_with_instance(system)
    a = Infer(request(5, "a", sequence_id=7, sequence_start=True), Reply())
    await scheduler.tell(a)
    (sent,) = await fake.next_batch(0)
    a2 = Infer(request(5, "a2", sequence_id=7), Reply())
    await scheduler.tell(a2)
    a2.request.cancel()
    b = Infer(request(5, "b", sequence_id=9, sequence_start=True), Reply())
    await scheduler.tell(b)
    await scheduler.tell(InstanceIdle(instance))  # a's execute returned; a is not answered
    with anyio.fail_after(WAIT), pytest.raises(TritonError) as caught:
        await a2.reply.wait()
    assert caught.value.code is ErrorCode.CANCELLED
    assert len(fake.batches) == 1  # b waits: the slot is still a's
    await scheduler.tell(Rescheduled(sent))  # the model hands a back to run again
    with anyio.fail_after(WAIT), pytest.raises(TritonError) as caught:
        await a.reply.wait()
    assert caught.value.code is ErrorCode.CANCELLED  # (not "lost: its instance stopped")
    await scheduler.tell(InstanceIdle(instance))
    (other,) = await fake.next_batch(1)  # the slot is free: b runs
    assert other.request is b.request and controls(other) == (1, 0, 9)


async def test_a_rescheduled_request_whose_instance_stopped_fails_unavailable(
    system: ActorSystem,
) -> None:
    scheduler, fake, instance = await batcher_with_instance(system)
    item = Infer(request(5, "a"), Reply())
    await scheduler.tell(item)
    (sent,) = await fake.next_batch(0)
    await scheduler.tell(InstanceGone(instance))
    await scheduler.tell(Rescheduled(sent))
    with anyio.fail_after(WAIT), pytest.raises(TritonError) as caught:
        await item.reply.wait()
    assert caught.value.code is ErrorCode.UNAVAILABLE


async def test_a_rescheduled_request_the_batcher_did_not_send_fails_internal(
    system: ActorSystem,
) -> None:
    scheduler, _, _ = await batcher_with_instance(system)
    stranger = Infer(request(5, "x"), Reply())
    await scheduler.tell(Rescheduled(stranger))
    with anyio.fail_after(WAIT), pytest.raises(TritonError) as caught:
        await stranger.reply.wait()
    assert caught.value.code is ErrorCode.INTERNAL


# -- other schedulers --------------------------------------------------------------------------

PLAIN = """
name: "plain" max_batch_size: {max_batch_size}
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
{scheduling}
"""


@pytest.mark.parametrize(
    ("max_batch_size", "scheduling", "parameters"),
    [
        (0, "", {}),
        (4, "dynamic_batching { }", {}),
        (0, "sequence_batching { }", {"sequence_id": 3, "sequence_start": True}),
    ],
    ids=["default", "dynamic", "sequence"],
)
async def test_a_model_without_iterative_sequences_fails_a_rescheduled_request(
    system: ActorSystem, max_batch_size: int, scheduling: str, parameters: dict[str, Any]
) -> None:
    backend = OnceBackend()
    text = PLAIN.format(max_batch_size=max_batch_size, scheduling=scheduling)
    router = await serve(system, backend, text)
    batching = max_batch_size > 0
    first = request(1, "a", batching, model="plain", **parameters)
    with pytest.raises(TritonError) as caught:
        await answer(router.submit(first))
    assert caught.value.code is ErrorCode.INTERNAL
    assert caught.value.message.startswith(REFUSED)
    assert "not configured to handle such a flag" in caught.value.message
    # Nothing else changed: the next request is served.
    second = request(2, "b", batching, model="plain", **parameters)
    assert await answer(router.submit(second)) == 2
    assert backend.executed == 2
