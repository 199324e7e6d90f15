"""The lean request path: the actors' mailbox, the reply, where an instance runs a batch (event
loop or worker thread), and the HTTP app's direct infer route."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.lowlevel
import numpy as np
import pytest

from tritonactor.actors import Actor, ActorStopped, ActorSystem, Reply
from tritonactor.actors.mailbox import Mailbox, MailboxClosed
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
from tritonactor.core.types import (
    OUTPUT_BUFFERS,
    OUTPUTS_IN_PLACE,
    InferenceRequest,
    InferenceResponse,
    Tensor,
)
from tritonactor.frontends.http.infer_target import infer_path
from tritonactor.scheduling import instance as instance_module
from tritonactor.scheduling.model import ModelVersionActor
from tritonactor.scheduling.router import ModelHandle, Router
from tritonactor.scheduling.signature import ModelSignature

pytestmark = pytest.mark.anyio


# -- the mailbox ---------------------------------------------------------------------------------


async def test_a_full_mailbox_refuses_put_nowait_and_put_waits_for_room() -> None:
    mailbox: Mailbox[int] = Mailbox(2)
    mailbox.put_nowait(1)
    mailbox.put_nowait(2)
    with pytest.raises(anyio.WouldBlock):
        mailbox.put_nowait(3)
    assert len(mailbox) == 2
    queued = anyio.Event()

    async def writer() -> None:
        await mailbox.put(3)
        queued.set()

    async with anyio.create_task_group() as group:
        group.start_soon(writer)
        await anyio.wait_all_tasks_blocked()
        assert not queued.is_set()  # still waiting for room
        assert await mailbox.get() == 1  # room: the waiting message goes in, in order
        await queued.wait()
    assert [await mailbox.get(), await mailbox.get()] == [2, 3]


@pytest.mark.parametrize(("burst", "runs"), [(64, [64, 64, 22]), (1, [1] * 150)])
async def test_a_reader_takes_a_burst_of_queued_messages_then_lets_others_run(
    burst: int, runs: list[int]
) -> None:
    """The actors' mailboxes let other tasks run after 64 queued messages in a row; a
    stream's (burst 1) after each: its writer sees a client gone between two answers."""
    mailbox: Mailbox[int] = Mailbox(1000, burst=burst)
    for message in range(150):
        mailbox.put_nowait(message)
    taken: list[int] = []
    done = False

    async def other() -> None:
        while not done:
            taken.append(-1)  # a mark where another task ran
            await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as group:
        group.start_soon(other)
        await anyio.lowlevel.checkpoint()  # (the other task has run once)
        for _ in range(150):
            taken.append(await mailbox.get())
        done = True
    assert [t for t in taken if t >= 0] == list(range(150))  # in order
    got = [len(run) for run in "".join("x" if t >= 0 else "|" for t in taken).split("|") if run]
    assert got == runs


async def test_a_closed_mailbox_is_drained_then_ends() -> None:
    mailbox: Mailbox[str] = Mailbox(4)
    mailbox.put_nowait("a")
    mailbox.close()
    with pytest.raises(MailboxClosed):
        mailbox.put_nowait("b")
    assert [message async for message in mailbox] == ["a"]


async def test_a_reader_waits_for_a_message_and_for_the_close() -> None:
    mailbox: Mailbox[str] = Mailbox(4)
    got: list[str] = []

    async def reader() -> None:
        async for message in mailbox:
            got.append(message)

    async with anyio.create_task_group() as group:
        group.start_soon(reader)
        await anyio.wait_all_tasks_blocked()
        mailbox.put_nowait("x")
        await anyio.wait_all_tasks_blocked()
        assert got == ["x"]
        mailbox.close()
    assert got == ["x"]


async def test_writers_waiting_on_a_mailbox_whose_reader_left_fail() -> None:
    mailbox: Mailbox[int] = Mailbox(1)
    mailbox.put_nowait(1)
    failures: list[BaseException] = []

    async def writer() -> None:
        try:
            await mailbox.put(2)
        except MailboxClosed as error:
            failures.append(error)

    async with anyio.create_task_group() as group:
        group.start_soon(writer)
        await anyio.wait_all_tasks_blocked()
        mailbox.leave()
    assert len(failures) == 1
    with pytest.raises(MailboxClosed):
        mailbox.put_nowait(3)


