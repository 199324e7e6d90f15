"""The data plane in-process: router -> scheduler -> instance actors, with a small test backend."""

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
from tritonactor.config.model_config import parse_pbtxt
from tritonactor.config.normalize import fill_defaults
from tritonactor.core.errors import ErrorCode, TritonError, internal
from tritonactor.core.types import InferenceRequest, InferenceResponse, Tensor
from tritonactor.scheduling.model import ModelVersionActor
from tritonactor.scheduling.router import ModelHandle, Router
from tritonactor.scheduling.signature import ModelSignature

pytestmark = pytest.mark.anyio

# Bounds a wait for an event that is bound to happen: reached only when something is broken.
WAIT = 30

CONFIG = """
name: "echo"
max_batch_size: 4
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 2 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 2 ] } ]
instance_group [ { count: %d kind: KIND_CPU } ]
"""


class EchoInstance(BackendInstance):
    def __init__(self, backend: EchoBackend, name: str) -> None:
        self.backend = backend
        self.name = name

    def execute(self, requests: list[InferenceRequest]) -> list[Result]:
        results: list[Result] = []
        for request in requests:
            data = request.inputs[0].data
            if self.backend.barrier is not None:
                self.backend.barrier.wait(timeout=WAIT)  # every instance must be in here at once
            if int(data.flat[0]) < 0:
                results.append(internal("negative input"))
                continue
            self.backend.executed_by.append(self.name)
            results.append(
                InferenceResponse(
                    request.model_name,
                    str(request.resolved_version),
                    request.id,
                    [Tensor("OUT", "INT32", data.shape, data * 2)],
                )
            )
        return results

    def finalize(self) -> None:
        self.backend.finalized.append(self.name)


class EchoModel(BackendModel):
    def __init__(self, backend: EchoBackend) -> None:
        self.backend = backend

    def create_instance(self, context: InstanceContext) -> BackendInstance:
        if self.backend.fail_instance == context.index:
            raise RuntimeError(f"instance {context.index} cannot start")
        return EchoInstance(self.backend, context.name)

    def finalize(self) -> None:
        self.backend.finalized.append("model")


class EchoBackend(Backend):
    name = "echo"

    def __init__(self, barrier: threading.Barrier | None = None, fail_instance: int = -1) -> None:
        self.barrier = barrier
        self.fail_instance = fail_instance
        self.executed_by: list[str] = []
        self.finalized: list[str] = []

    def load_model(self, context: ModelContext) -> BackendModel:
        return EchoModel(self)


def context(count: int) -> ModelContext:
    config = fill_defaults(parse_pbtxt(CONFIG % count), gpus=0)
    return ModelContext("echo", 1, config, Path("."), Path("1"), Path("1/model"))


def request(value: int, request_id: str = "") -> InferenceRequest:
    data = np.array([[value, value + 1]], dtype=np.int32)
    return InferenceRequest("echo", id=request_id, inputs=[Tensor("IN", "INT32", (1, 2), data)])


@pytest.fixture
async def system() -> AsyncIterator[ActorSystem]:
    async with ActorSystem() as actors:
        yield actors


async def serve(system: ActorSystem, backend: EchoBackend, count: int) -> Router:
    ctx = context(count)
    actor = ModelVersionActor(backend, ctx)
    await system.spawn(actor)
    assert actor.scheduler is not None
    router = Router()
    router.known.add("echo")
    router.add(
        ModelHandle("echo", 1, ctx.config, ModelSignature.from_config(ctx.config), actor.scheduler)
    )
    return router


async def test_requests_flow_through_router_scheduler_and_instance(system: ActorSystem) -> None:
    router = await serve(system, EchoBackend(), count=1)
    response = await router.infer(request(5, "r1"))
    assert response.id == "r1"
    np.testing.assert_array_equal(response.outputs[0].data, [[10, 12]])


