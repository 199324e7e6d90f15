"""A lane stream's `LaneBuffer` against grpclib's `Buffer`: the same random sequences of chunks
added, ends, reads (of any size, waiting or not) and cancelled reads give the same bytes, the
same errors, the same windows given back at the same steps, and the same unread window."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from grpclib.protocol import Buffer
from hypothesis import given, settings
from hypothesis import strategies as st

from tritonactor.frontends.grpc.lane_buffer import LaneBuffer

OPS = st.lists(
    st.one_of(
        # a chunk: its bytes (bytes, bytearray or a memoryview, as the lane slices them) and
        # its padding
        st.tuples(
            st.just("add"),
            st.integers(0, 40),
            st.integers(0, 3),
            st.sampled_from(["bytes", "bytearray", "view"]),
        ),
        st.tuples(st.just("empty")),  # an empty DATA frame: no flow-controlled size
        st.tuples(st.just("eof")),
        st.tuples(st.just("read"), st.integers(0, 60)),
        st.tuples(st.just("cancel")),
    ),
    max_size=40,
)


async def _play(kind: type, ops: list[tuple[Any, ...]], copy: bool = True) -> list[Any]:
    """`ops` on a buffer of `kind`; `copy` false: LaneBuffer's reads that may give views (their
    bytes logged, not their type)."""
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
                log.append(("read", type(result).__name__ if copy else "", bytes(result)))
            reading = None

    for op in ops:
        if op[0] == "add":
            _, length, pad, form = op
            data: Any = bytes((counter + i) % 251 for i in range(length))
            counter += length
            if form == "bytearray":
                data = bytearray(data)
            elif form == "view":  # a part of what the socket read
                data = memoryview(b"<" + data + b">")[1:-1]
            buffer.add(data, length + pad)
        elif op[0] == "empty":
            buffer.add(b"", 0)
        elif op[0] == "eof":
            buffer.eof()
        elif op[0] == "read" and reading is None:
            reading = asyncio.ensure_future(
                buffer.read(op[1], copy=False)
                if kind is LaneBuffer and not copy
                else buffer.read(op[1])
            )
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


@settings(max_examples=300, deadline=None)
@given(OPS)
def test_reads_that_may_give_views_give_what_grpclibs_gives(ops: list[tuple[Any, ...]]) -> None:
    """`read(size, copy=False)` (the direct ModelInfer path's) gives the same bytes, errors and
    windows as grpclib's read; only the type of what it gives may differ."""
    theirs = asyncio.run(_play(Buffer, ops, copy=False))
    ours = asyncio.run(_play(LaneBuffer, ops, copy=False))
    assert ours == theirs


async def _readers(kind: type, cancel_first: bool) -> list[tuple[str, bytes]]:
    """Readers waiting on one buffer, one of them reading twice (so waiting again behind the
    other), the first cancelled once woken when `cancel_first`: who gets which chunk."""
    buffer = kind(lambda size: None)
    got: list[tuple[str, bytes]] = []

    async def reader(name: str, times: int) -> None:
        for _ in range(times):
            got.append((name, await buffer.read(1)))

    first = asyncio.ensure_future(reader("A", 2))
    await asyncio.sleep(0)
    second = asyncio.ensure_future(reader("B", 1))
    await asyncio.sleep(0)
    buffer.add(b"1", 1)
    if cancel_first:  # woken, not yet run: its wake-up goes to B, with no chunk after it
        first.cancel()
        for _ in range(5):
            await asyncio.sleep(0)
        second.cancel()
        await asyncio.gather(first, second, return_exceptions=True)
        return got
    for chunk in (b"2", b"3"):
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        buffer.add(chunk, 1)
    await asyncio.gather(first, second, return_exceptions=True)
    return got


@pytest.mark.parametrize("cancel_first", [False, True])
def test_reads_waiting_together_take_chunks_in_grpclibs_order(cancel_first: bool) -> None:
    """A chunk wakes the oldest read waiting, as grpclib's queue does; a woken read cancelled
    before it runs passes its wake-up on."""
    theirs = asyncio.run(_readers(Buffer, cancel_first))
    ours = asyncio.run(_readers(LaneBuffer, cancel_first))
    assert ours == theirs and ours
