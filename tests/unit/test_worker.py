"""An actor's worker thread: one thread, one call at a time, off the event loop."""

from __future__ import annotations

import threading

import anyio
import pytest

from tritonactor.actors.worker import WorkerThread

pytestmark = pytest.mark.anyio


async def test_calls_run_on_one_thread_that_is_not_the_loop() -> None:
    worker = WorkerThread("w")
    try:
        names = {await worker.run(lambda: threading.current_thread().name) for _ in range(20)}
        assert len(names) == 1
        assert names != {threading.current_thread().name}
    finally:
        worker.close()


async def test_calls_do_not_overlap() -> None:
    worker = WorkerThread("w")
    running, overlaps = [0], [0]
    lock = threading.Lock()

    def work() -> None:
        with lock:
            running[0] += 1
            overlaps[0] = max(overlaps[0], running[0])
        threading.Event().wait(0.01)
        with lock:
            running[0] -= 1

    try:
        async with anyio.create_task_group() as group:
            for _ in range(5):
                group.start_soon(worker.run, work)
        assert overlaps[0] == 1
    finally:
        worker.close()


async def test_errors_reach_the_caller() -> None:
    worker = WorkerThread("w")

    def fail() -> None:
        raise ValueError("inside the worker")

    try:
        with pytest.raises(ValueError, match="inside the worker"):
            await worker.run(fail)
    finally:
        worker.close()