async def test_n_instances_execute_concurrently(system: ActorSystem) -> None:
    # Two requests meet at a barrier of two inside execute(): only two instances running at
    # the same time let either of them finish.
    backend = EchoBackend(barrier=threading.Barrier(2))
    router = await serve(system, backend, count=2)
    results: list[InferenceResponse] = []

    async def one(value: int) -> None:
        results.append(await router.infer(request(value)))

    with anyio.fail_after(WAIT):
        async with anyio.create_task_group() as group:
            group.start_soon(one, 1)
            group.start_soon(one, 2)
    assert sorted(backend.executed_by) == ["echo_0_0", "echo_0_1"]
    assert sorted(int(r.outputs[0].data.flat[0]) for r in results) == [2, 4]


async def test_a_failing_request_does_not_disturb_the_next(system: ActorSystem) -> None:
    router = await serve(system, EchoBackend(), count=1)
    with pytest.raises(TritonError) as caught:
        await router.infer(request(-1))
    assert caught.value.code is ErrorCode.INTERNAL
    assert (await router.infer(request(3))).outputs[0].data.tolist() == [[6, 8]]


async def test_invalid_requests_are_rejected_before_the_scheduler(system: ActorSystem) -> None:
    backend = EchoBackend()
    router = await serve(system, backend, count=1)
    bad = request(1)
    bad.inputs[0] = Tensor("IN", "FP32", (1, 2), np.zeros((1, 2), np.float32))
    with pytest.raises(TritonError, match="data-type is 'FP32', but model 'echo' expects 'INT32'"):
        await router.infer(bad)
    too_big = InferenceRequest(
        "echo", inputs=[Tensor("IN", "INT32", (5, 2), np.zeros((5, 2), np.int32))]
    )
    with pytest.raises(TritonError, match="batch-size must be <= 4"):
        await router.infer(too_big)
    assert backend.executed_by == []


async def test_failed_instance_start_fails_the_load_and_releases_the_rest(
    system: ActorSystem,
) -> None:
    backend = EchoBackend(fail_instance=1)
    with pytest.raises(RuntimeError, match="instance 1 cannot start"):
        await system.spawn(ModelVersionActor(backend, context(2)))
    assert backend.finalized == ["echo_0_0", "model"]


async def test_unknown_model_and_version_errors() -> None:
    router = Router()
    router.known.add("known")
    with pytest.raises(TritonError, match="'nosuch' is not found") as caught:
        router.resolve("nosuch")
    assert caught.value.code is ErrorCode.NOT_FOUND
    # a model of the repository no load was asked for: not found, as in Triton
    with pytest.raises(TritonError, match="'known' is not found"):
        router.resolve("known")
    router.tried["known"] = frozenset()  # (a load was asked for: it does not serve)
    with pytest.raises(TritonError, match="'known' has no available versions"):
        router.resolve("known")


async def test_stopping_the_model_finalizes_instances_then_model() -> None:
    backend = EchoBackend()
    async with ActorSystem() as actors:
        await serve(actors, backend, count=2)
    assert sorted(backend.finalized[:2]) == ["echo_0_0", "echo_0_1"]
    assert backend.finalized[2] == "model"


async def test_a_cancelled_request_that_has_not_run_is_dropped(system: ActorSystem) -> None:
    # One instance, held at a barrier of two by the first request: the second request waits in
    # the queue, is cancelled there, and must never reach the backend.
    backend = EchoBackend(barrier=threading.Barrier(2))
    assert backend.barrier is not None
    router = await serve(system, backend, count=1)
    first = router.submit(request(1, "first"))
    second_request = request(2, "second")
    second = router.submit(second_request)
    second_request.cancel()
    await anyio.to_thread.run_sync(backend.barrier.wait, WAIT)  # let the first one finish
    with anyio.fail_after(WAIT):
        assert (await first.wait()).id == "first"
        with pytest.raises(TritonError) as caught:
            await second.wait()
    assert caught.value.code is ErrorCode.CANCELLED
    assert backend.executed_by == ["echo_0_0"]


async def test_a_caller_that_gives_up_cancels_its_request(system: ActorSystem) -> None:
    backend = EchoBackend(barrier=threading.Barrier(2))
    assert backend.barrier is not None
    router = await serve(system, backend, count=1)
    blocker = router.submit(request(1))
    waiting = request(2)
    with anyio.move_on_after(0.1):
        await router.infer(waiting)
    assert waiting.cancelled
    await anyio.to_thread.run_sync(backend.barrier.wait, WAIT)
    with anyio.fail_after(WAIT):
        await blocker.wait()


