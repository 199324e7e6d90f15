"""engine/lanes.py with the frames of engine/wire.py: large tensors cross in shared-memory
slots that the receiver reads in place and releases once its last view of them has gone;
without room they cross on the socket."""

from __future__ import annotations

import errno
import logging
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from tritonactor.core.tensors import HeldView, owner_of
from tritonactor.core.types import InferenceResponse, Tensor
from tritonactor.engine import lanes
from tritonactor.engine import messages as m
from tritonactor.engine.frame_reader import FrameReader
from tritonactor.engine.lanes import Lane, LaneReader, owner_prefix, remove_owned, sweep_lanes
from tritonactor.engine.wire import OUT_OF_BAND, encode, write

SHM = lanes.SHM_DIR


def answer(index: int, elements: int) -> m.Answer:
    data = np.arange(elements, dtype=np.float32) + index
    return m.Answer(
        index, InferenceResponse("m", "1", "", [Tensor("OUT", "FP32", (elements,), data)])
    )


def files(lane: Lane) -> set[str]:
    return {name for name in os.listdir(SHM) if name.startswith(lane.prefix + "-")}


def in_a_slot(data: object) -> bool:
    """Whether `data` views a lane's slot (through the views it is of)."""
    return type(owner_of(data)) is HeldView


def mapped(name: str) -> bool:
    """Whether this process still maps the slot `name`."""
    with open("/proc/self/maps") as maps:
        return any(name in line for line in maps)


def cross(message: m.Answer, lane: Lane, reader: FrameReader) -> m.Answer:
    [received] = reader.feed(b"".join(bytes(piece) for piece in encode(message, lane)))
    assert isinstance(received, m.Answer)
    return received


