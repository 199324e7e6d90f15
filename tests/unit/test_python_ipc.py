"""How a python instance talks with its stub process: what crosses the process boundary for a
batch, how tensors come back (inside the message, copied out of the reused arena, or views of a
file of their own), and the stub's exit when the server's side of its sockets closes."""

from __future__ import annotations

import mmap
import os
import socket
import threading
from collections.abc import Iterator
from typing import Any

import anyio
import numpy as np
import pytest

from tests.python_backend_support import Started, outputs, request, tensor
from tritonactor.backends.python import PythonBackend, PythonInstance, ipc
from tritonactor.core.types import InferenceRequest


@pytest.fixture
def start() -> Iterator[Started]:
    started = Started(PythonBackend())
    yield started
    started.finalize_all()


def add_sub(a: np.ndarray, b: np.ndarray) -> InferenceRequest:
    return request("add_sub", tensor("INPUT0", a), tensor("INPUT1", b))


def count_crossings(instance: PythonInstance) -> dict[str, list[str]]:
    """Record the op of every message the server sends the stub and reads back from it."""
    seen: dict[str, list[str]] = {"out": [], "back": []}
    send, dispatch = instance._stub.channel.send, instance._dispatch

    def counted_send(message: dict[str, Any]) -> None:
        seen["out"].append(message["op"])
        send(message)

    def counted_dispatch(message: dict[str, Any]) -> None:
        seen["back"].append(message["op"])
        dispatch(message)

    instance._stub.channel.send = counted_send  # type: ignore[method-assign]
    instance._dispatch = counted_dispatch  # type: ignore[method-assign]
    return seen


def mapped(array: np.ndarray) -> bool:
    """Whether `array` is a view of a shared-memory mapping (not a copy of it)."""
    base: Any = array
    while isinstance(base, np.ndarray):
        base = base.base
    return isinstance(base, mmap.mmap)


@pytest.mark.anyio
async def test_a_batch_crosses_the_process_boundary_once(start: Started) -> None:
    instance = start("add_sub")
    seen = count_crossings(instance)
    values = [np.full(4, i, dtype=np.float32) for i in range(6)]
    results = await instance.execute([add_sub(v, v) for v in values])
    # Six requests: one message to the stub, one back.
    assert seen == {"out": ["execute"], "back": ["result"]}
    for value, result in zip(values, results, strict=True):
        assert outputs(result)["OUTPUT0"].tolist() == (value + value).tolist()
        assert outputs(result)["OUTPUT1"].tolist() == [0.0] * 4


@pytest.mark.anyio
async def test_small_results_are_each_answers_own_large_ones_are_views(
    start: Started,
) -> None:
    instance = start("add_sub")
    small = np.arange(4, dtype=np.float32)
    [first] = await instance.execute([add_sub(small, small)])
    [second] = await instance.execute([add_sub(small + 1, small)])
    # The message's bytes (past the inline limit, the reused arena's) are each answer's own.
    assert outputs(first)["OUTPUT0"].tolist() == (small + small).tolist()
    assert outputs(second)["OUTPUT0"].tolist() == (small + 1 + small).tolist()
    assert not mapped(outputs(first)["OUTPUT0"])
    big = np.arange(1 << 20, dtype=np.float32)  # 4 MiB per tensor: past the arena's limit
    [result] = await instance.execute([add_sub(big, big)])
    out = outputs(result)
    assert mapped(out["OUTPUT0"]) and mapped(out["OUTPUT1"])
    np.testing.assert_array_equal(out["OUTPUT0"], big + big)
    np.testing.assert_array_equal(out["OUTPUT1"], np.zeros_like(big))


def where_tensors_go(instance: PythonInstance) -> dict[str, list[Any]]:
    """Record where each execute's tensors travel, and its results'."""
    seen: dict[str, list[Any]] = {"out": [], "back": []}
    send, dispatch = instance._stub.channel.send, instance._dispatch

    def watched_send(message: dict[str, Any]) -> None:
        if message["op"] == "execute":
            seen["out"].append(message["shm"])
        send(message)

    def watched_dispatch(message: dict[str, Any]) -> None:
        if message["op"] == "result":
            seen["back"].append(message["shm"])
        dispatch(message)

    instance._stub.channel.send = watched_send  # type: ignore[method-assign]
    instance._dispatch = watched_dispatch  # type: ignore[method-assign]
    return seen


