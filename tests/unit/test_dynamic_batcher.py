"""The dynamic batcher in-process: router -> DynamicBatcher -> instance actors, with a test
backend that merges each batch with `backends.batching` and records what it executed.

The instance is held busy with a threading.Event where a test needs a backlog, so that what is
asserted is the order and shape of batches, not how long anything took."""

from __future__ import annotations

import math
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import anyio
import numpy as np
import pytest

from tests.onnx_models import string_identity_model
from tritonactor.actors import ActorSystem, Reply
from tritonactor.backends import batching
from tritonactor.backends.base import (
    Backend,
    BackendInstance,
    BackendModel,
    InstanceContext,
    ModelContext,
    Result,
)
from tritonactor.backends.onnxruntime import OnnxRuntimeBackend, OnnxRuntimeInstance
from tritonactor.config.model_config import parse_pbtxt
from tritonactor.config.normalize import fill_defaults
from tritonactor.core.errors import ErrorCode, TritonError
from tritonactor.core.types import InferenceRequest, InferenceResponse, RequestedOutput, Tensor
from tritonactor.scheduling.dynamic import DynamicBatcher
from tritonactor.scheduling.factory import scheduler_for
from tritonactor.scheduling.model import ModelVersionActor
from tritonactor.scheduling.router import ModelHandle, Router
from tritonactor.scheduling.signature import ModelSignature

pytestmark = pytest.mark.anyio

# The bound on a wait for an event (a request answered, the batcher holding one): never a
# measure of speed, so generous enough that a busy machine never reaches it.
WAIT = 30

CONFIG = """
name: "batched"
max_batch_size: {max_batch_size}
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ -1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] }} ]
instance_group [ {{ count: {count} kind: KIND_CPU }} ]
dynamic_batching {{ {batching} }}
"""


class RecordingInstance(BackendInstance):
    def __init__(self, backend: RecordingBackend) -> None:
        self.backend = backend

    def execute(self, requests: list[InferenceRequest]) -> list[Result]:
        backend = self.backend
        backend.entered.set()
        if not backend.gate.wait(timeout=10):
            raise RuntimeError("the test never released the instance")
        with backend.lock:
            backend.batches.append([request.id for request in requests])
            backend.sizes.append(sum(batching.batch_size(r) for r in requests))
            backend.shapes.append({r.inputs[0].shape[1:] for r in requests})
        results: list[Result] = [None] * len(requests)
        for group in batching.groups(requests):
            members = [requests[index] for index in group]
            merged, sizes = batching.merge(members)
            data = merged.inputs[0].data * 2
            response = InferenceResponse(
                merged.model_name, "1", "", [Tensor("OUT", "INT32", data.shape, data)]
            )
            for index, answer in zip(group, batching.split(response, sizes, members), strict=True):
                results[index] = answer
        return results


class RecordingModel(BackendModel):
    def __init__(self, backend: RecordingBackend) -> None:
        self.backend = backend

    def create_instance(self, context: InstanceContext) -> BackendInstance:
        return RecordingInstance(self.backend)


class RecordingBackend(Backend):
    name = "recording"

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.lock = threading.Lock()
        self.batches: list[list[str]] = []
        self.sizes: list[int] = []
        self.shapes: list[set[tuple[int, ...]]] = []

    def load_model(self, context: ModelContext) -> BackendModel:
        return RecordingModel(self)

    def hold(self) -> None:
        self.gate.clear()
        self.entered.clear()

    @property
    def executed(self) -> list[str]:
        return [request_id for batch in self.batches for request_id in batch]


def request(
    value: int, request_id: str = "", width: int = 2, rows: int = 1, **parameters: int
) -> InferenceRequest:
    data = np.arange(rows * width, dtype=np.int32).reshape(rows, width) + value
    return InferenceRequest(
        "batched",
        id=request_id or str(value),
        inputs=[Tensor("IN", "INT32", data.shape, data)],
        outputs=[RequestedOutput("OUT")],
        parameters=dict(parameters),
    )