async def test_a_cancelled_writer_queues_nothing() -> None:
    mailbox: Mailbox[int] = Mailbox(1)
    mailbox.put_nowait(1)
    with anyio.move_on_after(0):
        await mailbox.put(2)
    assert await mailbox.get() == 1
    with pytest.raises(anyio.WouldBlock):
        mailbox.get_nowait()


class _Slow(Actor[Reply[int]]):
    """Answers each reply with the count of messages it handled, once `go` is set."""

    mailbox_size = 1

    def __init__(self, go: anyio.Event) -> None:
        super().__init__("slow")
        self.go = go
        self.handled = 0

    async def receive(self, message: Reply[int]) -> None:
        await self.go.wait()
        self.handled += 1
        message.set(self.handled)


async def test_a_stopped_actor_handles_what_was_queued_or_waiting_and_refuses_more() -> None:
    go = anyio.Event()
    async with ActorSystem() as system:
        ref = await system.spawn(_Slow(go))
        first: Reply[int] = Reply()
        queued: Reply[int] = Reply()
        waiting: Reply[int] = Reply()
        await ref.tell(first)  # taken by the actor, which waits for `go`
        await anyio.wait_all_tasks_blocked()
        await ref.tell(queued)  # fills the mailbox of one
        async with anyio.create_task_group() as group:
            group.start_soon(ref.tell, waiting)  # waits for room
            await anyio.wait_all_tasks_blocked()
            ref.stop()
            with pytest.raises(ActorStopped):
                ref.tell_nowait(Reply())
            with pytest.raises(ActorStopped):
                await ref.tell(Reply())
            go.set()
        assert [await first.wait(), await queued.wait(), await waiting.wait()] == [1, 2, 3]
        await ref.join()


@dataclass(frozen=True)
class _Ask:
    reply: Reply[int]


class _Failing(Actor[_Ask]):
    mailbox_size = 4

    def __init__(self, go: anyio.Event) -> None:
        super().__init__("failing")
        self.go = go

    async def receive(self, message: _Ask) -> None:
        await self.go.wait()
        raise RuntimeError("broken")


async def test_messages_queued_when_an_actor_fails_get_actor_stopped() -> None:
    go = anyio.Event()
    async with ActorSystem() as system:
        ref = await system.spawn(_Failing(go))
        replies: list[Reply[int]] = [Reply(), Reply()]
        for reply in replies:
            await ref.tell(_Ask(reply))
        await anyio.wait_all_tasks_blocked()
        go.set()
        await ref.join()
        for reply in replies:  # the one it was handling, and the one still queued
            with pytest.raises(ActorStopped):
                await reply.wait()
        with pytest.raises(ActorStopped):
            await ref.tell(_Ask(Reply()))


# -- the reply -----------------------------------------------------------------------------------


async def test_a_cancelled_waiter_leaves_the_other_waiters_waiting() -> None:
    reply: Reply[str] = Reply()
    got: list[str] = []

    async def wait() -> None:
        got.append(await reply.wait())

    async with anyio.create_task_group() as group:
        group.start_soon(wait)
        with anyio.CancelScope() as scope:
            scope.cancel()
            await reply.wait()
        await anyio.wait_all_tasks_blocked()
        reply.set("answer")
    assert got == ["answer"]
    assert await reply.wait() == "answer"


async def test_a_failed_reply_raises_for_every_waiter() -> None:
    reply: Reply[str] = Reply()
    errors: list[BaseException] = []

    async def wait() -> None:
        try:
            await reply.wait()
        except ValueError as error:
            errors.append(error)

    async with anyio.create_task_group() as group:
        group.start_soon(wait)
        group.start_soon(wait)
        await anyio.wait_all_tasks_blocked()
        reply.fail(ValueError("no"))
    assert [str(error) for error in errors] == ["no", "no"]


# -- where a batch runs ----------------------------------------------------------------------------

CONFIG = """
name: "where"
max_batch_size: 4
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] } ]
"""


