"""The sequence batcher in-process: router -> SequenceBatcher -> instance actors, with a test
backend whose instances keep a running sum per correlation ID (in Python, per instance, as a
stateful model would) and record the control tensors each request carried."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

from tritonactor.actors import ActorSystem, Reply
from tritonactor.backends.base import (
    Backend,
    BackendInstance,
    BackendModel,
    InstanceContext,
    InstanceDied,
    ModelContext,
    Result,
)
from tritonactor.config.model_config import parse_pbtxt
from tritonactor.config.normalize import fill_defaults
from tritonactor.core.errors import ErrorCode, TritonError
from tritonactor.core.types import InferenceRequest, InferenceResponse, RequestedOutput, Tensor
from tritonactor.scheduling.factory import scheduler_for
from tritonactor.scheduling.model import ModelVersionActor
from tritonactor.scheduling.router import ModelHandle, Router
from tritonactor.scheduling.sequence import SequenceBatcher
from tritonactor.scheduling.signature import ModelSignature

pytestmark = pytest.mark.anyio

# The bound on a wait for an event (a request answered, the batcher holding one): never a
# measure of speed, so generous enough that a busy machine never reaches it.
WAIT = 30

CONTROLS = """
    control_input [
      { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
      { name: "END" control [ { kind: CONTROL_SEQUENCE_END fp32_false_true: [ 0.5, 2.5 ] } ] },
      { name: "READY"
        control [ { kind: CONTROL_SEQUENCE_READY bool_false_true: [ false, true ] } ] },
      { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: {corrid} } ] }
    ]
