"""The frames between a front-end process and the engine: what crosses, what stays behind."""

from __future__ import annotations

import ast
import pickle
from pathlib import Path

import numpy as np
import pytest

from tritonactor.core.errors import ErrorCode, TritonError, not_found, refused
from tritonactor.core.types import (
    InferenceRequest,
    InferenceResponse,
    RequestedOutput,
    ResponseSender,
    Tensor,
)
from tritonactor.engine import messages as m
from tritonactor.engine import wire
from tritonactor.engine.frame_reader import FrameReader
from tritonactor.engine.lanes import Lane, LaneReader
from tritonactor.engine.wire import HEADER, OUT_OF_BAND, TRACE_CROSSING, encode
from tritonactor.scheduling.first_response import FirstResponseHistogram


def cross(message: object) -> object:
    [received] = FrameReader().feed(b"".join(bytes(piece) for piece in encode(message)))
    return received


class Transport:
    """What an engine connection writes to, kept."""

    def __init__(self) -> None:
        self.written: list[bytes] = []

    def is_closing(self) -> bool:
        return False

    def write(self, data: bytes) -> None:
        self.written.append(bytes(data))

    def writelines(self, pieces: list[bytes]) -> None:
        self.written.append(b"".join(bytes(p) for p in pieces))


def request(*tensors: Tensor) -> InferenceRequest:
    return InferenceRequest(
        "m",
        "2",
        "id-1",
        list(tensors),
        [RequestedOutput("OUT", {"binary_data": True})],
        {"priority": 1, "flag": True, "name": "x", "ratio": 0.5},
        headers={"x-forwarded": "yes"},
    )


class _Trace:
    def crossing(self) -> tuple[object, ...]:
        return (0x1111, 0x2222, False, 1, (("vendor", "v"),))


def test_a_request_crosses_with_its_tensors_and_leaves_its_process_state_behind() -> None:
    small = Tensor("A", "FP32", (1, 4), np.arange(4, dtype=np.float32).reshape(1, 4))
    words = Tensor("B", "BYTES", (2,), np.array([b"ab", b"\x00c"], dtype=object))
    half = Tensor("C", "BF16", (3,), np.zeros(3, dtype=small.data.dtype).astype("bfloat16"))
    sent = request(small, words, half)
    sent.context["lease"] = object()
    sent.sender = ResponseSender(lambda *_: None)
    sent.trace = _Trace()  # type: ignore[assignment]
    received = cross(m.Submit(7, sent, streamed=True))
    assert isinstance(received, m.Submit)
    assert (received.id, received.streamed) == (7, True)
    got = received.request
    assert (got.model_name, got.model_version, got.id) == ("m", "2", "id-1")
    assert got.parameters == sent.parameters and got.headers == sent.headers
    assert [(o.name, o.parameters) for o in got.outputs] == [("OUT", {"binary_data": True})]
    for before, after in zip(sent.inputs, got.inputs, strict=True):
        assert (after.name, after.datatype, after.shape) == (
            before.name,
            before.datatype,
            before.shape,
        )
        assert after.data.dtype == before.data.dtype
        np.testing.assert_array_equal(after.data, before.data)
    # What only means something in the front end's process stays there.
    assert got.sender is None and got.trace is None
    assert got.context == {TRACE_CROSSING: _Trace().crossing()}


def _pickled(message: object) -> object:
    """What the frame of `message` pickles (how it crosses)."""
    [frame] = encode(message)
    length, count, _ = HEADER.unpack_from(frame)
    assert count == 0
    return pickle.loads(bytes(frame)[HEADER.size : HEADER.size + length])