class _WhereInstance(BackendInstance):
    def __init__(self, backend: _WhereBackend) -> None:
        self.backend = backend

    def execute(self, requests: list[InferenceRequest]) -> list[Result]:
        self.backend.threads.append(threading.current_thread())
        return [
            InferenceResponse(
                r.model_name,
                "1",
                r.id,
                [Tensor("OUT", "INT32", r.inputs[0].shape, _placed(r))],
            )
            for r in requests
        ]


def _placed(request: InferenceRequest) -> np.ndarray:
    """The output, written into the buffer it is due in when there is one (in place)."""
    data = request.inputs[0].data
    offer = request.context.get(OUTPUT_BUFFERS)
    buffer = offer(request).get("OUT") if offer is not None else None
    if buffer is None:
        return data
    out = np.frombuffer(buffer, data.dtype, data.size).reshape(data.shape)
    out[...] = data
    request.context[OUTPUTS_IN_PLACE] = out.nbytes
    return out


class _WhereModel(BackendModel):
    def __init__(self, backend: _WhereBackend) -> None:
        self.backend = backend

    def create_instance(self, context: InstanceContext) -> BackendInstance:
        instance = _WhereInstance(self.backend)
        instance.may_run_on_loop = self.backend.may_run_on_loop
        return instance


class _WhereBackend(Backend):
    name = "where"

    def __init__(self, may_run_on_loop: bool) -> None:
        self.may_run_on_loop = may_run_on_loop
        self.threads: list[threading.Thread] = []

    def load_model(self, context: ModelContext) -> BackendModel:
        return _WhereModel(self)


async def _run_where(
    backend: _WhereBackend, sizes: list[int], in_place: bool = False
) -> list[bool]:
    """Whether each request (of `sizes` INT32 elements) ran on the event loop's thread; with
    `in_place`, each request's output is due in a buffer, and written there."""
    config = fill_defaults(parse_pbtxt(CONFIG), gpus=0)
    context = ModelContext("where", 1, config, Path("."), Path("1"), Path("1/model"))
    async with ActorSystem() as system:
        actor = ModelVersionActor(backend, context)
        await system.spawn(actor)
        assert actor.scheduler is not None
        router = Router()
        router.add(
            ModelHandle("where", 1, config, ModelSignature.from_config(config), actor.scheduler)
        )
        for size in sizes:
            data = np.arange(size, dtype=np.int32).reshape(1, size)
            request = InferenceRequest("where", inputs=[Tensor("IN", "INT32", (1, size), data)])
            buffer = bytearray(data.nbytes)
            if in_place:
                request.context[OUTPUT_BUFFERS] = lambda _, b=buffer: {"OUT": memoryview(b)}
            response = await router.infer(request)
            assert np.array_equal(response.outputs[0].data, data)  # answered either way
            assert np.may_share_memory(response.outputs[0].data, np.frombuffer(buffer)) is in_place
        system.stop()
    loop_thread = threading.current_thread()
    return [thread is loop_thread for thread in backend.threads]


async def test_a_short_execute_runs_the_next_small_batch_on_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(instance_module, "ON_LOOP_NS", 10**12)  # every execute counts as short
    monkeypatch.setattr(instance_module, "ON_LOOP_BYTES", 64)
    small, large = 4, 1000  # 16 and 4000 bytes
    on_loop = await _run_where(_WhereBackend(True), [small, small, small, large, small])
    # The first runs on the worker thread (not yet timed); a batch larger than both the bound
    # and twice the last one goes back to the thread.
    assert on_loop == [False, True, True, False, True]


async def test_a_long_execute_keeps_batches_on_the_worker_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(instance_module, "ON_LOOP_NS", 0)  # no execute is short
    assert await _run_where(_WhereBackend(True), [4, 4, 4]) == [False, False, False]