class OnLoopInstance(BackendInstance):
    """Answers at once, so short that the instance runs its batches on the event loop."""

    may_run_on_loop = True

    def __init__(self) -> None:
        self.executed = 0

    def execute(self, requests: list[InferenceRequest]) -> list[Result]:
        self.executed += len(requests)
        return [InferenceResponse("quick", "1", r.id, []) for r in requests]


async def _batches_between_turns(backend: OnLoopInstance, requests: int = 300) -> list[int]:
    """A backlog of `requests` for one instance of `backend`, queued at a default scheduler at
    once: how many batches ran between each two turns of the calling task, until all ran
    (every request answered)."""
    from tritonactor.actors import Reply
    from tritonactor.scheduling.default import DefaultScheduler
    from tritonactor.scheduling.instance import InstanceActor
    from tritonactor.scheduling.messages import Infer

    async with ActorSystem() as system:
        scheduler = await system.spawn(DefaultScheduler("quick"))
        await system.spawn(InstanceActor("quick_0", backend, scheduler))
        await anyio.wait_all_tasks_blocked()
        replies = []
        for _ in range(requests):
            request = InferenceRequest(
                "quick", inputs=[Tensor("IN", "INT32", (2,), np.zeros(2, np.int32))]
            )
            replies.append(Reply[InferenceResponse]())
            scheduler.tell_nowait(Infer(request, replies[-1]))
        runs: list[int] = []
        seen = 0
        with anyio.fail_after(WAIT):
            while backend.executed < len(replies):
                await anyio.lowlevel.cancel_shielded_checkpoint()
                runs.append(backend.executed - seen)
                seen = backend.executed
            for reply in replies:
                await reply.wait()
        return runs


async def test_a_backlog_of_batches_run_on_the_loop_lets_the_loop_turn_between_them() -> None:
    """The scheduler hands an instance that says it is idle its next batch on the instance's
    own turn (it handles messages on its sender's turn); a batch run on the loop is still
    followed by a turn of the loop, so another task runs between any two of them (without
    that turn, 64 ran in a row: the mailbox's burst)."""
    runs = await _batches_between_turns(OnLoopInstance())
    assert max(runs) <= 2, max(runs)
    assert sum(runs) == 300


class NeverWaitingInstance(OnLoopInstance):
    """An async execute that answers without ever waiting."""

    may_run_on_loop = False

    async def execute(self, requests: list[InferenceRequest]) -> list[Result]:  # type: ignore[override]
        return OnLoopInstance.execute(self, requests)


async def test_a_backlog_of_async_executes_that_never_wait_lets_the_loop_turn() -> None:
    """The same for an async execute that answers without waiting: it let nothing else run
    either (seen by a callback the loop runs only if it waited)."""
    runs = await _batches_between_turns(NeverWaitingInstance())
    assert max(runs) <= 2, max(runs)
    assert sum(runs) == 300


async def _fail_the_scheduler_under(
    backend: EchoBackend, entered: Callable[[], object]
) -> dict[str, object]:
    """Three requests for one instance of `backend`: the first runs (until `entered()` returns,
    awaited in a thread, once it is in the backend's execute), two queue at the scheduler; then
    the scheduler fails on a message it cannot handle, and a fourth ("late") is sent behind
    it. Each request's outcome, by name: the queued ones' and the late one's (in the
    scheduler's words, UNAVAILABLE) once the failure answered them, the running one's once all
    is over."""
    outcomes: dict[str, object] = {}
    done = {name: anyio.Event() for name in ("running", "queued 1", "queued 2")}
    async with ActorSystem() as actors:
        router = await serve(actors, backend, count=1)
        handle = router.resolve("echo", "1")

        async def infer(name: str) -> None:
            try:
                outcomes[name] = await router.infer(request(1, name))
            except TritonError as error:
                outcomes[name] = error
            done[name].set()

        async with anyio.create_task_group() as tasks:
            for name in done:
                tasks.start_soon(infer, name)
                await anyio.wait_all_tasks_blocked()
            assert handle.scheduler.mailbox_depth == 0  # all three taken: one runs, two queue
            handle.scheduler.tell_nowait(object())  # type: ignore[arg-type]
            # sent in the same turn: in its mailbox behind the failure, never taken
            late = router.submit(request(1, "late"))
            with anyio.fail_after(WAIT):
                await done["queued 1"].wait()
                await done["queued 2"].wait()
                with pytest.raises(TritonError) as caught:
                    await late.wait()
                outcomes["late"] = caught.value
                await anyio.to_thread.run_sync(entered)
                await done["running"].wait()
    for name in ("queued 1", "queued 2", "late"):
        error = outcomes[name]
        assert isinstance(error, TritonError) and error.code is ErrorCode.UNAVAILABLE, name
        assert "failed" in str(error) and "not run" in str(error), error
    return outcomes