"""

CONFIG = """
name: "acc"
max_batch_size: {max_batch_size}
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ count: {count} kind: KIND_CPU }} ]
sequence_batching {{
  {strategy}
  {idle}
  {controls}
}}
"""


class AccumulatingInstance(BackendInstance):
    def __init__(self, backend: AccumulatingBackend, name: str) -> None:
        self.backend = backend
        self.name = name
        self.sums: dict[Any, int] = {}

    def execute(self, requests: list[InferenceRequest]) -> list[Result]:
        backend = self.backend
        with backend.lock:
            backend.entered += 1
        if not backend.gate.wait(timeout=10):
            raise RuntimeError("the test never released the instance")
        results: list[Result] = []
        batch = []
        for request in requests:
            tensors = {tensor.name: tensor for tensor in request.inputs}
            entry = {
                "id": request.id,
                "instance": self.name,
                **{
                    name: (t.datatype, t.shape, t.data.reshape(-1)[0])
                    for name, t in tensors.items()
                    if name != "IN"
                },
            }
            batch.append(entry)
            shape = tensors["IN"].shape
            if not tensors["READY"].data.reshape(-1)[0]:
                # A null request (an empty slot of a direct batch): the model must not touch
                # any sequence; its answer goes nowhere.
                data = np.full(shape, -1, dtype=np.int32)
            else:
                corrid = tensors["CORRID"].data.reshape(-1)[0]
                if tensors["START"].data.reshape(-1)[0] == 1:
                    self.sums[corrid] = 0
                self.sums[corrid] += int(tensors["IN"].data.reshape(-1)[0])
                data = np.full(shape, self.sums[corrid], dtype=np.int32)
            results.append(
                InferenceResponse(
                    "acc", "1", request.id, [Tensor("OUT", "INT32", data.shape, data)]
                )
            )
        with backend.lock:
            backend.batches.append(batch)
            backend.seen.extend(batch)
        return results


class AccumulatingModel(BackendModel):
    def __init__(self, backend: AccumulatingBackend) -> None:
        self.backend = backend

    def create_instance(self, context: InstanceContext) -> BackendInstance:
        return AccumulatingInstance(self.backend, context.name)


class AccumulatingBackend(Backend):
    name = "accumulating"

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.lock = threading.Lock()
        self.seen: list[dict[str, Any]] = []  # every request executed, null ones included
        self.batches: list[list[dict[str, Any]]] = []
        self.entered = 0  # executes begun (some may wait at the gate)

    def load_model(self, context: ModelContext) -> BackendModel:
        return AccumulatingModel(self)


def config_text(
    max_batch_size: int = 0,
    count: int = 1,
    corrid: str = "TYPE_UINT64",
    idle: str = "",
    strategy: str = "direct { }",
    extra: str = "",
) -> str:
    return CONFIG.format(
        max_batch_size=max_batch_size,
        count=count,
        strategy=strategy,
        idle=idle,
        controls=CONTROLS.replace("{corrid}", corrid) + extra,
    )


def request(
    value: int, request_id: str, max_batch_size: int = 0, **parameters: Any
) -> InferenceRequest:
    shape = (1, 1) if max_batch_size else (1,)
    data = np.full(shape, value, dtype=np.int32)
    return InferenceRequest(
        "acc",
        id=request_id,
        inputs=[Tensor("IN", "INT32", shape, data)],
        outputs=[RequestedOutput("OUT")],
        parameters=dict(parameters),
    )


def seq(
    value: int,
    request_id: str,
    corrid: Any,
    start: bool = False,
    end: bool = False,
    max_batch_size: int = 0,
) -> InferenceRequest:
    return request(
        value,
        request_id,
        max_batch_size,
        sequence_id=corrid,
        sequence_start=start,
        sequence_end=end,
    )


@pytest.fixture
async def system() -> AsyncIterator[ActorSystem]:
    async with ActorSystem() as actors:
        yield actors


async def serve(
    system: ActorSystem, backend: AccumulatingBackend, text: str
) -> tuple[Router, ModelVersionActor]:
    config = fill_defaults(parse_pbtxt(text), gpus=0)
    ctx = ModelContext("acc", 1, config, Path("."), Path("1"), Path("1/model"))
    actor = ModelVersionActor(backend, ctx)
    await system.spawn(actor)
    assert actor.scheduler is not None
    router = Router()
    router.known.add("acc")
    router.add(ModelHandle("acc", 1, config, ModelSignature.from_config(config), actor.scheduler))
    return router, actor


def batcher(actor: ModelVersionActor) -> SequenceBatcher:
    assert actor.scheduler is not None
    scheduler = actor.scheduler._actor  # the batcher itself, only to read its state
    assert isinstance(scheduler, SequenceBatcher)
    return scheduler


async def until(condition: Any) -> None:
    with anyio.fail_after(WAIT):
        while not condition():
            await anyio.sleep(0.005)


def total(response: InferenceResponse) -> int:
    return int(response.outputs[0].data.reshape(-1)[0])


async def answers(replies: list[Reply[InferenceResponse]]) -> list[InferenceResponse]:
    with anyio.fail_after(10):
        return [await reply.wait() for reply in replies]


async def failure(reply: Reply[InferenceResponse]) -> TritonError:
    with anyio.fail_after(10), pytest.raises(TritonError) as caught:
        await reply.wait()
    return caught.value


async def test_the_factory_picks_the_sequence_batcher_for_sequence_batching() -> None:
    # (sequence_batching and dynamic_batching are one oneof: a config has at most one.)
    text = config_text(max_batch_size=4)
    assert isinstance(scheduler_for(parse_pbtxt(text)), SequenceBatcher)
    plain = text.split("sequence_batching")[0] + "dynamic_batching { }"
    assert not isinstance(scheduler_for(parse_pbtxt(plain)), SequenceBatcher)


async def test_a_sequence_request_must_have_batch_size_one(system: ActorSystem) -> None:
    backend = AccumulatingBackend()
    router, _ = await serve(system, backend, config_text(max_batch_size=4))
    data = np.ones((2, 1), dtype=np.int32)
    two = InferenceRequest(
        "acc",
        inputs=[Tensor("IN", "INT32", (2, 1), data)],
        parameters={"sequence_id": 1, "sequence_start": True},
    )
    error = await failure(router.submit(two))
    assert error.code == ErrorCode.INVALID_ARG
    assert "must specify batch-size 1 due to requirements of sequence batcher" in str(error)


INTERLEAVED = [
    (1, "a0", 11, True, False),
    (100, "b0", 22, True, False),
    (2, "a1", 11, False, False),
    (200, "b1", 22, False, False),
    (3, "a2", 11, False, True),
    (300, "b2", 22, False, True),
]


@pytest.mark.parametrize("strategy", ["direct { }", ""])
async def test_with_one_slot_a_second_sequence_waits_for_the_first_to_end(
    system: ActorSystem, strategy: str
) -> None:
    # max_batch_size 0 and one instance: one slot (no strategy means direct, as in Triton).
    backend = AccumulatingBackend()
    router, actor = await serve(system, backend, config_text(strategy=strategy))
    backend.gate.clear()
    replies = [router.submit(seq(v, rid, c, s, e)) for v, rid, c, s, e in INTERLEAVED]
    await until(lambda: backend.entered == 1)
    assert batcher(actor).backlog == 1  # sequence 22 waits for a slot
    backend.gate.set()
    responses = await answers(replies)
    assert [total(r) for r in responses] == [1, 100, 3, 300, 6, 600]
    assert [entry["id"] for entry in backend.seen] == ["a0", "a1", "a2", "b0", "b1", "b2"]


async def test_oldest_with_two_candidates_interleaves_two_sequences(system: ActorSystem) -> None:
    backend = AccumulatingBackend()
    strategy = "oldest { max_candidate_sequences: 2 }"
    router, _ = await serve(system, backend, config_text(strategy=strategy))
    replies = [router.submit(seq(v, rid, c, s, e)) for v, rid, c, s, e in INTERLEAVED]
    responses = await answers(replies)
    assert [total(r) for r in responses] == [1, 100, 3, 300, 6, 600]
    # max_batch_size 0: one request per execute, in arrival order.
    assert [entry["id"] for entry in backend.seen] == [p[1] for p in INTERLEAVED]
    assert all(len(batch) == 1 for batch in backend.batches)


async def test_control_values_and_datatypes_are_those_configured(system: ActorSystem) -> None:
    backend = AccumulatingBackend()
    router, _ = await serve(system, backend, config_text())
    replies = [
        router.submit(seq(1, "first", 7, start=True)),
        router.submit(seq(1, "middle", 7)),
        router.submit(seq(1, "last", 7, end=True)),
    ]
    await answers(replies)
    first, middle, last = backend.seen
    assert first["START"] == ("INT32", (1,), 1)
    assert middle["START"][2] == 0 and last["START"][2] == 0
    assert first["END"] == ("FP32", (1,), 0.5) and last["END"] == ("FP32", (1,), 2.5)
    assert all(entry["READY"] == ("BOOL", (1,), True) for entry in backend.seen)
    assert all(entry["CORRID"] == ("UINT64", (1,), 7) for entry in backend.seen)
    assert first["START"][2].dtype == np.int32 and first["CORRID"][2].dtype == np.uint64


async def test_controls_have_the_batch_dimension_and_a_string_corrid(system: ActorSystem) -> None:
    backend = AccumulatingBackend()
    router, _ = await serve(system, backend, config_text(max_batch_size=4, corrid="TYPE_STRING"))
    replies = [
        router.submit(request(5, "s0", 4, sequence_id="abc", sequence_start=True)),
        router.submit(request(6, "s1", 4, sequence_id="abc", sequence_end=True)),
    ]
    assert [total(r) for r in await answers(replies)] == [5, 11]
    assert backend.seen[0]["CORRID"] == ("BYTES", (1, 1), b"abc")
    assert backend.seen[0]["START"] == ("INT32", (1, 1), 1)


async def test_sequences_stay_on_their_instance(system: ActorSystem) -> None:
    backend = AccumulatingBackend()
    router, _ = await serve(system, backend, config_text(count=2))
    replies = []
    for step in range(4):
        for corrid in (1, 2, 3, 4):
            replies.append(
                router.submit(
                    seq(corrid, f"{corrid}-{step}", corrid, start=step == 0, end=step == 3)
                )
            )
    responses = await answers(replies)
    assert [total(r) for r in responses[-4:]] == [4, 8, 12, 16]
    where: dict[int, set[str]] = {}
    for entry in backend.seen:
        where.setdefault(int(entry["CORRID"][2]), set()).add(entry["instance"])
    assert all(len(instances) == 1 for instances in where.values())
    assert len(set().union(*where.values())) == 2  # both instances served sequences


async def test_a_request_without_correlation_id_fails(system: ActorSystem) -> None:
    backend = AccumulatingBackend()
    router, _ = await serve(system, backend, config_text())
    for reply in (router.submit(request(1, "x")), router.submit(seq(1, "y", 0, start=True))):
        error = await failure(reply)
        assert error.code == ErrorCode.INVALID_ARG
        assert (
            "inference request to model 'acc' must specify a non-zero or non-empty "
            "correlation ID" in str(error)
        )
    assert backend.seen == []


async def test_a_sequence_must_start_and_an_ended_one_is_gone(system: ActorSystem) -> None:
    backend = AccumulatingBackend()
    router, _ = await serve(system, backend, config_text())
    error = await failure(router.submit(seq(1, "orphan", 9)))
    assert error.code == ErrorCode.INVALID_ARG
    assert "sequence 9 to model 'acc' must specify the START flag" in str(error)
    await answers([router.submit(seq(1, "only", 9, start=True, end=True))])
    error = await failure(router.submit(seq(1, "after", 9)))
    assert "must specify the START flag" in str(error)
    assert [entry["id"] for entry in backend.seen] == ["only"]


async def test_a_second_start_restarts_the_sequence(system: ActorSystem) -> None:
    backend = AccumulatingBackend()
    router, _ = await serve(system, backend, config_text())
    replies = [
        router.submit(seq(5, "a", 3, start=True)),
        router.submit(seq(5, "b", 3)),
        router.submit(seq(1, "again", 3, start=True)),
        router.submit(seq(1, "c", 3, end=True)),
    ]
    assert [total(r) for r in await answers(replies)] == [5, 10, 1, 2]


async def test_an_idle_sequence_is_released(system: ActorSystem) -> None:
    backend = AccumulatingBackend()
    router, actor = await serve(
        system, backend, config_text(idle="max_sequence_idle_microseconds: 50000")
    )
    await answers([router.submit(seq(1, "a", 4, start=True))])
    await until(lambda: batcher(actor).active_sequences == 0)  # released by the batcher's timer
    error = await failure(router.submit(seq(1, "b", 4)))
    assert error.code == ErrorCode.INVALID_ARG
    assert "must specify the START flag" in str(error)


async def test_a_busy_sequence_is_not_released_early(system: ActorSystem) -> None:
    backend = AccumulatingBackend()
    router, actor = await serve(
        system, backend, config_text(idle="max_sequence_idle_microseconds: 60000000")
    )
    await answers([router.submit(seq(1, "a", 4, start=True))])
    # Another sequence makes the batcher look for idle sequences while 'a' has been idle for
    # less than its minute: it keeps 'a' in the one slot, and the other sequence waits for it.
    other = router.submit(seq(7, "other", 5, start=True, end=True))
    await until(lambda: batcher(actor).backlog == 1)
    assert [total(r) for r in await answers([router.submit(seq(1, "b", 4, end=True))])] == [2]
    assert [total(r) for r in await answers([other])] == [7]


async def test_the_timer_releases_without_new_requests(system: ActorSystem) -> None:
    backend = AccumulatingBackend()
    router, actor = await serve(
        system, backend, config_text(idle="max_sequence_idle_microseconds: 50000")
    )
    await answers([router.submit(seq(1, "a", 4, start=True))])
    assert actor.scheduler is not None
    scheduler = actor.scheduler._actor  # the batcher itself, only to read its state
    assert isinstance(scheduler, SequenceBatcher)
    assert scheduler.active_sequences == 1
    await until(lambda: scheduler.active_sequences == 0)


# -- direct: slots, null requests, backlog ------------------------------------------------------


async def test_direct_batches_one_request_per_slot_with_null_rows(system: ActorSystem) -> None:
    backend = AccumulatingBackend()
    router, actor = await serve(system, backend, config_text(max_batch_size=4))
    backend.gate.clear()
    replies = [router.submit(seq(1, "s1-0", 1, start=True, max_batch_size=4))]
    await until(lambda: backend.entered == 1)  # sequence 1 runs alone in slot 0, held there
    for corrid in (2, 3, 4):
        replies.append(router.submit(seq(corrid, f"s{corrid}-0", corrid, True, max_batch_size=4)))
    fifth = router.submit(seq(5, "s5-0", 5, start=True, max_batch_size=4))
    await until(lambda: batcher(actor).queue_depth == 4)
    assert batcher(actor).backlog == 1  # four slots, all taken: sequence 5 waits
    backend.gate.set()
    assert [total(r) for r in await answers(replies)] == [1, 2, 3, 4]
    first, second = backend.batches[:2]
    assert [entry["id"] for entry in first] == ["s1-0"]
    # Slot 0 has no request ready: a null row keeps sequences 2-4 in their slots 1-3.
    assert [entry["id"] for entry in second] == ["", "s2-0", "s3-0", "s4-0"]
    assert [bool(entry["READY"][2]) for entry in second] == [False, True, True, True]
    assert [int(entry["START"][2]) for entry in second] == [0, 1, 1, 1]
    assert second[0]["CORRID"] == ("UINT64", (1, 1), 0)
    assert not fifth.done  # its sequence still has no slot
    # Sequence 3 ends: its slot goes to sequence 5, whose request then runs in slot 2.
    await answers([router.submit(seq(10, "s3-end", 3, end=True, max_batch_size=4))])
    assert total((await answers([fifth]))[0]) == 5
    last = backend.batches[-1]
    assert [entry["id"] for entry in last] == ["", "", "s5-0"]
    more = [router.submit(seq(1, f"s{c}-1", c, max_batch_size=4)) for c in (1, 2, 4, 5)]
    assert [total(r) for r in await answers(more)] == [2, 3, 5, 6]
    assert all(len(batch) <= 4 for batch in backend.batches)
    assert all(entry["READY"][2] or entry["id"] == "" for entry in backend.seen)


async def test_direct_waits_for_minimum_slot_utilization(system: ActorSystem) -> None:
    backend = AccumulatingBackend()
    strategy = "direct { max_queue_delay_microseconds: 60000000 minimum_slot_utilization: 0.5 }"
    router, actor = await serve(system, backend, config_text(max_batch_size=4, strategy=strategy))
    one = router.submit(seq(1, "a", 1, start=True, max_batch_size=4))
    # Queued while the instance is idle: 1 of 4 slots ready is below the minimum, and the
    # batcher, which decides as a request arrives, chose to wait (within the delay).
    await until(lambda: batcher(actor).idle_instances == 1 and batcher(actor).queue_depth == 1)
    assert backend.entered == 0
    two = router.submit(seq(2, "b", 2, start=True, max_batch_size=4))
    assert [total(r) for r in await answers([one, two])] == [1, 2]
    assert [[entry["id"] for entry in batch] for batch in backend.batches] == [["a", "b"]]


async def test_direct_sends_a_thin_batch_once_the_delay_runs_out(system: ActorSystem) -> None:
    backend = AccumulatingBackend()
    strategy = "direct { max_queue_delay_microseconds: 200000 minimum_slot_utilization: 0.75 }"
    router, actor = await serve(system, backend, config_text(max_batch_size=4, strategy=strategy))
    await until(lambda: batcher(actor).idle_instances == 1)  # the delay starts as "a" arrives
    started = anyio.current_time()
    one = router.submit(seq(7, "a", 1, True, max_batch_size=4))
    # 1 of 4 slots ready is below the minimum: the batcher holds "a" for the delay. (The poll
    # began before "a" arrived, so its timer comes before the delay's however slow the loop.)
    await until(lambda: batcher(actor).idle_instances == 1 and batcher(actor).queue_depth == 1)
    assert backend.entered == 0
    # Nothing else comes: once the delay runs out, "a" goes alone, in a batch of one slot.
    assert total((await answers([one]))[0]) == 7
    assert [[entry["id"] for entry in batch] for batch in backend.batches] == [["a"]]
    assert anyio.current_time() - started >= 0.19  # a lower bound the server enforces


# -- oldest --------------------------------------------------------------------------------------


async def test_oldest_batches_one_request_per_sequence_oldest_first(system: ActorSystem) -> None:
    backend = AccumulatingBackend()
    strategy = "oldest { max_candidate_sequences: 4 }"
    router, actor = await serve(system, backend, config_text(max_batch_size=4, strategy=strategy))
    backend.gate.clear()
    replies = [router.submit(seq(1, "a0", 1, start=True, max_batch_size=4))]
    await until(lambda: backend.entered == 1)
    plan = [
        (2, "a1", 1, False),
        (3, "a2", 1, False),
        (10, "b0", 2, True),
        (20, "b1", 2, False),
        (100, "c0", 3, True),
    ]
    for value, rid, corrid, start in plan:
        replies.append(router.submit(seq(value, rid, corrid, start, max_batch_size=4)))
    await until(lambda: batcher(actor).queue_depth == len(plan))  # all queued behind a0
    backend.gate.set()
    assert [total(r) for r in await answers(replies)] == [1, 3, 6, 10, 30, 100]
    # Compact batches (no null rows), at most one request of a sequence in each, oldest first.
    assert [[entry["id"] for entry in batch] for batch in backend.batches] == [
        ["a0"],
        ["a1", "b0", "c0"],
        ["a2", "b1"],
    ]


async def test_oldest_waits_for_a_preferred_batch_up_to_the_delay(system: ActorSystem) -> None:
    backend = AccumulatingBackend()
    strategy = (
        "oldest { max_candidate_sequences: 4 preferred_batch_size: [ 2 ] "
        "max_queue_delay_microseconds: 60000000 }"
    )
    router, actor = await serve(system, backend, config_text(max_batch_size=4, strategy=strategy))
    one = router.submit(seq(1, "a", 1, start=True, max_batch_size=4))
    # Queued while the instance is idle: the batcher chose to wait for a batch of 2.
    await until(lambda: batcher(actor).idle_instances == 1 and batcher(actor).queue_depth == 1)
    assert backend.entered == 0
    two = router.submit(seq(2, "b", 2, start=True, max_batch_size=4))
    assert [total(r) for r in await answers([one, two])] == [1, 2]
    assert [[entry["id"] for entry in batch] for batch in backend.batches] == [["a", "b"]]


@pytest.mark.parametrize(
    ("delay", "expected"),
    [
        # While the delay runs, the largest preferred size reached goes at once (2, then 1).
        (60000000, [["a0"], ["b0", "c0"], ["d0"]]),
        # Past it, what waits goes up to max_batch_size, beyond the largest preferred size.
        (1, [["a0"], ["b0", "c0", "d0"]]),
    ],
    ids=["delay-running", "delay-over"],
)
async def test_oldest_cuts_batches_by_the_dynamic_batchers_rules(
    system: ActorSystem, delay: int, expected: list[list[str]]
) -> None:
    backend = AccumulatingBackend()
    strategy = (
        "oldest { max_candidate_sequences: 4 preferred_batch_size: [ 1, 2 ] "
        f"max_queue_delay_microseconds: {delay} }}"
    )
    router, actor = await serve(system, backend, config_text(max_batch_size=4, strategy=strategy))
    backend.gate.clear()
    replies = [router.submit(seq(1, "a0", 1, start=True, max_batch_size=4))]
    await until(lambda: backend.entered == 1)
    for corrid, rid in ((2, "b0"), (3, "c0"), (4, "d0")):
        replies.append(router.submit(seq(corrid, rid, corrid, start=True, max_batch_size=4)))
    await until(lambda: batcher(actor).queue_depth == 3)  # all queued behind a0
    backend.gate.set()
    await answers(replies)
    assert [[entry["id"] for entry in batch] for batch in backend.batches] == expected


async def test_oldest_holds_at_most_max_candidate_sequences(system: ActorSystem) -> None:
    backend = AccumulatingBackend()
    strategy = "oldest { max_candidate_sequences: 2 }"
    router, actor = await serve(system, backend, config_text(max_batch_size=4, strategy=strategy))
    replies = [router.submit(seq(c, f"{c}", c, start=True, max_batch_size=4)) for c in (1, 2, 3)]
    done = await answers(replies[:2])
    assert [total(r) for r in done] == [1, 2]
    assert batcher(actor).backlog == 1 and not replies[2].done
    await answers([router.submit(seq(0, "end", 1, end=True, max_batch_size=4))])
    assert total((await answers(replies[2:]))[0]) == 3


# -- failures --------------------------------------------------------------------------------------


async def test_a_cancelled_request_ends_its_sequence(system: ActorSystem) -> None:
    """As Triton 2.51 (its "force-end cancelled sequence", checked against it by a review): a
    request cancelled while it waits fails CANCELLED, and so do the requests of its sequence
    queued behind it; the sequence is over, its next request must START again."""
    backend = AccumulatingBackend()
    router, _ = await serve(system, backend, config_text())
    backend.gate.clear()
    first = router.submit(seq(1, "a0", 1, start=True))
    await until(lambda: backend.entered == 1)
    dropped = seq(50, "a1", 1)
    second = router.submit(dropped)
    third = router.submit(seq(2, "a2", 1))
    dropped.cancel()
    backend.gate.set()
    assert (await failure(second)).code == ErrorCode.CANCELLED
    assert (await failure(third)).code == ErrorCode.CANCELLED
    assert [total(r) for r in await answers([first])] == [1]
    error = await failure(router.submit(seq(3, "a3", 1)))
    assert error.code == ErrorCode.INVALID_ARG and "must specify the START flag" in error.message
    # a START begins it again
    assert [total(r) for r in await answers([router.submit(seq(4, "b0", 1, start=True))])] == [4]


class DyingInstance(AccumulatingInstance):
    def execute(self, requests: list[InferenceRequest]) -> list[Result]:
        if any(int(r.inputs[0].data.reshape(-1)[0]) < 0 for r in requests):
            raise InstanceDied("the instance died")
        return super().execute(requests)


class DyingBackend(AccumulatingBackend):
    def load_model(self, context: ModelContext) -> BackendModel:
        backend = self

        class Model(BackendModel):
            def create_instance(self, context: InstanceContext) -> BackendInstance:
                return DyingInstance(backend, context.name)

        return Model()


async def test_the_sequences_of_a_lost_instance_must_start_again(system: ActorSystem) -> None:
    backend = DyingBackend()
    router, _ = await serve(system, backend, config_text())
    assert total((await answers([router.submit(seq(1, "a0", 1, start=True))]))[0]) == 1
    dying = router.submit(seq(-1, "a1", 1))
    queued = router.submit(seq(2, "a2", 1))
    assert (await failure(dying)).code == ErrorCode.UNAVAILABLE
    error = await failure(queued)
    assert error.code == ErrorCode.UNAVAILABLE
    assert "sequence 1 of model 'acc' was lost" in str(error)
    error = await failure(router.submit(seq(3, "a3", 1)))
    assert "must specify the START flag" in str(error)
    # The replacement instance serves new sequences.
    assert total((await answers([router.submit(seq(4, "b0", 1, start=True))]))[0]) == 4


async def test_an_idle_batcher_takes_a_request_on_the_senders_turn(system: ActorSystem) -> None:
    """The batcher's handling never waits (`handles_now`): a request that finds it idle is
    slotted and handed to the idle instance where it was submitted, with no turn of the
    batcher's loop; one submitted while the instance is busy waits for it, in order."""
    backend = AccumulatingBackend()
    router, actor = await serve(system, backend, config_text())
    await anyio.wait_all_tasks_blocked()
    state = batcher(actor)
    replies = [router.submit(seq(1, "a0", 5, start=True))]
    # no await since: already in the instance's mailbox, the batcher's own is empty
    assert state.idle_instances == 0 and actor.scheduler is not None
    assert actor.scheduler.mailbox_depth == 0
    replies.append(router.submit(seq(2, "a1", 5, end=True)))
    # taken at once too, and kept: its sequence's instance is busy
    assert actor.scheduler.mailbox_depth == 0 and state.queue_depth == 1
    assert [total(r) for r in await answers(replies)] == [1, 3]
