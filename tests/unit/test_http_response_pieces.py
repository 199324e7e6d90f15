"""An HTTP infer response in pieces (frontends/http/responses.py, routes.py's `InferResponse`): an
output whose data already is a large `bytes` object of its own, or lies in a slot of the
engine's lane, is sent as it is, not copied into one body with the rest; the pieces are sent
one after another and make the same body."""

from __future__ import annotations

import mmap
from typing import Any

import numpy as np
import pytest

from tests.unit.test_http_codec import make_request, make_response, read_outputs, tensor_of
from tritonactor.core.datatypes import to_numpy_dtype
from tritonactor.core.types import InferenceResponse, RequestedOutput, Tensor
from tritonactor.engine import messages as m
from tritonactor.engine.frame_reader import FrameReader
from tritonactor.engine.lanes import Lane, LaneReader
from tritonactor.engine.wire import encode
from tritonactor.frontends.http import responses
from tritonactor.frontends.http.responses import SEND_AS_IS, encode_infer_response
from tritonactor.frontends.http.routes import InferResponse

pytestmark = pytest.mark.anyio

LARGE = SEND_AS_IS // 4  # FP32 elements


def from_bytes(values: np.ndarray) -> tuple[Tensor, bytes]:
    """A tensor as the lane's reader gives it: a view of a `bytes` object of its own."""
    data = values.astype(np.float32).tobytes()
    array = np.frombuffer(memoryview(data), np.float32).reshape(1, -1)
    return tensor_of("OUT", "FP32", array), data


def binary_request(*names: str) -> Any:
    return make_request(*(RequestedOutput(name, {"binary_data": True}) for name in names))


def test_a_large_output_of_its_own_bytes_is_sent_as_that_object() -> None:
    values = np.arange(LARGE, dtype=np.float32)
    tensor, data = from_bytes(values)

    body, header_length = encode_infer_response(make_response(tensor), binary_request("OUT"))

    assert isinstance(body, tuple) and len(body) == 2
    assert body[1] is data  # not a copy
    assert header_length == len(body[0])
    np.testing.assert_array_equal(read_outputs(b"".join(body), header_length)["OUT"][0], values)


def test_outputs_around_it_are_joined_with_what_is_next_to_them() -> None:
    small = tensor_of("A", "INT32", np.arange(6, dtype=np.int32).reshape(2, 3))
    big, data = from_bytes(np.arange(LARGE, dtype=np.float32))
    big = Tensor("B", big.datatype, big.shape, big.data)
    last = tensor_of("C", "FP32", np.full((3,), 2.5, np.float32))

    body, header_length = encode_infer_response(
        make_response(small, big, last), binary_request("A", "B", "C")
    )

    assert isinstance(body, tuple) and len(body) == 3
    assert body[1] is data
    assert len(body[0]) == header_length + 24 and len(body[2]) == 12
    outputs = read_outputs(b"".join(body), header_length)
    np.testing.assert_array_equal(outputs["A"], small.data)
    np.testing.assert_array_equal(outputs["B"], big.data)
    np.testing.assert_array_equal(outputs["C"], last.data)


@pytest.mark.parametrize(
    "case",
    ["owned by numpy", "smaller than SEND_AS_IS", "part of its bytes", "cast to FP32"],
)
def test_anything_else_is_one_body(case: str) -> None:
    values = np.arange(LARGE, dtype=np.float32)
    if case == "owned by numpy":
        array = values.reshape(1, -1)
    elif case == "smaller than SEND_AS_IS":
        values = values[: LARGE // 2]
        array = np.frombuffer(values.tobytes(), np.float32)
    elif case == "part of its bytes":
        array = np.frombuffer(b"\0" * 4 + values.tobytes(), np.float32, offset=4)
    else:  # a bytes object of FP64 values: the FP32 data is a new array
        array = np.frombuffer(values.astype(np.float64).tobytes(), np.float64)
    tensor = tensor_of("OUT", "FP32", array)

    body, header_length = encode_infer_response(make_response(tensor), binary_request("OUT"))

    assert type(body) is bytes
    np.testing.assert_array_equal(read_outputs(body, header_length)["OUT"].reshape(-1), values)


@pytest.mark.parametrize("datatype", ["FP32", "INT64", "FP64", "FP16", "BF16", "UINT8"])
def test_an_answer_taken_from_the_engines_lane_is_sent_from_the_slot(datatype: str) -> None:
    """The real way there: the engine's answer crosses in its lane, the front end reads it in
    place (engine/lanes.py), and the encoder sends a view of the slot, not a copy; the slot is
    released once the ASGI server (here: the body's last reference) lets go of it."""
    values = (np.arange(SEND_AS_IS, dtype=np.int64) % 200).astype(to_numpy_dtype(datatype))
    tensor = Tensor("OUT", datatype, (1, values.size), values.reshape(1, -1))
    lane, reader = Lane(), LaneReader()
    try:
        sent = encode(m.Answer(1, InferenceResponse("m", "1", outputs=[tensor])), lane)
        [answer] = FrameReader(reader).feed(b"".join(bytes(piece) for piece in sent))
        taken = answer.value.outputs[0].data

        body, header_length = encode_infer_response(answer.value, binary_request("OUT"))

        assert isinstance(body, tuple) and len(body) == 2
        piece = body[1]
        assert isinstance(piece, memoryview) and piece.readonly and piece.nbytes == taken.nbytes
        # the slot's memory itself, not a copy of it
        assert np.shares_memory(np.frombuffer(piece, np.uint8), taken)
        np.testing.assert_array_equal(
            read_outputs(b"".join(body), header_length)["OUT"].reshape(-1).view(np.uint8),
            values.view(np.uint8),
        )
        del answer, taken
        assert not reader.pop_taken()  # the body still views the slot
        del body, piece
        assert len(reader.pop_taken()) == 1
    finally:
        lane.close()
        reader.close()


def test_a_view_of_a_whole_bytes_object_in_another_order_is_not_that_object() -> None:
    data = bytes(range(256)) * (SEND_AS_IS // 256)
    reversed_view = np.frombuffer(data, np.uint8)[::-1]
    assert responses._as_is(np.frombuffer(data, np.uint8)) is data
    assert responses._as_is(reversed_view) is None


def test_memory_mapped_elsewhere_than_a_lane_is_joined() -> None:
    """Only a lane's slot promises to stay as it is while viewed: other mapped memory (a python
    model's shared memory, say) is copied into the body as before."""
    with mmap.mmap(-1, SEND_AS_IS) as mapping:
        array = np.frombuffer(mapping, np.uint8)
        assert responses._as_is(array) is None
        del array


async def test_the_pieces_are_sent_one_after_another_under_one_content_length() -> None:
    pieces = (b'{"h":1}', b"x" * SEND_AS_IS, b"yz")
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await InferResponse(pieces, 7)({"type": "http"}, None, send)  # type: ignore[arg-type]

    start, *bodies = sent
    headers = dict(start["headers"])
    assert headers[b"content-length"] == b"%d" % sum(map(len, pieces))
    assert headers[b"inference-header-content-length"] == b"7"
    assert [message["body"] for message in bodies] == list(pieces)
    assert bodies[1]["body"] is pieces[1]
    assert [message.get("more_body", False) for message in bodies] == [True, True, False]


async def test_one_piece_is_one_message() -> None:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await InferResponse(b'{"a":1}', None)({"type": "http"}, None, send)  # type: ignore[arg-type]

    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert sent[1] == {"type": "http.response.body", "body": b'{"a":1}'}
    assert dict(sent[0]["headers"])[b"content-length"] == b"7"