async def test_a_scheduler_that_fails_answers_what_it_queued_and_what_was_running() -> None:
    """A scheduler that fails (here: a message it cannot handle) still answers the requests in
    its queue, by its `stopped` hook, which a failed actor runs too (before, they hung); its
    model fails with it, and the request its instance was running on its worker thread, which
    a stop never cuts short, is answered once that execute is over."""
    backend = EchoBackend(barrier=threading.Barrier(2))
    barrier = backend.barrier
    assert barrier is not None
    outcomes = await _fail_the_scheduler_under(backend, lambda: barrier.wait(WAIT))
    assert isinstance(outcomes["running"], InferenceResponse)
    # the instance released (by its own hook: its mailbox closed before the cancel reached it,
    # the execute shielded), then the model, whose hook ran after its failure
    assert backend.finalized == ["echo_0_0", "model"]


class EndlessInstance(EchoInstance):
    """An async execute that never ends (a python model's process that never answers)."""

    def __init__(self, backend: EchoBackend, name: str, entered: threading.Event) -> None:
        super().__init__(backend, name)
        self.entered = entered

    async def execute(self, requests: list[InferenceRequest]) -> list[Result]:  # type: ignore[override]
        self.entered.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")


class EndlessBackend(EchoBackend):
    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()

    def load_model(self, context: ModelContext) -> BackendModel:
        backend = self

        class Model(EchoModel):
            def create_instance(self, context: InstanceContext) -> BackendInstance:
                return EndlessInstance(backend, context.name, backend.entered)

        return Model(self)


async def test_an_async_execute_cut_short_by_its_models_failure_is_answered() -> None:
    """An async execute is cancelled with its instance when the model fails: its request is
    answered UNAVAILABLE (before, it hung), and the instance is finalized before the model."""
    backend = EndlessBackend()
    outcomes = await _fail_the_scheduler_under(backend, lambda: backend.entered.wait(WAIT))
    running = outcomes["running"]
    assert isinstance(running, TritonError) and running.code is ErrorCode.UNAVAILABLE
    assert "stopped before answering" in str(running)
    # the instance, cancelled mid-execute (no hook of its own), released by its model first
    assert backend.finalized == ["echo_0_0", "model"]


async def test_a_scheduler_stopped_cleanly_answers_its_queue_as_unloading() -> None:
    """The words of a clean stop (an unload), which a failure's must not replace: the requests
    still queued are answered UNAVAILABLE "is unloading", the running one runs to its end."""
    backend = EchoBackend(barrier=threading.Barrier(2))
    barrier = backend.barrier
    assert barrier is not None
    async with ActorSystem() as actors:
        router = await serve(actors, backend, count=1)
        handle = router.resolve("echo", "1")
        running = router.submit(request(1, "running"))
        queued = [router.submit(request(1, f"queued {n}")) for n in (1, 2)]
        await anyio.wait_all_tasks_blocked()
        handle.scheduler.stop()
        with anyio.fail_after(WAIT):
            for reply in queued:
                with pytest.raises(TritonError) as caught:
                    await reply.wait()
                assert caught.value.code is ErrorCode.UNAVAILABLE
                assert "'echo' is unloading; the request was not run" in str(caught.value)
            await anyio.to_thread.run_sync(barrier.wait, WAIT)
            assert (await running.wait()).id == "running"