@pytest.fixture
async def system() -> AsyncIterator[ActorSystem]:
    async with ActorSystem() as actors:
        yield actors


async def serve(
    system: ActorSystem,
    backend: RecordingBackend,
    batching_config: str,
    max_batch_size: int = 4,
    count: int = 1,
) -> tuple[Router, ModelVersionActor]:
    text = CONFIG.format(max_batch_size=max_batch_size, count=count, batching=batching_config)
    if not max_batch_size:  # no batch dimension: the requests' two dims are the model's
        text = text.replace("dims: [ -1 ]", "dims: [ -1, -1 ]")
    config = fill_defaults(parse_pbtxt(text), gpus=0)
    ctx = ModelContext("batched", 1, config, Path("."), Path("1"), Path("1/model"))
    actor = ModelVersionActor(backend, ctx)
    await system.spawn(actor)
    assert actor.scheduler is not None
    router = Router()
    router.known.add("batched")
    signature = ModelSignature.from_config(config)
    router.add(ModelHandle("batched", 1, config, signature, actor.scheduler))
    return router, actor


async def occupy(router: Router, backend: RecordingBackend) -> Reply[InferenceResponse]:
    """Send a request that holds the single instance inside execute until `gate` is set."""
    backend.hold()
    blocker = router.submit(request(1000, "blocker"))
    assert await anyio.to_thread.run_sync(backend.entered.wait, WAIT)
    return blocker


def batcher_of(actor: ModelVersionActor) -> DynamicBatcher:
    batcher = next(child for child in actor.children if child is actor.scheduler)._actor
    assert isinstance(batcher, DynamicBatcher)  # the batcher itself, only to read its state
    return batcher


async def until(condition: Callable[[], bool]) -> None:
    with anyio.fail_after(WAIT):
        while not condition():
            await anyio.sleep(0.005)


async def answers(replies: list[Reply[InferenceResponse]]) -> list[InferenceResponse]:
    with anyio.fail_after(10):
        return [await reply.wait() for reply in replies]


async def test_the_factory_picks_the_batcher_for_a_model_that_asks_for_it() -> None:
    text = CONFIG.format(max_batch_size=4, count=1, batching="")
    assert isinstance(scheduler_for(parse_pbtxt(text)), DynamicBatcher)
    # Without batching too, as in Triton: its queue policies and priorities apply.
    no_batch = CONFIG.format(max_batch_size=0, count=1, batching="")
    assert isinstance(scheduler_for(parse_pbtxt(no_batch)), DynamicBatcher)
    plain = text.replace("dynamic_batching {  }", "")
    assert "dynamic_batching" not in plain
    assert not isinstance(scheduler_for(parse_pbtxt(plain)), DynamicBatcher)


async def test_concurrent_requests_are_batched_and_each_gets_its_own_answer(
    system: ActorSystem,
) -> None:
    # A delay far longer than the test: batches are sent because they are full, never late.
    backend = RecordingBackend()
    router, _ = await serve(system, backend, "max_queue_delay_microseconds: 60000000")
    replies = [router.submit(request(10 * i, f"r{i}")) for i in range(12)]
    responses = await answers(replies)
    assert backend.sizes == [4, 4, 4]
    for i, response in enumerate(responses):
        assert response.id == f"r{i}"
        np.testing.assert_array_equal(response.outputs[0].data, [[20 * i, 20 * i + 2]])


async def test_requests_of_several_rows_are_split_back_by_their_own_batch_size(
    system: ActorSystem,
) -> None:
    backend = RecordingBackend()
    router, _ = await serve(system, backend, "max_queue_delay_microseconds: 60000000", 8)
    replies = [router.submit(request(100 * i, f"r{i}", rows=i + 1)) for i in range(3)]
    replies.append(router.submit(request(900, "r3", rows=2)))  # 1 + 2 + 3 + 2 = 8: full
    responses = await answers(replies)
    assert backend.sizes == [8]
    for response, rows, value in zip(responses, (1, 2, 3, 2), (0, 100, 200, 900), strict=True):
        expected = (np.arange(rows * 2).reshape(rows, 2) + value) * 2
        np.testing.assert_array_equal(response.outputs[0].data, expected)


