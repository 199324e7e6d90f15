"""A loop turn's writes gathered (core/cork.py): kept while a hold is on, written once each
transport at the turn's end, in order; written at once otherwise."""

from __future__ import annotations

import asyncio
import gc
import weakref
from typing import Any

import pytest

from tests.unit.test_engine_releases import deliver
from tritonactor.actors import Reply
from tritonactor.core.cork import CorkedTransport, cork
from tritonactor.core.errors import unavailable
from tritonactor.core.types import InferenceRequest, InferenceResponse
from tritonactor.engine import messages as m
from tritonactor.engine.lanes import Lane
from tritonactor.engine.remote import EngineConnection
from tritonactor.engine.wire import encode
from tritonactor.scheduling.instance import _answer
from tritonactor.scheduling.messages import Execute, Infer

pytestmark = pytest.mark.anyio


class Transport:
    """Records each system call's bytes, as uvloop's transports make them."""

    def __init__(self) -> None:
        self.calls: list[bytes] = []
        self.closing = False
        self.aborted = False

    def write(self, data: bytes) -> None:
        if self.closing:
            raise RuntimeError("written while closing")
        self.calls.append(bytes(data))

    def writelines(self, pieces: list[Any]) -> None:
        self.write(b"".join(bytes(piece) for piece in pieces))

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = self.aborted = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 1)}.get(name, default)


async def turn_ends() -> None:
    await asyncio.sleep(0)


async def test_without_a_hold_each_write_goes_at_once() -> None:
    transport = Transport()
    corked = CorkedTransport(transport)
    corked.write(b"a")
    corked.writelines([b"b", memoryview(b"c")])
    assert transport.calls == [b"a", b"bc"]


async def test_a_turns_writes_go_once_a_transport_at_its_end_in_order() -> None:
    first, second = Transport(), Transport()
    one, other = CorkedTransport(first), CorkedTransport(second)
    cork().hold()
    one.write(b"1")
    other.write(b"x")
    one.writelines([b"2", b"3"])
    one.write(b"4")
    assert first.calls == [] and second.calls == []
    await turn_ends()
    assert first.calls == [b"1234"] and second.calls == [b"x"]
    one.write(b"5")  # the hold is over: at once
    assert first.calls == [b"1234", b"5"]


async def test_a_hold_covers_the_work_queued_before_it() -> None:
    """Tasks woken before the hold (the calls an engine's answers wake) write in the turn it
    covers; a second hold moves the end behind work queued since the first."""
    transport = Transport()
    corked = CorkedTransport(transport)
    woken = asyncio.get_running_loop().create_future()

    async def call(data: bytes) -> None:
        await woken
        corked.write(data)

    first = asyncio.create_task(call(b"a"))
    await turn_ends()  # (the task waits on its future)
    cork().hold()
    woken.set_result(None)  # wakes the first task after the hold's end...
    second = asyncio.create_task(call(b"b"))
    cork().hold()  # ...which a later hold moves behind both
    await asyncio.gather(first, second)
    await turn_ends()
    assert transport.calls == [b"ab"]


async def test_close_writes_what_was_kept_and_abort_drops_it() -> None:
    closed, aborted = Transport(), Transport()
    one, other = CorkedTransport(closed), CorkedTransport(aborted)
    cork().hold()
    one.write(b"kept")
    other.write(b"dropped")
    one.close()
    other.abort()
    assert closed.calls == [b"kept"] and closed.closing
    await turn_ends()
    assert aborted.calls == [] and aborted.aborted
    assert one.get_extra_info("peername") == ("127.0.0.1", 1)  # the rest is the transport's


async def test_a_transport_closing_or_failing_at_the_end_costs_no_other_its_writes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    closing, failing, fine = Transport(), Transport(), Transport()
    first, second, third = (CorkedTransport(t) for t in (closing, failing, fine))
    cork().hold()
    first.write(b"a")
    second.write(b"b")
    third.write(b"c")
    closing.closing = True  # closed under the write: dropped, as uvloop drops it
    failing.write = failing.writelines = None  # type: ignore[assignment,method-assign]
    await turn_ends()
    assert closing.calls == [] and fine.calls == [b"c"]
    assert "gathered writes failed" in caplog.text