async def test_time_spent_writing_outputs_where_they_are_due_counts_as_the_copy_it_spares(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The loop would have copied the output there after the execute: an execute that did it
    # itself is credited that copy's time (here: any, at an hour a byte).
    monkeypatch.setattr(instance_module, "ON_LOOP_NS", 0)  # no execute is short by itself
    monkeypatch.setattr(instance_module, "IN_PLACE_NS_PER_BYTE", 3.6e12)
    assert await _run_where(_WhereBackend(True), [4, 4, 4], in_place=True) == [
        False,
        True,
        True,
    ]
    assert await _run_where(_WhereBackend(True), [4, 4, 4]) == [False, False, False]


def test_the_credit_counts_what_backends_wrote_in_place_up_to_an_off_loop_copy() -> None:
    credit = instance_module._in_place_ns
    per_byte = instance_module.IN_PLACE_NS_PER_BYTE
    batch = [InferenceRequest("m", context={OUTPUTS_IN_PLACE: 16}) for _ in range(2)]
    assert credit([*batch, InferenceRequest("m")]) == 32 * per_byte
    assert credit(batch) == 0  # each count is taken once
    huge = InferenceRequest("m", context={OUTPUTS_IN_PLACE: 4 << 20})  # its copy: off the loop
    assert credit([huge]) == instance_module.OFF_LOOP_BYTES * per_byte


async def test_a_backend_that_may_not_run_on_the_loop_never_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(instance_module, "ON_LOOP_NS", 10**12)
    assert await _run_where(_WhereBackend(False), [4, 4, 4]) == [False, False, False]


def test_onnxruntime_and_pytorch_may_run_on_the_loop_others_not() -> None:
    from tritonactor.backends.onnxruntime import OnnxRuntimeInstance
    from tritonactor.backends.python.instance import PythonInstance
    from tritonactor.backends.pytorch import PyTorchInstance

    assert OnnxRuntimeInstance.may_run_on_loop and PyTorchInstance.may_run_on_loop
    assert not PythonInstance.may_run_on_loop  # async execute: awaited on the loop anyway
    assert not BackendInstance.may_run_on_loop


# -- the direct infer route ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("/v2/models/simple/infer", {"model": "simple"}),
        ("/v2/models/simple/versions/3/infer", {"model": "simple", "version": 3}),
        ("/v2/models/simple/versions/007/infer", {"model": "simple", "version": 7}),
        ("/v2/models/stats/infer", {"model": "stats"}),
        ("/v2/models/a b/infer", {"model": "a b"}),
        ("/v2/models//infer", None),
        ("/v2/models/simple/versions//infer", None),
        ("/v2/models/simple/versions/x/infer", None),
        ("/v2/models/simple/versions/-1/infer", None),
        ("/v2/models/simple/infer/", None),
        ("/v2/models/simple/generate", None),
        ("/v2/models/a/b/infer", None),
        ("/v2/models/simple/versions/1/x/infer", None),
        ("/v2/models/infer", None),
    ],
)
def test_infer_paths_match_as_the_routes_would(path: str, params: dict[str, object] | None) -> None:
    assert infer_path(path) == params


# -- the direct route's request body -----------------------------------------------------------


@pytest.mark.parametrize(
    "messages",
    [
        [{"type": "http.request", "body": b"one piece"}],
        [{"type": "http.request", "body": b""}],
        [{"type": "http.request"}],
        [
            {"type": "http.request", "body": b"in ", "more_body": True},
            {"type": "http.request", "body": b"", "more_body": True},
            {"type": "http.request", "body": b"pieces"},
        ],
        [{"type": "http.request", "body": bytearray(b"not bytes")}],
        [
            {"type": "http.request", "body": b"cut ", "more_body": True},
            {"type": "http.disconnect"},
        ],
    ],
)
async def test_the_direct_routes_body_is_read_as_starlettes_request_reads_it(
    messages: list[dict[str, object]],
) -> None:
    """InferRequest.body gives what starlette's Request.body gives, and leaves the request as
    it leaves it (read again: the same body; the client gone: ClientDisconnect, noted)."""
    from starlette.requests import ClientDisconnect, Request

    from tritonactor.frontends.http.direct import InferRequest

    async def outcome(kind: type[Request]) -> tuple[object, ...]:
        pending = list(messages)

        async def receive() -> dict[str, object]:
            return pending.pop(0)

        async def send(message: object) -> None:
            raise AssertionError("nothing is sent")

        request = kind({"type": "http", "method": "POST", "headers": []}, receive, send)
        try:
            body = await request.body()
        except ClientDisconnect:
            return ("gone", request._is_disconnected, pending)
        again = await request.body()
        return (type(body), body, again, request._stream_consumed, pending)

    assert await outcome(InferRequest) == await outcome(Request)
