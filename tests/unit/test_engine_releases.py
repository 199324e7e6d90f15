"""A `Released` rides with the next message its side sends (engine/lanes.py): a large tensor
taken from the other side's lane writes nothing by itself; the next message carries the release
in the same write, and the release goes alone only once the slots taken hold `RELEASE_ALONE`
bytes. Both sides: the engine's connection to a front end (engine/host.py) and a front end's
to the engine (engine/remote.py)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

from tests.unit.test_engine_wire import Transport
from tritonactor.core.types import InferenceRequest, InferenceResponse, Tensor
from tritonactor.engine import lanes
from tritonactor.engine import messages as m
from tritonactor.engine.host import _Connection
from tritonactor.engine.lanes import Lane, LaneReader
from tritonactor.engine.remote import EngineConnection
from tritonactor.engine.wire import OUT_OF_BAND, FrameReader, encode

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


def slots(lane: Lane) -> set[str]:
    return {name for name in os.listdir(lanes.SHM_DIR) if name.startswith(lane.prefix + "-")}


def engine_side() -> tuple[_Connection, Transport]:
    """The engine's connection to a front end, with what a large tensor's crossing touches."""
    connection = _Connection.__new__(_Connection)
    connection._lane = Lane()
    connection._lanes = LaneReader()
    connection._regions = None  # type: ignore[assignment]
    connection._reader = FrameReader(connection._lanes)
    connection._asked = {}
    transport = Transport()
    connection._transport = transport  # type: ignore[assignment]
    return connection, transport


def test_the_engine_releases_a_front_ends_slots_with_its_next_message() -> None:
    front_end = Lane()  # the front end's side of the lanes
    connection, transport = engine_side()
    try:
        # A large tensor from the front end (an answer to the engine's ask, which no one
        # awaits here): taken, and nothing written for it.
        deliver(connection, encode(large_answer(1), front_end))
        [name] = slots(front_end)
        assert transport.written == []
        # The engine's next message carries the release, before it, in the same write.
        connection.send(m.Answer(2, None))
        [[released, answer]] = written(transport)
        assert released == m.Released((name,)) and answer == m.Answer(2, None)
        # Nothing is released twice.
        connection.send(m.Answer(3, None))
        assert written(transport)[1] == [m.Answer(3, None)]
    finally:
        front_end.close()
        connection._lanes.close()
        connection._lane.close()


def test_the_engine_releases_alone_once_the_slots_taken_hold_enough(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(lanes, "RELEASE_ALONE", 3 * 4 * OUT_OF_BAND)  # three tensors' bytes
    front_end = Lane()
    connection, transport = engine_side()
    try:
        for id in (1, 2):
            deliver(connection, encode(large_answer(id), front_end))
        assert transport.written == []
        deliver(connection, encode(large_answer(3), front_end))
        [[released]] = written(transport)
        assert isinstance(released, m.Released) and set(released.names) == slots(front_end)
        assert not connection._lanes.taken and not connection._lanes.due
    finally:
        front_end.close()
        connection._lanes.close()
        connection._lane.close()


async def test_a_front_end_releases_the_engines_slots_with_its_next_request() -> None:
    engine = Lane()  # the engine's side of the lanes
    connection = EngineConnection(on_message=lambda message: None)
    transport = Transport()
    connection.connection_made(transport)  # type: ignore[arg-type]
    try:
        # A large answer from the engine: taken, released with nothing written.
        deliver(connection, encode(large_answer(1), engine))
        [name] = slots(engine)
        assert transport.written == []
        # The next request carries the release, in the same write.
        id, _reply = connection.submit(InferenceRequest(model_name="m"))
        [[released, submit]] = written(transport)
        assert released == m.Released((name,))
        assert isinstance(submit, m.Submit) and submit.id == id
    finally:
        engine.close()
        connection._lane.close()
        connection._lanes.close()


async def test_a_front_end_releases_alone_once_the_slots_taken_hold_enough(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(lanes, "RELEASE_ALONE", 2 * 4 * OUT_OF_BAND)
    engine = Lane()
    connection = EngineConnection(on_message=lambda message: None)
    transport = Transport()
    connection.connection_made(transport)  # type: ignore[arg-type]
    try:
        deliver(connection, encode(large_answer(1), engine))
        assert transport.written == []
        deliver(connection, encode(large_answer(2), engine))
        [[released]] = written(transport)
        assert isinstance(released, m.Released) and set(released.names) == slots(engine)
        # The engine reuses what was released: a third answer makes no slot.
        engine.release(released.names)
        deliver(connection, encode(large_answer(3), engine))
        assert len(slots(engine)) == 2
    finally:
        engine.close()
        connection._lane.close()
        connection._lanes.close()