@pytest.mark.parametrize(
    ("datatype", "data"),
    [
        ("FP32", np.arange(16, dtype=np.float32).reshape(1, 16)),
        ("BOOL", np.array([[True, False, True]])),
        ("INT64", np.arange(6, dtype=np.int64).reshape(2, 3)[:, ::2]),  # strided: its values
        ("BF16", np.arange(4, dtype=np.float32).astype("bfloat16").reshape(1, 4)),
        ("FP16", np.zeros((0, 4), dtype=np.float16)),
    ],
)
def test_a_plain_request_and_its_answer_cross_as_plain_values_and_come_out_whole(
    datatype: str, data: np.ndarray
) -> None:
    """A request with small tensors of numbers (every request perf_analyzer sends) crosses as
    a tuple of plain values, and so does its answer; either comes out as it went in, its
    process state left behind as with any request, its trace as its context's plain values."""
    sent = request(Tensor("A", datatype, data.shape, data, {"p": 1}))
    sent.resolved_version = 2
    sent.context["lease"] = object()
    sent.sender = ResponseSender(lambda *_: None)
    for streamed in (False, True):
        assert type(_pickled(m.Submit(4, sent, streamed))) is tuple
        received = cross(m.Submit(4, sent, streamed))
        assert isinstance(received, m.Submit) and (received.id, received.streamed) == (4, streamed)
        got = received.request
        assert (got.model_name, got.model_version, got.id, got.resolved_version) == (
            "m",
            "2",
            "id-1",
            2,
        )
        assert got.parameters == sent.parameters and got.headers == sent.headers
        assert got.outputs == sent.outputs and not got.cancelled
        assert got.context == {} and got.sender is None and got.trace is None
        [tensor] = got.inputs
        assert (tensor.name, tensor.datatype, tensor.shape, tensor.parameters) == (
            "A",
            datatype,
            data.shape,
            {"p": 1},
        )
        assert tensor.data.dtype == data.dtype and tensor.data.shape == data.shape
        np.testing.assert_array_equal(tensor.data, data)
    sent.cancelled = True
    assert cross(m.Submit(5, sent)).request.cancelled  # type: ignore[attr-defined]
    sent.trace = _Trace()  # type: ignore[assignment]
    assert type(_pickled(m.Submit(6, sent))) is tuple
    traced = cross(m.Submit(6, sent)).request  # type: ignore[attr-defined]
    assert traced.context == {TRACE_CROSSING: _Trace().crossing()} and traced.trace is None

    response = InferenceResponse(
        "m", "3", "r", [Tensor("O", datatype, data.shape, data)], {"q": "x"}
    )
    answer = m.Answer(6, response, ((1, 2), (3, 4)))
    assert type(_pickled(answer)) is tuple
    back = cross(answer)
    assert isinstance(back, m.Answer) and (back.id, back.links) == (6, ((1, 2), (3, 4)))
    assert (back.value.model_name, back.value.model_version, back.value.id) == ("m", "3", "r")
    assert back.value.parameters == {"q": "x"}
    [out] = back.value.outputs
    assert (out.name, out.datatype, out.shape, out.data.dtype) == (
        "O",
        datatype,
        data.shape,
        data.dtype,
    )
    np.testing.assert_array_equal(out.data, data)


def test_a_tensors_shape_and_its_datas_shape_cross_as_they_are_both_ways() -> None:
    """A 0-d tensor stays 0-d, and a tensor whose data is shaped otherwise than it says keeps
    both, whether its message crosses as plain values or (with BYTES beside it) as itself; data
    of another type than the datatype's crosses as itself, its type kept."""
    scalar = Tensor("Z", "FP32", (), np.array(3.5, dtype=np.float32))
    flat = Tensor("F", "FP32", (1, 4), np.arange(4, dtype=np.float32))
    words = Tensor("B", "BYTES", (1,), np.array([b"x"], dtype=object))
    for tensors in ((scalar, flat), (scalar, flat, words)):
        got = cross(m.Submit(1, request(*tensors))).request.inputs  # type: ignore[attr-defined]
        assert [(t.shape, t.data.shape) for t in got[:2]] == [((), ()), ((1, 4), (4,))]
        assert float(got[0].data) == 3.5
    other = Tensor("I", "FP32", (2,), np.array([1, 2], dtype=np.int64))
    assert type(_pickled(m.Submit(2, request(other)))) is not tuple
    [got] = cross(m.Submit(2, request(other))).request.inputs  # type: ignore[attr-defined]
    assert got.data.dtype == np.int64 and got.data.tolist() == [1, 2]


