"""A lane stream's `LaneBuffer` against grpclib's `Buffer`: the same random sequences of chunks
added, ends, reads (of any size, waiting or not) and cancelled reads give the same bytes, the
same errors, the same windows given back at the same steps, and the same unread window."""

from __future__ import annotations

import asyncio
from typing import Any

from grpclib.protocol import Buffer
from hypothesis import given, settings
from hypothesis import strategies as st

from tritonactor.frontends.grpc.lane_buffer import LaneBuffer

OPS = st.lists(
    st.one_of(
        # a chunk: its bytes (bytes or bytearray, as the lane slices them) and its padding
        st.tuples(st.just("add"), st.integers(0, 40), st.integers(0, 3), st.booleans()),
        st.tuples(st.just("empty")),  # an empty DATA frame: no flow-controlled size
        st.tuples(st.just("eof")),
        st.tuples(st.just("read"), st.integers(0, 60)),
        st.tuples(st.just("cancel")),
    ),
    max_size=40,
)


async def _play(kind: type, ops: list[tuple[Any, ...]]) -> list[Any]:
    log: list[Any] = []
    buffer = kind(lambda size: log.append(("ack", size)))
    reading: asyncio.Task[bytes] | None = None
    counter = 0

    async def settle() -> None:
        nonlocal reading
        for _ in range(5):
            await asyncio.sleep(0)
        if reading is not None and reading.done():
            if reading.cancelled():
                log.append(("cancelled",))
            elif reading.exception() is not None:
                error = reading.exception()
                log.append(("error", type(error).__name__, str(error)))
            else:
                result = reading.result()
                log.append(("read", type(result).__name__, bytes(result)))
            reading = None

    for op in ops:
        if op[0] == "add":
            _, length, pad, as_bytearray = op
            data = bytes((counter + i) % 251 for i in range(length))
            counter += length
            buffer.add(bytearray(data) if as_bytearray else data, length + pad)
        elif op[0] == "empty":
            buffer.add(b"", 0)
        elif op[0] == "eof":
            buffer.eof()
        elif op[0] == "read" and reading is None:
            reading = asyncio.ensure_future(buffer.read(op[1]))
        elif op[0] == "cancel" and reading is not None:
            reading.cancel()
        await settle()
        log.append(("pending", reading is not None))
    if reading is not None:
        reading.cancel()
        await settle()
    log.append(("unacked", buffer.unacked_size()))
    log.append(("unacked, again", buffer.unacked_size()))  # (let go the first time)
    return log


@settings(max_examples=400, deadline=None)
@given(OPS)
def test_the_lane_buffer_reads_and_gives_the_window_back_as_grpclibs(
    ops: list[tuple[Any, ...]],
) -> None:
    theirs = asyncio.run(_play(Buffer, ops))
    ours = asyncio.run(_play(LaneBuffer, ops))
    assert ours == theirs


def test_two_reads_waiting_both_go_on() -> None:
    """Two reads waiting on one buffer (grpclib's queue wakes each in turn): both end."""

    async def play() -> tuple[bytes, bytes]:
        buffer = LaneBuffer(lambda size: None)
        first = asyncio.ensure_future(buffer.read(2))
        second = asyncio.ensure_future(buffer.read(2))
        await asyncio.sleep(0)
        buffer.add(b"ab", 2)
        buffer.add(b"cd", 2)
        return await first, await second

    assert sorted(asyncio.run(play())) == [b"ab", b"cd"]