@pytest.mark.anyio
async def test_a_few_kib_travel_inside_the_messages_more_through_shared_memory(
    start: Started,
) -> None:
    instance = start("add_sub")
    seen = where_tensors_go(instance)
    # Two inputs (and two outputs) of 512 floats: 4 KiB a batch, the inline limit.
    inline = np.arange(ipc.INLINE_LIMIT // 8, dtype=np.float32)
    [first] = await instance.execute([add_sub(inline, inline)])
    [second] = await instance.execute([add_sub(inline + 1, inline)])
    past = np.arange(ipc.INLINE_LIMIT // 8 + 1, dtype=np.float32)  # 64 bytes more
    [third] = await instance.execute([add_sub(past, past)])
    assert [type(place) for place in seen["out"]] == [bytearray, bytearray, str]
    assert [type(place) for place in seen["back"]] == [bytearray, bytearray, str]
    assert seen["out"][2].startswith("@") and seen["back"][2].startswith("@")  # the arenas
    # Each answer is its own: the arrays view their message's bytes, and may be written.
    for result, a, b in (
        (first, inline, inline),
        (second, inline + 1, inline),
        (third, past, past),
    ):
        out = outputs(result)
        assert not mapped(out["OUTPUT0"])
        np.testing.assert_array_equal(out["OUTPUT0"], a + b)
        np.testing.assert_array_equal(out["OUTPUT1"], a - b)
    out = outputs(first)["OUTPUT0"]
    assert out.flags.writeable
    out[0] = 42.0  # nothing else sees it
    assert outputs(second)["OUTPUT0"][0] == 1.0


@pytest.mark.anyio
async def test_bytes_tensors_travel_inline_too(start: Started) -> None:
    instance = start("identity_bytes")
    seen = where_tensors_go(instance)
    values = np.array([b"", b"a", "\u00e9t\u00e9".encode(), bytes(range(256))], dtype=np.object_)
    [result] = await instance.execute([request("identity_bytes", tensor("INPUT0", values))])
    assert [type(place) for place in seen["out"] + seen["back"]] == [bytearray, bytearray]
    assert outputs(result)["OUTPUT0"].tolist() == values.tolist()


def test_inline_bytes_are_viewed_where_they_are() -> None:
    """What `read_tensors` makes of inline bytes: views of the one bytearray, at each
    descriptor's offset (aligned as in a file), BYTES elements decoded from it."""
    a = np.arange(6, dtype=np.int16).reshape(2, 3)
    b = np.array([b"x", b"yz"], dtype=np.object_)
    place, descriptors = ipc.write_tensors("unused", [("A", a), ("B", b)], inline=1 << 10)
    assert isinstance(place, bytearray)
    assert [d[3] for d in descriptors] == [0, 64]  # B starts at the next 64-byte boundary
    (name_a, type_a, got_a), (name_b, type_b, got_b) = ipc.read_tensors(place, descriptors)
    assert (name_a, type_a, name_b, type_b) == ("A", "INT16", "B", "BYTES")
    np.testing.assert_array_equal(got_a, a)
    assert got_a.base is not None and got_b.tolist() == [b"x", b"yz"]
    got_a[0, 0] = 7
    assert np.frombuffer(place, np.int16, 1)[0] == 7  # a view, not a copy
    # Past the limit the same tensors go to a file of their own (no arena given).
    place, _ = ipc.write_tensors(f"test-inline-{os.getpid()}", [("A", a), ("B", b)], inline=64)
    assert isinstance(place, str) and not place.startswith("@")
    ipc.remove_file(place)
    ipc.remove_file(bytearray(b"inline"))  # nothing to unlink: no error


@pytest.mark.anyio
async def test_stub_exits_and_clears_its_files_when_the_server_side_closes(
    start: Started,
) -> None:
    instance = start("add_sub")
    ones = np.ones(ipc.INLINE_LIMIT // 4, dtype=np.float32)  # past the inline limit
    await instance.execute([add_sub(ones, ones)])  # both arenas exist now
    prefix = instance._stub.shm_prefix
    assert [f for f in os.listdir(ipc.SHM_DIR) if f.startswith(prefix)]
    # The stub's main thread is idle, reading its socket: it sees the end and exits (and the
    # server's reader, a thread here, sees the end too).
    instance._stub.channel.sock.shutdown(socket.SHUT_RDWR)
    instance._stub.answers.close()
    assert await anyio.to_thread.run_sync(instance._stub.process.wait, 60) == 0
    assert await anyio.to_thread.run_sync(instance._reader.done.wait, 60)
    assert not [f for f in os.listdir(ipc.SHM_DIR) if f.startswith(prefix)]


def test_a_received_request_is_built_like_one_the_model_builds() -> None:
    """The stub builds the requests execute() receives without the constructor's checks: they
    must carry the same state as a constructed one, with the server's values."""
    from tritonactor.backends.python import triton_python_backend_utils as pb_utils

    inputs = [pb_utils.Tensor._wrap("INPUT0", np.arange(3, dtype=np.int32))]
    entry = {
        "key": 7,
        "model_name": "m",
        "model_version": 2,
        "id": "r1",
        "correlation_id": 5,
        "flags": 1,
        "parameters": {"a": 1, "b": "x"},
        "outputs": ["OUT"],
    }
    sender = pb_utils.ResponseSender(7, False, frozenset(["OUT"]))
    trace = pb_utils.InferenceTrace(None, 7)
    received = pb_utils.InferenceRequest._received(entry, inputs, sender, trace)
    built = pb_utils.InferenceRequest(
        model_name="m",
        inputs=inputs,
        requested_output_names=["OUT"],
        model_version=2,
        request_id="r1",
        correlation_id=5,
        flags=1,
        parameters='{"a":1,"b":"x"}',
    )
    assert vars(received).keys() == vars(built).keys()
    for name in ("inputs", "request_id", "correlation_id", "flags", "timeout", "parameters"):
        assert getattr(received, name)() == getattr(built, name)(), name
    assert received.model_name() == "m" and received.model_version() == 2
    assert received.requested_output_names() == {"OUT"}
    assert received.get_response_sender() is sender and received.trace() is trace
    assert received.inputs()[0].as_numpy().tolist() == [0, 1, 2]
    # No parameters: "{}", as Triton's server writes them.
    empty = pb_utils.InferenceRequest._received({**entry, "parameters": {}}, [], sender, trace)
    assert empty.parameters() == "{}"


def test_the_end_of_a_channel_comes_after_every_message_sent_before_it() -> None:
    """What the stub sent just before it died (its last log line) is read before the end."""
    ours, theirs = socket.socketpair()
    sender = ipc.Channel(theirs)
    sender.send({"op": "log", "message": "first"})
    sender.send({"op": "log", "message": "last words"})
    sender.close()
    channel = ipc.Channel(ours)
    try:
        # A blocking read (the start-up wait for "ready") takes both off the socket at once.
        assert channel.recv() == {"op": "log", "message": "first"}
        assert channel.received() == [{"op": "log", "message": "last words"}]
        assert channel.received() is None
    finally:
        channel.close()


def test_messages_arrive_whole_and_in_order_however_the_reads_cut_them() -> None:
    """Many small messages in one read, and messages longer than a read (a message's end in a
    later read than its start), taken by `recv` and `received` in turns."""
    ours, theirs = socket.socketpair()
    sender = ipc.Channel(theirs)
    sizes = [10, 3, 700_000, 1, 0, 300_000, *range(200)]
    sent = [
        {"op": "log", "index": i, "data": bytes([i % 251]) * size} for i, size in enumerate(sizes)
    ]

    def send_all() -> None:
        for message in sent:
            sender.send(message)
        sender.close()

    writer = threading.Thread(target=send_all)
    writer.start()
    channel = ipc.Channel(ours)
    got: list[dict] = []
    try:
        while True:
            message = channel.recv()
            if message is None:
                break
            got.append(message)
            more = channel.received()
            if more is None:
                break
            got += more
    finally:
        writer.join()
        channel.close()
    assert got == sent


def test_a_message_larger_than_the_buffers_arrives_whole_from_a_non_blocking_socket() -> None:
    """The server's end of a stub's socket is non-blocking once its event loop polls it
    (uvloop's add_reader): a message larger than the socket's buffers is written in parts as
    the other side reads, and what follows it arrives intact (found with a 500 KB request id,
    which left the stub half a message and the model hung)."""
    ours, theirs = socket.socketpair()
    theirs.setblocking(False)  # as uvloop leaves the descriptor: sock.send may raise EAGAIN
    sender = ipc.Channel(theirs)
    big = {"op": "execute", "requests": [{"id": "x" * 3_000_000}]}
    after = {"op": "execute", "seq": 2}

    def send_both() -> None:
        sender.send(big)
        sender.send(after)

    writer = threading.Thread(target=send_both, daemon=True)
    writer.start()
    ours.settimeout(120)  # (a bound, not a wait: a half message must fail the test, not hang it)
    channel = ipc.Channel(ours)
    try:
        assert channel.recv() == big
        assert channel.recv() == after
    finally:
        writer.join()
        channel.close()
        sender.close()