async def test_an_interrupted_release_leaves_no_others_writes_behind() -> None:
    """A BaseException out of one transport's write (an interrupt) still writes what the
    others kept, before any later write of theirs."""
    interrupted, other = Transport(), Transport()

    def interrupt(data: bytes) -> None:
        raise KeyboardInterrupt

    first, second = CorkedTransport(interrupted), CorkedTransport(other)
    cork().hold()
    first.write(b"a")
    second.write(b"1")
    interrupted.write = interrupt  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        cork().release()  # (what the loop runs at the turn's end)
    second.write(b"2")
    assert other.calls == [b"1", b"2"]


def test_each_loop_has_its_own_cork_and_lets_go_of_it() -> None:
    """A hold on one loop keeps no write of a transport made on another, and a loop that
    closed is not kept alive by its cork."""

    other_transport = Transport()

    async def made_here() -> CorkedTransport:
        return CorkedTransport(other_transport)

    loop = asyncio.new_event_loop()
    elsewhere = loop.run_until_complete(made_here())
    gone = weakref.ref(loop)
    loop.close()
    del loop

    async def here() -> None:
        cork().hold()
        assert cork().on and not elsewhere.cork.on and elsewhere.cork is not cork()
        elsewhere.write(b"at once")

    asyncio.run(here())
    assert other_transport.calls == [b"at once"]
    gc.collect()
    assert gone() is None


async def test_the_buffer_size_counts_what_is_kept_and_eof_comes_after_it() -> None:
    transport = Transport()
    transport.get_write_buffer_size = lambda: 3  # type: ignore[attr-defined]
    eof: list[int] = []
    transport.write_eof = lambda: eof.append(len(transport.calls))  # type: ignore[attr-defined]
    corked = CorkedTransport(transport)
    cork().hold()
    corked.writelines([b"ab", memoryview(b"cde")])
    assert corked.get_write_buffer_size() == 3 + 5
    corked.write_eof()
    assert transport.calls == [b"abcde"] and eof == [1]


async def test_a_batchs_answers_go_in_one_write_at_once() -> None:
    """An instance answers a batch (scheduling/instance.py): what the replies' callbacks write
    (the engine's answers to a front end) goes in one write when the batch is answered, not at
    the turn's end; a batch of one is written as it always was."""
    transport = Transport()
    corked = CorkedTransport(transport)

    def batch(size: int) -> Execute:
        items = [Infer(InferenceRequest(model_name="m"), Reply()) for _ in range(size)]
        for index, item in enumerate(items):
            item.reply.add_done_callback(lambda _, index=index: corked.write(b"%d" % index))
        return Execute(items)

    def never_deferred(item: Infer, deferred: object) -> None:
        raise AssertionError("no deferred answer here")

    three = batch(3)
    _answer(three, [InferenceResponse("m", "1")] * 3, never_deferred)
    assert transport.calls == [b"012"] and not cork().on
    _answer(batch(1), [InferenceResponse("m", "1")], never_deferred)
    assert transport.calls == [b"012", b"0"]
    # inside a hold, a batch's answers are the hold's to write, at the turn's end
    cork().hold()
    _answer(batch(2), [InferenceResponse("m", "1")] * 2, never_deferred)
    assert transport.calls == [b"012", b"0"] and cork().on
    await turn_ends()
    assert transport.calls == [b"012", b"0", b"01"]


async def test_a_gathering_that_ends_a_hold_leaves_no_later_hold_short() -> None:
    """A hold made inside a gathered section ends with it; a hold made after it in the same
    turn keeps the writes of the work queued before it (the first hold's release, queued
    earlier, does not end it)."""
    transport = Transport()
    corked = CorkedTransport(transport)
    writes, loop = cork(), asyncio.get_running_loop()
    assert writes.gather()
    writes.hold()
    corked.write(b"g")
    writes.end_gather()
    loop.call_soon(corked.write, b"1")
    loop.call_soon(corked.write, b"2")
    writes.hold()
    await turn_ends()
    assert transport.calls == [b"g", b"12"]


async def test_the_engine_connection_holds_for_several_answers_not_one() -> None:
    """What wakes calls (answers, failures, parts) counts; a release riding with one answer
    does not make it several."""
    connection = EngineConnection(on_message=lambda message: None)
    connection.connection_made(Transport())  # type: ignore[arg-type]
    lane = Lane()
    try:
        deliver(connection, [*encode(m.Dropped(()), lane), *encode(m.Answer(1, None), lane)])
        assert not cork().on
        deliver(
            connection,
            [*encode(m.Answer(2, None), lane), *encode(m.Failed(3, unavailable("gone")), lane)],
        )
        assert cork().on
        await turn_ends()
    finally:
        lane.close()
        connection._lanes.close()
        connection._lane.close()