async def test_no_batch_exceeds_max_batch_size_and_zero_delay_sends_what_is_there(
    system: ActorSystem,
) -> None:
    backend = RecordingBackend()
    router, _ = await serve(system, backend, "")
    blocker = await occupy(router, backend)
    replies = [router.submit(request(i, rows=1 + i % 3)) for i in range(10)]
    backend.gate.set()
    await answers([blocker, *replies])
    assert backend.sizes[0] == 1
    assert len(backend.sizes) < 11  # the backlog went in batches, not one by one
    assert max(backend.sizes) <= 4
    assert sum(backend.sizes) == 1 + sum(1 + i % 3 for i in range(10))


async def test_a_preferred_size_goes_while_the_delay_runs(system: ActorSystem) -> None:
    backend = RecordingBackend()
    # (1 is preferred too, so that the blocker goes at once.)
    config = "preferred_batch_size: [ 1, 2, 4 ] max_queue_delay_microseconds: 60000000"
    router, _ = await serve(system, backend, config, max_batch_size=8)
    blocker = await occupy(router, backend)
    replies = [router.submit(request(i)) for i in range(6)]
    backend.gate.set()
    await answers([blocker, *replies])
    # Triton's rule: the longest prefix of a preferred size goes at once (4, then the 2 left),
    # the minute-long delay notwithstanding.
    assert backend.sizes == [1, 4, 2]
    assert backend.executed == ["blocker", *[str(i) for i in range(6)]]


async def test_an_idle_model_runs_a_preferred_batch_at_once(system: ActorSystem) -> None:
    backend = RecordingBackend()
    config = "preferred_batch_size: [ 2, 4 ] max_queue_delay_microseconds: 60000000"
    router, _ = await serve(system, backend, config, max_batch_size=8)
    backend.gate.set()
    # The first waits (no preferred size yet); the second makes 2, and both go.
    await answers([router.submit(request(i)) for i in range(2)])
    assert backend.sizes == [2]


async def test_past_the_delay_a_batch_grows_to_max_batch_size(system: ActorSystem) -> None:
    backend = RecordingBackend()
    config = "preferred_batch_size: [ 2, 4 ] max_queue_delay_microseconds: 1"
    router, _ = await serve(system, backend, config, max_batch_size=8)
    blocker = await occupy(router, backend)
    replies = [router.submit(request(i)) for i in range(10)]
    backend.gate.set()
    await answers([blocker, *replies])
    # Triton's rule: once the delay ran out, what is queued goes up to max_batch_size, past
    # the largest preferred size (it was held to 4).
    assert backend.sizes[:2] == [1, 8]
    assert sum(backend.sizes) == 11


async def test_a_batch_ends_where_the_next_request_has_another_shape(
    system: ActorSystem,
) -> None:
    # Triton's rule: requests join in service order; one that cannot join (other dims past
    # the batch dimension) ends the batch, and is never overtaken by later ones of the shape.
    backend = RecordingBackend()
    router, _ = await serve(system, backend, "", max_batch_size=8)
    blocker = await occupy(router, backend)
    widths = [2, 2, 3, 3, 3, 5, 2, 2]
    replies = [router.submit(request(10 * i, f"r{i}", width=w)) for i, w in enumerate(widths)]
    backend.gate.set()
    responses = await answers([blocker, *replies])
    assert all(len(shapes) == 1 for shapes in backend.shapes)
    assert backend.sizes[1:] == [2, 3, 1, 2]  # widths 2, then 3, then 5, then 2 again
    assert backend.executed == ["blocker", *[f"r{i}" for i in range(len(widths))]]
    for i, (response, width) in enumerate(zip(responses[1:], widths, strict=True)):
        expected = (np.arange(width) + 10 * i) * 2
        np.testing.assert_array_equal(response.outputs[0].data, [expected])