def test_what_is_not_plain_crosses_as_itself() -> None:
    """BYTES, a large tensor, an answer that is no response: each crosses as its own objects
    (the frame pickles no tuple), and still comes out whole."""
    small = Tensor("A", "FP32", (1, 2), np.ones((1, 2), dtype=np.float32))
    words = Tensor("B", "BYTES", (1,), np.array([b"x"], dtype=object))
    for message in (
        m.Submit(2, request(small, words)),
        m.Answer(3, None),
        m.Answer(4, ("a", 1)),
    ):
        assert type(_pickled(message)) is not tuple
        assert type(cross(message)) is type(message)
    large = np.zeros((1, OUT_OF_BAND // 4), dtype=np.float32)
    assert len(encode(m.Submit(5, request(Tensor("L", "FP32", large.shape, large))))) > 1


def test_a_large_tensor_travels_out_of_band_and_arrives_whole() -> None:
    data = np.random.default_rng(0).random((2, OUT_OF_BAND // 4), dtype=np.float32)
    response = InferenceResponse("m", "1", "", [Tensor("OUT", "FP32", data.shape, data)])
    pieces = encode(m.Answer(3, response, ((1, 2),)))
    assert len(pieces) == 4  # header + pickle, then the buffer's length and the buffer itself
    assert sum(len(bytes(p)) for p in pieces[2:]) >= data.nbytes
    received = cross(m.Answer(3, response, ((1, 2),)))
    assert isinstance(received, m.Answer) and received.links == ((1, 2),)
    np.testing.assert_array_equal(received.value.outputs[0].data, data)


def test_a_strided_view_crosses_as_its_values() -> None:
    base = np.arange(32, dtype=np.int32).reshape(4, 8)
    view = base[:, ::2]
    received = cross(
        m.Answer(1, InferenceResponse("m", "1", outputs=[Tensor("O", "INT32", (4, 4), view)]))
    )
    np.testing.assert_array_equal(received.value.outputs[0].data, view)  # type: ignore[attr-defined]


def test_errors_keep_their_code_and_message() -> None:
    received = cross(m.Failed(5, not_found("no such model 'm'")))
    assert isinstance(received, m.Failed)
    assert (received.error.code, received.error.message) == (
        ErrorCode.NOT_FOUND,
        "no such model 'm'",
    )
    assert isinstance(received.error, TritonError)
    assert not received.error.refused
    refusal = cross(m.Failed(6, refused(not_found("full"))))
    assert isinstance(refusal, m.Failed) and refusal.error.refused  # a scheduler's refusal


def test_statistics_cross_with_their_histogram() -> None:
    histogram = FirstResponseHistogram()
    histogram.observe_ns(3_000_000_000)
    received = cross(m.Answer(1, histogram))
    assert isinstance(received, m.Answer)
    assert received.value._counts == histogram._counts


def test_frames_split_anywhere_come_out_whole_and_in_order() -> None:
    messages = [m.Call(i, "index", (True,)) for i in range(5)]
    stream = b"".join(bytes(piece) for message in messages for piece in encode(message))
    reader = FrameReader()
    out: list[object] = []
    for start in range(0, len(stream), 7):
        out.extend(reader.feed(stream[start : start + 7]))
    assert out == messages


def _answer(index: int, elements: int) -> m.Answer:
    data = np.full((1, elements), index, dtype=np.float32)
    return m.Answer(
        index, InferenceResponse("m", "1", "", [Tensor("OUT", "FP32", data.shape, data)])
    )


@pytest.mark.parametrize("chunk", [1 << 20, 65_536, 4_093, 7])
def test_large_and_small_frames_read_as_a_socket_reads_them_stay_intact(chunk: int) -> None:
    """Read as a buffered protocol is read (into `get_buffer`, however much the socket
    gives): a large tensor arrives in memory of its own, read-only, and stays as it was while
    the frames after it reuse the reader's buffer; a frame larger than that buffer without
    out-of-band buffers (BYTES) grows it."""
    sizes = [OUT_OF_BAND, 16, 3 * OUT_OF_BAND + 5, 1, 300_000, 16, OUT_OF_BAND // 4 - 1]
    messages: list[object] = [_answer(i, n) for i, n in enumerate(sizes)]
    words = np.array([bytes([i % 256]) * 1000 for i in range(600)], dtype=object)
    messages.insert(
        3, m.Answer(99, InferenceResponse("m", "1", "", [Tensor("W", "BYTES", (600,), words)]))
    )
    stream = memoryview(b"".join(bytes(piece) for message in messages for piece in encode(message)))
    reader = FrameReader()
    received: list[object] = []
    while stream:
        with reader.get_buffer(-1) as target:
            taken = min(len(target), len(stream), chunk)
            target[:taken] = stream[:taken]
        received += reader.buffer_updated(taken)
        stream = stream[taken:]
    assert [answer.id for answer in received] == [answer.id for answer in messages]
    for sent, got in zip(messages, received, strict=True):
        before, after = sent.value.outputs[0].data, got.value.outputs[0].data
        np.testing.assert_array_equal(after, before)
        if before.dtype != object and before.nbytes >= OUT_OF_BAND:
            assert not after.flags.writeable


def test_a_frame_that_does_not_unpickle_raises() -> None:
    garbage = b"\xff" * 5
    frame = HEADER.pack(len(garbage), 0, 0) + garbage
    with pytest.raises(pickle.UnpicklingError):  # the engine closes such a connection
        FrameReader().feed(frame)


def test_an_answer_that_does_not_encode_fails_its_request() -> None:
    from tritonactor.engine.host import _Connection

    connection = _Connection.__new__(_Connection)
    connection._lane = Lane()
    connection._lanes = LaneReader()
    connection._regions = None  # type: ignore[assignment]
    transport = Transport()
    connection._transport = transport  # type: ignore[assignment]
    connection.send(m.Answer(8, InferenceResponse("m", "1")))  # (it encodes)
    unpicklable = InferenceResponse("m", "1", parameters={"x": lambda: None})  # type: ignore[dict-item]
    connection.send(m.Answer(9, unpicklable))
    answered, failed = FrameReader().feed(b"".join(transport.written))
    assert isinstance(answered, m.Answer) and answered.id == 8
    assert isinstance(failed, m.Failed) and failed.id == 9
    assert failed.error.code is ErrorCode.INTERNAL
    assert "could not be sent" in failed.error.message and "lambda" in failed.error.message


# The frame layout: a module that reads or writes frames with it defines the protocol.
_LAYOUT = {"HEADER", "LENGTH", "IN_LANE", "IN_REGION", "_LANE_FLAG", "_REGION_FLAG", "_unflat"}


def test_every_module_that_reads_or_writes_frames_is_in_the_protocols_digest() -> None:
    # A front end and an engine whose frames differ must refuse each other (`wire.PROTOCOL`),
    # so every engine module that takes the frame layout from wire.py is in its digest.
    folder = Path(wire.__file__).parent
    users = set()
    for path in folder.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.ImportFrom)
                and node.module == "tritonactor.engine.wire"
                and _LAYOUT & {alias.name for alias in node.names}
            ):
                users.add(path.name)
    assert "frame_reader.py" in users  # (the scan finds what it looks for)
    assert users | {"wire.py", "messages.py"} <= set(wire.PROTOCOL_MODULES)