def test_a_large_tensor_crosses_in_a_slot_that_is_reused_once_released() -> None:
    lane, taken = Lane(), LaneReader()
    reader = FrameReader(taken)
    try:
        pieces = encode(answer(1, OUT_OF_BAND), lane)
        assert sum(len(bytes(piece)) for piece in pieces) < 1024  # the bytes stayed behind
        [first] = reader.feed(b"".join(bytes(piece) for piece in pieces))
        np.testing.assert_array_equal(
            first.value.outputs[0].data, answer(1, OUT_OF_BAND).value.outputs[0].data
        )
        # Read in place: the slot is the receiver's while a view of it lives.
        assert in_a_slot(first.value.outputs[0].data)
        assert not taken.pop_taken() and len(files(lane)) == 1
        # Not released yet: the next tensor needs a slot of its own.
        second = cross(answer(2, OUT_OF_BAND), lane, reader)
        assert len(files(lane)) == 2
        assert not first.value.outputs[0].data.flags.writeable
        with pytest.raises(ValueError, match="read-only"):
            first.value.outputs[0].data[0] = 0
        kept = first.value.outputs[0].data[10:20]  # a view of a view keeps the slot too
        del first
        assert not taken.pop_taken()
        np.testing.assert_array_equal(kept, np.arange(10, 20, dtype=np.float32) + 1)
        del kept
        [name] = taken.pop_taken()  # the last view went: released
        lane.release((name,))
        third = cross(answer(3, OUT_OF_BAND // 2), lane, reader)
        assert len(files(lane)) == 2  # the released slot took it
        # What is still viewed is unchanged by the reuse of the slot released.
        for index, got in ((2, second), (3, third)):
            size = got.value.outputs[0].data.size
            np.testing.assert_array_equal(
                got.value.outputs[0].data, np.arange(size, dtype=np.float32) + index
            )
    finally:
        lane.close()
        taken.close()
    assert not files(lane)


def test_a_view_let_go_on_another_thread_is_released_by_the_next_message() -> None:
    """A view may go on a backend's thread: the slot is named in the `Released` that rides
    with the next message this side writes (wire.write), and once only."""
    lane, taken = Lane(), LaneReader()
    other_lane = Lane()
    reader = FrameReader(taken)
    try:
        got = cross(answer(1, OUT_OF_BAND), lane, reader)
        assert in_a_slot(got.value.outputs[0].data)
        box = [got]
        del got
        assert not taken.returned and not taken.pop_taken()  # still viewed, in `box`
        thread = threading.Thread(target=box.clear)
        thread.start()
        thread.join()
        written: list[bytes] = []

        class Transport:
            def write(self, data: bytes) -> None:
                written.append(bytes(data))

            def writelines(self, pieces: list[bytes]) -> None:
                written.append(b"".join(bytes(piece) for piece in pieces))

        write(Transport(), encode(m.Released(())), other_lane, taken)
        messages = FrameReader().feed(b"".join(written))
        assert [type(message) for message in messages] == [m.Released, m.Released]
        assert len(messages[0].names) == 1 and messages[0].names[0].startswith(lane.prefix)
        written.clear()
        write(Transport(), encode(m.Released(())), other_lane, taken)
        assert [type(x) for x in FrameReader().feed(b"".join(written))] == [m.Released]
    finally:
        lane.close()
        other_lane.close()
        taken.close()


def test_a_slot_still_viewed_when_the_connection_ends_stays_readable() -> None:
    """The reader's close unlinks the slots; one a view still reads stays mapped until the
    view goes (an answer still being written to its client, say)."""
    lane, taken = Lane(), LaneReader()
    reader = FrameReader(taken)
    try:
        got = cross(answer(4, OUT_OF_BAND), lane, reader)
        assert in_a_slot(got.value.outputs[0].data)
        [name] = files(lane)
        taken.close()
        lane.close()
        assert not files(lane)  # unlinked, still mapped here
        np.testing.assert_array_equal(
            got.value.outputs[0].data, np.arange(OUT_OF_BAND, dtype=np.float32) + 4
        )
        assert mapped(name)
        del got
        assert not mapped(name) and [n for n, _ in taken.returned] == [name]
    finally:
        lane.close()
    assert not files(lane)


def test_an_array_numpy_makes_of_the_held_view_keeps_the_slot() -> None:
    """numpy makes an array of an array's memory with that memory's owner as its base,
    skipping views: the held view is that owner, so such an array keeps the slot too."""
    lane, taken = Lane(), LaneReader()
    try:
        name = lane.put(memoryview(np.arange(OUT_OF_BAND, dtype=np.float32)).cast("B"))
        assert name is not None
        view = taken.take(name, 4 * OUT_OF_BAND)
        kept = [np.asarray(view.obj), view.obj.view(np.ndarray), np.frombuffer(view.obj, np.uint8)]
        del view
        while kept:
            assert not taken.pop_taken()
            kept.pop()
        assert taken.pop_taken() == (name,)
    finally:
        lane.close()
        taken.close()


def test_past_the_view_limit_a_tensor_is_copied_out_and_released_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Requests queued behind a slow model keep their views: past `VIEW_LIMIT` viewed, what
    comes is copied out and its slot released with the next message, so the sender keeps room
    (one tensor is viewed however large it is)."""
    monkeypatch.setattr(lanes, "VIEW_LIMIT", 2 * 4 * OUT_OF_BAND)  # two tensors' bytes
    lane, taken = Lane(), LaneReader()
    reader = FrameReader(taken)
    try:
        big = cross(answer(0, 4 * OUT_OF_BAND), lane, reader)  # over the limit alone: viewed
        assert in_a_slot(big.value.outputs[0].data)
        del big
        [first] = taken.pop_taken()
        lane.release((first,))
        got = [cross(answer(index, OUT_OF_BAND), lane, reader) for index in range(4)]
        assert [in_a_slot(g.value.outputs[0].data) for g in got] == [True, True, False, False]
        assert len(taken.pop_taken()) == 2  # the copies' slots, at once
        for index, g in enumerate(got):
            np.testing.assert_array_equal(
                g.value.outputs[0].data, np.arange(OUT_OF_BAND, dtype=np.float32) + index
            )
        del got, g
        assert len(taken.pop_taken()) == 2  # the views' slots, once they went
    finally:
        lane.close()
        taken.close()


def test_without_room_in_the_lane_a_tensor_crosses_on_the_socket() -> None:
    lane, taken = Lane(limit=2 * OUT_OF_BAND), LaneReader()
    reader = FrameReader(taken)
    try:
        big = answer(1, 4 * OUT_OF_BAND)  # 4 x 64 KiB elements of 4 bytes: over the limit
        pieces = encode(big, lane)
        assert sum(len(bytes(piece)) for piece in pieces) > big.value.outputs[0].data.nbytes
        got = cross(big, lane, reader)
        np.testing.assert_array_equal(got.value.outputs[0].data, big.value.outputs[0].data)
        assert not files(lane) and not taken.pop_taken()
    finally:
        lane.close()


def test_a_full_shm_folder_sends_tensors_on_the_socket_and_says_so_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """As Docker's 64 MiB /dev/shm fills: the space is reserved when a slot is made, so the
    refusal comes then (ENOSPC, injected here), never as a SIGBUS on a later write."""

    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    lane, reader = Lane(), FrameReader(LaneReader())
    with caplog.at_level(logging.WARNING, "tritonactor.engine.lanes"):
        for index in range(3):
            got = cross(answer(index, OUT_OF_BAND), lane, reader)
            np.testing.assert_array_equal(
                got.value.outputs[0].data, answer(index, OUT_OF_BAND).value.outputs[0].data
            )
    assert not files(lane)
    said = [r.getMessage() for r in caplog.records if r.name == "tritonactor.engine.lanes"]
    assert len(said) == 1 and "over their socket" in said[0]


def test_a_reader_refuses_what_is_not_a_slot_of_a_lane() -> None:
    reader = LaneReader()
    for name in ("../etc/passwd", "tritonactor-lane-1/../../x", "other-file"):
        with pytest.raises(ValueError, match="not a lane slot"):
            reader.take(name, 1)
    lane = Lane()
    try:
        with pytest.raises(ValueError, match="a tensor in a lane"):
            FrameReader().feed(b"".join(bytes(p) for p in encode(answer(1, OUT_OF_BAND), lane)))
    finally:
        lane.close()


def test_slots_of_processes_no_longer_running_are_swept() -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    gone = os.path.join(SHM, f"{owner_prefix(int(dead.stdout))}test-0-0")
    mine = os.path.join(SHM, f"{owner_prefix(os.getpid())}test-999-0")
    elsewhere = os.path.join(SHM, f"{lanes.PREFIX}otherhost-{int(dead.stdout)}-test-0-0")
    for path in (gone, mine, elsewhere):
        with open(path, "wb") as file:
            file.write(b"x")
    try:
        sweep_lanes()
        # Another host's (a container sharing /dev/shm) are not judged by a pid of this one.
        assert not os.path.exists(gone) and os.path.exists(mine) and os.path.exists(elsewhere)
        remove_owned(os.getpid())
        assert not os.path.exists(mine)
    finally:
        for path in (gone, mine, elsewhere):
            if os.path.exists(path):
                os.unlink(path)


def test_room_is_made_by_dropping_free_smaller_slots_only_when_that_makes_enough() -> None:
    """A lane at its limit drops free slots too small for the tensor (smallest first) when
    that makes room, and names them so that the receiver unmaps them; when dropping would not
    make room (a tensor over the whole limit, or slots still busy) it drops nothing."""
    lane, taken = Lane(limit=4 * OUT_OF_BAND), LaneReader()
    reader = FrameReader(taken)
    try:
        kept = [cross(answer(index, OUT_OF_BAND // 4), lane, reader) for index in range(4)]
        # (four 64 KiB slots fill the lane)
        assert len(files(lane)) == 4 and len(taken._mapped) == 4
        cross(answer(9, 8 * OUT_OF_BAND // 4), lane, reader)  # over the limit: the socket
        assert len(files(lane)) == 4 and not lane.dropped
        cross(answer(9, 2 * OUT_OF_BAND // 4), lane, reader)  # all four busy: the socket
        assert len(files(lane)) == 4 and not lane.dropped
        del kept[:2]
        lane.release(taken.pop_taken())
        cross(answer(9, 2 * OUT_OF_BAND // 4), lane, reader)  # two free ones make room
        assert len(files(lane)) == 3 and len(lane.dropped) == 2
        [dropped] = reader.feed(bytes(encode(m.Dropped(tuple(lane.dropped)))[0]))
        taken.forget(dropped.names)
        assert len(taken._mapped) == 3 and not set(dropped.names) & set(taken._mapped)
    finally:
        lane.close()
        taken.close()


def test_after_a_refusal_the_lane_tries_again_later(monkeypatch: pytest.MonkeyPatch) -> None:
    refusals = [OSError(errno.ENOSPC, "No space left on device")]
    real = os.posix_fallocate

    def once_full(fd: int, offset: int, length: int) -> None:
        if refusals:
            raise refusals.pop()
        real(fd, offset, length)

    monkeypatch.setattr(os, "posix_fallocate", once_full)
    monkeypatch.setattr(lanes, "_RETRY_AFTER", 2)
    lane = Lane()
    try:
        data = memoryview(np.zeros(OUT_OF_BAND, np.uint8))
        assert [lane.put(data) for _ in range(3)] == [None, None, None]
        assert lane.put(data) is not None
    finally:
        lane.close()