async def test_a_waiting_batch_is_sent_at_once_when_a_request_that_cannot_join_comes_next(
    system: ActorSystem,
) -> None:
    # A queue delay of an hour and an idle instance: without the rule, the first answers would
    # never come (the test would time out).
    backend = RecordingBackend()
    config = "max_queue_delay_microseconds: 3600000000"
    router, actor = await serve(system, backend, config, max_batch_size=8)
    first = router.submit(request(1, "a", width=2))
    second = router.submit(request(2, "b", width=2))
    other = router.submit(request(3, "c", width=3))  # other dims: cannot join a and b
    await answers([first, second])
    last = router.submit(request(4, "d", width=2))  # cannot join c
    await answers([other])
    # Alone, "d" waits for its delay (or for one that cannot join it): the batcher holds it
    # with the instance idle (sent, it would have left the queue and taken the instance).
    batcher = batcher_of(actor)
    await until(lambda: len(batcher._idle) == 1 and batcher.queue_depth == 1)
    assert backend.batches == [["a", "b"], ["c"]]
    assert not last.done
    assert {b.batch_size: b.compute_infer.count for b in actor.statistics.batch_stats} == {
        1: 1,
        2: 1,
    }


@pytest.mark.parametrize("max_batch_size", [1, 0])
async def test_priorities_reorder_a_backlog(system: ActorSystem, max_batch_size: int) -> None:
    # (A model that does not batch has the batcher's priorities too, as in Triton.)
    backend = RecordingBackend()
    config = "priority_levels: 3 default_priority_level: 2"
    router, _ = await serve(system, backend, config, max_batch_size=max_batch_size)
    blocker = await occupy(router, backend)
    priorities = {"a": 3, "b": 0, "c": 1, "d": 2, "e": 1, "f": 7, "g": 3}
    replies = [router.submit(request(1, name, priority=p)) for name, p in priorities.items()]
    backend.gate.set()
    await answers([blocker, *replies])
    # 1 first; 0, absent and out-of-range go to the default level 2; 3 last; FIFO within one.
    assert backend.executed == ["blocker", "c", "e", "b", "d", "f", "a", "g"]


async def test_a_bad_priority_is_an_invalid_argument(system: ActorSystem) -> None:
    backend = RecordingBackend()
    router, _ = await serve(system, backend, "priority_levels: 2 default_priority_level: 1")
    with anyio.fail_after(WAIT), pytest.raises(TritonError) as caught:
        await router.infer(request(1, priority=-1))
    assert caught.value.code is ErrorCode.INVALID_ARG


@pytest.mark.parametrize("max_batch_size", [1, 0])
async def test_a_full_queue_rejects_at_once(system: ActorSystem, max_batch_size: int) -> None:
    backend = RecordingBackend()
    config = "default_queue_policy { max_queue_size: 2 }"
    router, _ = await serve(system, backend, config, max_batch_size=max_batch_size)
    blocker = await occupy(router, backend)
    queued = [router.submit(request(i)) for i in range(2)]
    rejected = router.submit(request(9, "over"))
    with anyio.fail_after(WAIT), pytest.raises(TritonError) as caught:
        await rejected.wait()  # while the instance is still held
    assert caught.value.code is ErrorCode.UNAVAILABLE
    # Triton's words, a refusal as it arrived (a gRPC stream answers it as one)
    assert caught.value.message == "[request id: over] Exceeds maximum queue size"
    assert caught.value.refused
    backend.gate.set()
    await answers([blocker, *queued])
    # Given back unrun: as in Triton, no failure counts it (statistics nor metrics).
    statistics = router.resolve("batched", "").statistics
    assert statistics.fail.count == 0
    assert sum(statistics.failures().values()) == 0
    assert "over" not in backend.executed


