"""A `Released` rides with the next message its side sends (engine/lanes.py): a large tensor
read from the other side's lane writes nothing by itself, nor does its last view going; the
next message carries the release in the same write, and the release goes alone only once the
slots let go of hold `RELEASE_ALONE` bytes. Both sides: the engine's connection to a front end
(engine/host.py) and a front end's to the engine (engine/remote.py)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from tests.unit.test_engine_wire import Transport
from tritonactor.core.types import InferenceRequest, InferenceResponse, Tensor
from tritonactor.engine import lanes
from tritonactor.engine import messages as m
from tritonactor.engine.frame_reader import FrameReader
from tritonactor.engine.host import _Connection
from tritonactor.engine.lanes import Lane, LaneReader
from tritonactor.engine.remote import EngineConnection
from tritonactor.engine.wire import OUT_OF_BAND, encode

pytestmark = pytest.mark.anyio


def large_answer(id: int, elements: int = OUT_OF_BAND) -> m.Answer:
    data = np.arange(elements, dtype=np.float32) + id
    return m.Answer(id, InferenceResponse("m", "1", "", [Tensor("OUT", "FP32", data.shape, data)]))


def deliver(connection: Any, pieces: list[bytes | memoryview]) -> None:
    """Hand `pieces` (one frame) to `connection` as its socket would."""
    data = memoryview(b"".join(bytes(piece) for piece in pieces))
    while data:
        with connection.get_buffer(len(data)) as target:
            size = min(len(target), len(data))
            target[:size] = data[:size]
        connection.buffer_updated(size)
        data = data[size:]


def written(transport: Transport) -> list[list[object]]:
    """What each write carried, decoded."""
    return [FrameReader().feed(data) for data in transport.written]


async def turn_ends() -> None:
    """The loop's turn ends: what the front end's connection wrote in it, gathered by its cork
    since the engine's answers were read (core/cork.py), is written."""
    await asyncio.sleep(0)


def slots(lane: Lane) -> set[str]:
    return {name for name in os.listdir(lanes.SHM_DIR) if name.startswith(lane.prefix + "-")}


@dataclass
class Side:
    """One side of a connection, with the other side's lane it takes tensors from."""

    connection: Any
    transport: Transport
    other: Lane  # the other side's lane: what it sends large tensors through

    def receive_large(self, id: int) -> None:
        deliver(self.connection, encode(large_answer(id), self.other))


@pytest.fixture
def engine() -> Iterator[Side]:
    """The engine's connection to a front end, with what a large tensor's crossing touches."""
    connection = _Connection.__new__(_Connection)
    connection._lane = Lane()
    connection._lanes = LaneReader()
    connection._regions = None  # type: ignore[assignment]
    connection._reader = FrameReader(connection._lanes)
    connection._asked = {}
    transport = Transport()
    connection._transport = transport  # type: ignore[assignment]
    side = Side(connection, transport, Lane())
    yield side
    close(side)


@pytest.fixture
async def front_end() -> AsyncIterator[Side]:
    """A front end's connection to the engine."""
    connection = EngineConnection(on_message=lambda message: None)
    transport = Transport()
    connection.connection_made(transport)  # type: ignore[arg-type]
    side = Side(connection, transport, Lane())
    yield side
    close(side)


def close(side: Side) -> None:
    side.other.close()
    side.connection._lanes.close()
    side.connection._lane.close()


def test_the_engine_releases_a_front_ends_slots_with_its_next_message(engine: Side) -> None:
    # A large tensor from the front end (an answer to the engine's ask, which no one awaits
    # here): taken, and nothing written for it.
    engine.receive_large(1)
    [name] = slots(engine.other)
    assert engine.transport.written == []
    # The engine's next message carries the release, before it, in the same write.
    engine.connection.send(m.Answer(2, None))
    [[released, answer]] = written(engine.transport)
    assert released == m.Released((name,)) and answer == m.Answer(2, None)
    # Nothing is released twice.
    engine.connection.send(m.Answer(3, None))
    assert written(engine.transport)[1] == [m.Answer(3, None)]


