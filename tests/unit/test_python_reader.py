"""The python instance's reader on the event loop, as the server runs it: an instance made on a
worker thread of the loop (as `ModelInstances` makes them) is read by the loop itself, with no
thread of its own; decoupled responses reach their senders on the loop, in order; a sender
that may hold a response up (an ensemble step with `max_inflight_requests`) gets it from a
thread while reading waits; a killed process is noticed; finalize delivers what the model
sent as it ended. (The other python-backend tests make instances on the loop's own thread,
where the instance reads with a thread of its own, the fallback.)"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from typing import Any

import anyio
import numpy as np
import pytest

from tests.python_backend_support import PATIENCE_S, Started, outputs, request, tensor
from tritonactor.backends.python import PythonInstance
from tritonactor.core.errors import TritonError
from tritonactor.core.types import InferenceResponse, ResponseSender
from tritonactor.scheduling.first_response import FirstResponseHistogram, FirstResponseTimer
from tritonactor.scheduling.statistics import VersionStatistics

pytestmark = pytest.mark.anyio

Answer = tuple[InferenceResponse | None, TritonError | None, bool]


async def made(start: Started, name: str) -> PythonInstance:
    """`name`'s instance, made on a worker thread of the running loop."""
    return await anyio.to_thread.run_sync(start, name)


class Recorded:
    """A sender's answers and the thread each came on; `done` is set at the final flag."""

    def __init__(self, holds_up: bool = False, hold_first: bool = False) -> None:
        self.loop = asyncio.get_running_loop()
        self.answers: list[Answer] = []
        self.threads: list[int] = []
        self.done = anyio.Event()
        self.first_held = anyio.Event()  # the first answer is being held up
        self.go = threading.Event()
        self._hold_first = hold_first
        self.sender = ResponseSender(self._deliver, holds_up)

    def _deliver(
        self, response: InferenceResponse | None, error: TritonError | None, final: bool
    ) -> None:
        self.threads.append(threading.get_ident())
        if self._hold_first and len(self.answers) == 0:
            self.loop.call_soon_threadsafe(self.first_held.set)
            assert self.go.wait(PATIENCE_S), "the test never let the first answer go"
        self.answers.append((response, error, final))
        if final:
            self.loop.call_soon_threadsafe(self.done.set)

    def values(self) -> list[int]:
        return [int(outputs(r)["OUT"][0]) for r, _, _ in self.answers if r is not None]


def repeat(values: list[int], sender: ResponseSender) -> Any:
    return request("repeat", tensor("IN", np.array(values, np.int32)), sender=sender)


async def test_an_instance_made_on_a_worker_thread_is_read_by_the_loop(start: Started) -> None:
    instance = await made(start, "add_sub")
    assert instance._reader._loop is asyncio.get_running_loop()
    assert not [t for t in threading.enumerate() if t.name == "add_sub_0_0-reader"]
    ones = np.ones(4, dtype=np.float32)
    for value in (ones, 2 * ones):
        [result] = await instance.execute(
            [request("add_sub", tensor("INPUT0", value), tensor("INPUT1", ones))]
        )
        assert outputs(result)["OUTPUT0"].tolist() == (value + ones).tolist()


async def test_decoupled_responses_reach_their_sender_on_the_loop_in_order(
    start: Started,
) -> None:
    instance = await made(start, "repeat")
    recorded = Recorded()
    assert await instance.execute([repeat(list(range(20)), recorded.sender)]) == [None]
    with anyio.fail_after(PATIENCE_S):
        await recorded.done.wait()
    assert recorded.values() == list(range(20))
    assert set(recorded.threads) == {threading.get_ident()}  # the loop's


@pytest.mark.parametrize("wrapped", [False, True], ids=["bare", "as-the-router-wraps-it"])
async def test_a_sender_that_holds_up_gets_its_answers_from_a_thread_while_reading_waits(
    start: Started, wrapped: bool
) -> None:
    instance = await made(start, "repeat")
    recorded = Recorded(holds_up=True, hold_first=True)
    sender: ResponseSender = recorded.sender
    statistics = VersionStatistics(batching=False)
    if wrapped:  # the router times a decoupled request's first response through its sender
        sender = FirstResponseTimer(
            sender, time.perf_counter_ns(), FirstResponseHistogram(), statistics
        )
        assert sender.holds_up()
    executed: list[object] = []

    async def execute() -> None:
        with anyio.fail_after(PATIENCE_S):
            executed.extend(await instance.execute([repeat(list(range(10)), sender)]))

    async with anyio.create_task_group() as tasks:
        # The model's execute returns while its thread sends: its result may come on the
        # socket before the first response or after it, and then waits behind it too.
        tasks.start_soon(execute)
        with anyio.fail_after(PATIENCE_S):
            await recorded.first_held.wait()
        # The first answer is held up on a thread; the loop runs on, and reads nothing
        # meanwhile.
        assert instance._reader.paused
        assert recorded.threads[0] != threading.get_ident()
        recorded.go.set()
        with anyio.fail_after(PATIENCE_S):
            await recorded.done.wait()
    assert executed == [None]
    assert recorded.values() == list(range(10))
    assert threading.get_ident() not in recorded.threads
    assert statistics.streaming == 0  # (1 until its final response went, from a thread)
    # Reading goes on: the instance still answers.
    again = Recorded()
    await instance.execute([repeat([7], again.sender)])
    with anyio.fail_after(PATIENCE_S):
        await again.done.wait()
    assert again.values() == [7]


async def test_the_loop_notices_a_killed_process(start: Started) -> None:
    instance = await made(start, "crash")
    loop = asyncio.get_running_loop()
    died = anyio.Event()
    reasons: list[str] = []

    def on_death(reason: str) -> None:
        reasons.append(reason)
        loop.call_soon_threadsafe(died.set)

    instance.on_death(on_death)
    os.kill(instance.pid, signal.SIGKILL)
    with anyio.fail_after(PATIENCE_S):
        await died.wait()
    assert reasons == ["python model process for instance 'crash_0_0' exited with signal SIGKILL"]
    assert await anyio.to_thread.run_sync(instance._reader.done.wait, PATIENCE_S)


async def test_finalize_delivers_what_the_model_sent_as_it_ended(start: Started) -> None:
    instance = await made(start, "finalize_answers")
    parked = [Recorded() for _ in range(3)]
    for value, recorded in enumerate(parked):
        one = request("finalize_answers", tensor("IN", np.array([value], np.int32)))
        one.sender = recorded.sender
        assert await instance.execute([one]) == [None]
    assert not any(recorded.answers for recorded in parked)
    await anyio.to_thread.run_sync(instance.finalize)
    for value, recorded in enumerate(parked):
        with anyio.fail_after(PATIENCE_S):
            await recorded.done.wait()
        assert recorded.values() == [value]