async def test_a_request_past_its_timeout_is_rejected(system: ActorSystem) -> None:
    backend = RecordingBackend()
    config = (
        "default_queue_policy { timeout_action: REJECT default_timeout_microseconds: 60000000 "
        "allow_timeout_override: true }"
    )
    router, _ = await serve(system, backend, config, max_batch_size=1)
    blocker = await occupy(router, backend)
    patient = router.submit(request(1, "patient"))
    hasty = router.submit(request(2, "hasty", timeout=1000))
    with anyio.fail_after(WAIT), pytest.raises(TritonError) as caught:
        await hasty.wait()  # rejected while the instance is still held
    assert caught.value.code is ErrorCode.UNAVAILABLE
    assert caught.value.message == "Request timeout expired"
    backend.gate.set()
    await answers([blocker, patient])
    assert backend.executed == ["blocker", "patient"]


async def test_without_a_default_timeout_a_requests_own_is_ignored(system: ActorSystem) -> None:
    # Triton 2.51: an override may only shorten the default, and 0 is no timeout to shorten.
    backend = RecordingBackend()
    config = "default_queue_policy { timeout_action: REJECT allow_timeout_override: true }"
    router, actor = await serve(system, backend, config, max_batch_size=1)
    blocker = await occupy(router, backend)
    asked = router.submit(request(1, "asked", timeout=1000))
    batcher = batcher_of(actor)
    await until(lambda: batcher.queue_depth == 1)
    (entry,) = (entry for level in batcher._levels for entry in level.waiting())
    assert entry.deadline == math.inf
    backend.gate.set()
    await answers([blocker, asked])
    assert backend.executed == ["blocker", "asked"]


async def test_a_delayed_request_yields_to_those_in_time(system: ActorSystem) -> None:
    backend = RecordingBackend()
    # `late` waits out its own 1 ms timeout (the test waits until the batcher has delayed it);
    # `on_time` has the default, a minute, and is queued before the instance is freed (the
    # test waits for that too): no busy machine can delay it as well.
    config = (
        "default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 60000000 "
        "allow_timeout_override: true }"
    )
    router, actor = await serve(system, backend, config, max_batch_size=1)
    blocker = await occupy(router, backend)
    late = router.submit(request(1, "late", timeout=1000))
    batcher = batcher_of(actor)
    await until(lambda: any(level.delayed for level in batcher._levels))
    on_time = router.submit(request(2, "on_time"))
    await until(lambda: any(not entry.gone for level in batcher._levels for entry in level.queue))
    backend.gate.set()
    await answers([blocker, late, on_time])
    assert backend.executed == ["blocker", "on_time", "late"]


async def test_a_cancelled_request_is_dropped(system: ActorSystem) -> None:
    backend = RecordingBackend()
    router, _ = await serve(system, backend, "")
    blocker = await occupy(router, backend)
    kept = router.submit(request(1, "kept"))
    gone_request = request(2, "gone")
    gone = router.submit(gone_request)
    gone_request.cancel()
    backend.gate.set()
    await answers([blocker, kept])
    with anyio.fail_after(WAIT), pytest.raises(TritonError) as caught:
        await gone.wait()
    assert caught.value.code is ErrorCode.CANCELLED
    assert "gone" not in backend.executed


async def test_n_instances_run_n_batches_at_once(system: ActorSystem) -> None:
    backend = RecordingBackend()
    router, _ = await serve(system, backend, "", max_batch_size=2, count=2)
    arrived = threading.Barrier(2)
    original = RecordingInstance.execute

    def meet(self: RecordingInstance, requests: list[InferenceRequest]) -> list[Result]:
        arrived.wait(timeout=WAIT)  # only two batches running at once get past this
        return original(self, requests)

    RecordingInstance.execute = meet  # type: ignore[method-assign]
    try:
        replies = [router.submit(request(i)) for i in range(2)]
        await answers(replies)
    finally:
        RecordingInstance.execute = original  # type: ignore[method-assign]
    assert len(backend.batches) == 2