def test_an_answer_that_does_not_encode_fails_with_the_release_riding_along(
    engine: Side,
) -> None:
    engine.receive_large(1)
    [name] = slots(engine.other)
    unpicklable = InferenceResponse("m", "1", parameters={"x": lambda: None})  # type: ignore[dict-item]
    engine.connection.send(m.Answer(2, unpicklable))
    [[released, failed]] = written(engine.transport)
    assert released == m.Released((name,))
    assert isinstance(failed, m.Failed) and failed.id == 2


def test_a_release_waits_while_the_connection_is_closing(engine: Side) -> None:
    engine.receive_large(1)
    [name] = slots(engine.other)
    engine.transport.is_closing = lambda: True  # type: ignore[method-assign]
    engine.connection.send(m.Answer(2, None))
    assert engine.transport.written == [] and engine.connection._lanes.pop_taken() == (name,)


def test_the_engine_releases_alone_once_the_slots_taken_hold_enough(
    engine: Side, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lanes, "RELEASE_ALONE", 3 * 4 * OUT_OF_BAND)  # three tensors' bytes
    for id in (1, 2):
        engine.receive_large(id)
    assert engine.transport.written == []
    engine.receive_large(3)
    [[released]] = written(engine.transport)
    assert isinstance(released, m.Released) and set(released.names) == slots(engine.other)
    assert not engine.connection._lanes.pop_taken() and not engine.connection._lanes.due


async def test_a_front_end_releases_the_engines_slots_with_its_next_request(
    front_end: Side,
) -> None:
    # A large answer from the engine: taken, released with nothing written.
    front_end.receive_large(1)
    [name] = slots(front_end.other)
    assert front_end.transport.written == []
    # The next request carries the release, in the same write.
    await turn_ends()
    assert front_end.transport.written == []
    id, _reply = front_end.connection.submit(InferenceRequest(model_name="m"))
    await turn_ends()
    [[released, submit]] = written(front_end.transport)
    assert released == m.Released((name,))
    assert isinstance(submit, m.Submit) and submit.id == id


async def test_a_front_end_releases_alone_once_the_slots_taken_hold_enough(
    front_end: Side, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lanes, "RELEASE_ALONE", 2 * 4 * OUT_OF_BAND)
    front_end.receive_large(1)
    await turn_ends()
    assert front_end.transport.written == []
    front_end.receive_large(2)
    await turn_ends()
    [[released]] = written(front_end.transport)
    assert isinstance(released, m.Released) and set(released.names) == slots(front_end.other)
    # The engine reuses what was released: a third answer makes no slot.
    front_end.other.release(released.names)
    front_end.receive_large(3)
    assert len(slots(front_end.other)) == 2


async def test_a_tensor_still_viewed_is_released_with_the_first_message_after_it_goes(
    front_end: Side,
) -> None:
    """An answer's tensor is read in place: its slot stays the front end's while the answer is
    held (being written to its client), and is released with the first message after."""
    id, reply = front_end.connection.submit(InferenceRequest(model_name="m"))
    deliver(front_end.connection, encode(large_answer(id), front_end.other))
    [name] = slots(front_end.other)
    kept = reply.result().outputs[0].data
    del reply
    await turn_ends()
    front_end.transport.written.clear()
    front_end.connection.submit(InferenceRequest(model_name="m"))
    [[submit]] = written(front_end.transport)
    assert isinstance(submit, m.Submit)  # no release: the tensor is still viewed
    np.testing.assert_array_equal(kept, np.arange(OUT_OF_BAND, dtype=np.float32) + id)
    del kept
    front_end.connection.submit(InferenceRequest(model_name="m"))
    [_, [released, submit]] = written(front_end.transport)
    assert released == m.Released((name,)) and isinstance(submit, m.Submit)
