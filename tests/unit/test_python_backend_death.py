"""What a python instance says when its process dies with a batch on the way: `BatchNotRun` (the
batch may run elsewhere) when the process never took it off its socket, `InstanceDied` when it
did; and a dead instance, once finalized, holds no mapping or file descriptor of its own."""

from __future__ import annotations

import gc
import os
import signal
from pathlib import Path

import anyio
import numpy as np
import pytest

from tests.python_backend_support import Started, outputs, request, tensor
from tritonactor.backends.base import InstanceDied
from tritonactor.backends.lifetime import BatchNotRun
from tritonactor.backends.python import ipc

pytestmark = pytest.mark.anyio


def crash_request(value: int):  # type: ignore[no-untyped-def]
    return request("crash", tensor("INPUT0", np.array([value], np.int32)))


async def test_a_batch_the_dying_process_never_took_did_not_run(start: Started) -> None:
    """The batch lands in the socket of a stopped process (as it can in the instant a killed
    process takes to end): killed before it reads it, the batch did not run."""
    instance = start("crash")
    [result] = await instance.execute([crash_request(0)])
    assert outputs(result)["PID"].tolist() == [instance.pid]
    os.kill(instance.pid, signal.SIGSTOP)
    raised: list[BaseException] = []

    async def run() -> None:
        try:
            await instance.execute([crash_request(0)])
        except InstanceDied as error:
            raised.append(error)

    async with anyio.create_task_group() as group:
        group.start_soon(run)
        # execute has written the batch (the socket takes it) and waits for the answer
        while not instance._pending:
            await anyio.sleep(0)
        os.kill(instance.pid, signal.SIGKILL)
    [error] = raised
    assert type(error) is BatchNotRun
    assert str(error) == "python model process for instance 'crash_0_0' exited with signal SIGKILL"


@pytest.mark.parametrize("value", [1, 2])
async def test_a_batch_the_process_took_died_with_it(start: Started, value: int) -> None:
    instance = start("crash")
    with pytest.raises(InstanceDied) as died:
        await instance.execute([crash_request(value)])
    assert not isinstance(died.value, BatchNotRun)


def _descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def _mapped(prefix: str) -> list[str]:
    return [line for line in Path("/proc/self/maps").read_text().splitlines() if prefix in line]


async def test_dead_instances_leave_no_descriptors_or_mappings(start: Started) -> None:
    """Each round: serve (results come back through the reused arena: PAD is past the inline
    limit), die, finalize. The dead
    instances stay referenced (as a caller may hold them): what they mapped is released all the
    same, and the descriptor count does not grow from round to round."""
    counts = []
    for index in range(4):
        instance = start("crash", index=index)
        [result] = await instance.execute([crash_request(0)])
        assert outputs(result)["PID"].tolist() == [instance.pid]
        with pytest.raises(InstanceDied):
            await instance.execute([crash_request(2)])
        instance.finalize()
        instance._stub.output_thread.join()  # it closes the output pipe at its end
        assert _mapped(instance._stub.shm_prefix) == []
        gc.collect()  # what earlier tests left for the collector closes its descriptors now
        counts.append(_descriptors())
    # Never more than after the first round (fewer when something else in this process closed
    # one meanwhile, as seen once on a busy machine: [86, 86, 86, 83]).
    assert max(counts[1:]) <= counts[0], counts


def test_counter_is_shared_between_two_mappings() -> None:
    writer = ipc.Counter()
    assert writer.fd is not None
    reader = ipc.Counter(os.dup(writer.fd))  # as the stub gets it: a descriptor, no name
    writer.handed_over()
    assert writer.fd is None
    assert reader.value == 0
    writer.value = 41
    assert reader.value == 41
    reader.close()
    assert reader.value == 0  # closed: nothing mapped
    writer.close()


def _signals(pid: int, field: str) -> int:
    """A process's signal mask `field` (SigIgn, SigCgt) from /proc, as a bit set."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1], 16)
    raise AssertionError(f"no {field} for {pid}")


def _bit(number: signal.Signals) -> int:
    return 1 << (number - 1)


async def test_a_group_signal_spares_the_model_but_not_what_it_started(start: Started) -> None:
    """SIGTERM and SIGINT (a Ctrl-C or systemd stop reaches the whole group) are caught by the
    model's process and end nothing; the processes the model starts keep the default, so its
    finalize can still terminate them."""
    instance = start("spawner")
    [result] = await instance.execute(
        [request("spawner", tensor("INPUT0", np.array([0], np.int32)))]
    )
    stub, child = outputs(result)["PID"].tolist()
    assert stub == instance.pid
    for number in (signal.SIGTERM, signal.SIGINT):
        assert _signals(stub, "SigCgt") & _bit(number)
        assert not _signals(child, "SigIgn") & _bit(number)
        os.kill(stub, number)
    [result] = await instance.execute(
        [request("spawner", tensor("INPUT0", np.array([0], np.int32)))]
    )
    assert outputs(result)["PID"].tolist() == [stub, child]
    instance.finalize()
    assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text()