async def test_preserve_ordering_holds_a_later_answer(system: ActorSystem) -> None:
    backend = RecordingBackend()
    first_gate = threading.Event()
    original = RecordingInstance.execute

    def slow_first(self: RecordingInstance, requests: list[InferenceRequest]) -> list[Result]:
        if requests[0].id == "first":
            first_gate.wait(timeout=WAIT)
        return original(self, requests)

    router, actor = await serve(system, backend, "preserve_ordering: true", 1, count=2)
    batcher = batcher_of(actor)
    RecordingInstance.execute = slow_first  # type: ignore[method-assign]
    try:
        finished: list[str] = []
        first = router.submit(request(1, "first"))
        second = router.submit(request(2, "second"))
        for reply in (first, second):
            reply.add_done_callback(lambda r: finished.append(r.result().id))
        # The second answer came back to the batcher, which holds it for the first.
        await until(lambda: any(inner.done for _, inner in batcher._held.values()))
        assert finished == []
        first_gate.set()
        await answers([first, second])
    finally:
        RecordingInstance.execute = original  # type: ignore[method-assign]
    assert finished == ["first", "second"]


# -- the ONNX Runtime backend runs a batch of several requests as one ----------------------------

STRINGS_CONFIG = """
name: "strings"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
"""


def onnx_strings(tmp_path: Path) -> tuple[OnnxRuntimeInstance, list[int]]:
    """A BYTES identity instance, and a list that grows by one per session run."""
    string_identity_model(tmp_path / "strings" / "1" / "model.onnx")
    config = parse_pbtxt(STRINGS_CONFIG)
    vdir = tmp_path / "strings" / "1"
    ctx = ModelContext("strings", 1, config, vdir.parent, vdir, vdir / "model.onnx")
    instance = (
        OnnxRuntimeBackend()
        .load_model(ctx)
        .create_instance(InstanceContext("strings_0", "KIND_CPU", 0, 0))
    )
    runs: list[int] = []
    run = instance._run

    def counted(*args: object) -> object:
        runs.append(1)
        return run(*args)  # type: ignore[arg-type]

    instance._run = counted  # type: ignore[method-assign]
    return instance, runs


def strings(request_id: str, *items: bytes) -> InferenceRequest:
    data = np.array([list(items)], dtype=np.object_)
    return InferenceRequest(
        "strings", id=request_id, inputs=[Tensor("INPUT0", "BYTES", data.shape, data)]
    )


def test_onnx_merges_requests_of_one_shape_into_one_run(tmp_path: Path) -> None:
    instance, runs = onnx_strings(tmp_path)
    requests = [
        strings("a", b"a1", b"a2"),
        strings("b", b"b1", b"b2", b"b3"),
        strings("c", b"c1", b"c2"),
        strings("d", b"d1", b"d2"),
    ]
    results = instance.execute(requests)
    assert len(runs) == 2  # widths 2 (three requests at once) and 3
    for request, result in zip(requests, results, strict=True):
        assert isinstance(result, InferenceResponse)
        assert result.id == request.id
        assert result.model_version == "1"
        assert result.outputs[0].data.tolist() == request.inputs[0].data.tolist()


def test_onnx_keeps_per_request_errors_in_a_merged_batch(tmp_path: Path) -> None:
    instance, _ = onnx_strings(tmp_path)
    requests = [
        strings("good", b"x", b"y"),
        strings("bad", b"\xff", b"y"),
        strings("ok", b"z", b""),
    ]
    good, bad, ok = instance.execute(requests)
    assert isinstance(bad, TritonError) and bad.code is ErrorCode.INVALID_ARG
    assert isinstance(good, InferenceResponse) and good.outputs[0].data.tolist() == [[b"x", b"y"]]
    assert isinstance(ok, InferenceResponse) and ok.outputs[0].data.tolist() == [[b"z", b""]]
