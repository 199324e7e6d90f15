"""BYTES serialization, shared by the HTTP codec, gRPC and the Python backend's IPC."""

from __future__ import annotations

import numpy as np
import pytest

from tritonactor.core.datatypes import deserialize_bytes, from_numpy_dtype, serialize_bytes


def test_bytes_round_trip_with_empty_and_non_ascii_elements() -> None:
    data = np.array([b"", "héllo", b"\x00\xff"], dtype=np.object_)
    assert deserialize_bytes(serialize_bytes(data)).tolist() == [b"", "héllo".encode(), b"\x00\xff"]


def test_non_bytes_elements_are_serialized_as_their_text() -> None:
    # bytes(5) would be five zero bytes: a number travels as its text, as Triton's utils do.
    data = np.array([5, 2.5, "x"], dtype=np.object_)
    assert deserialize_bytes(serialize_bytes(data)).tolist() == [b"5", b"2.5", b"x"]


def test_malformed_bytes_and_unknown_dtypes_are_value_errors() -> None:
    with pytest.raises(ValueError, match="runs past the end"):
        deserialize_bytes(b"\x05\x00\x00\x00ab")
    with pytest.raises(ValueError, match="has no Triton data type"):
        from_numpy_dtype(np.dtype(np.complex64))


@pytest.mark.parametrize(
    "items",
    [
        [b"ab\x00", b"\x00cd"] * 20,  # many of one length (read by numpy), NULs kept
        [b""] * 40,
        [b"\x03\x00\x00\x00", b"abcd"] * 20,  # one length, elements that read as prefixes
        [b"x"],  # few (read one by one)
        [b"a", b"bb", b""] * 20,  # of several lengths (read one by one)
    ],
)
def test_bytes_elements_of_one_length_and_of_several(items: list[bytes]) -> None:
    buffer = serialize_bytes(np.array(items, dtype=np.object_))
    decoded = deserialize_bytes(memoryview(buffer), len(items))
    assert decoded.tolist() == items
    assert all(type(item) is bytes for item in decoded)
    for wrong in (len(items) - 1, len(items) + 1):
        with pytest.raises(ValueError, match="elements"):
            deserialize_bytes(buffer, wrong)


def test_too_many_bytes_elements_are_refused_before_they_are_made() -> None:
    buffer = serialize_bytes(np.array([b"a", b"bb"] * 1000, dtype=np.object_))
    with pytest.raises(
        ValueError, match="holds more than 3 elements, expected 3"
    ):  # read no further
        deserialize_bytes(buffer, 3)
    buffer = serialize_bytes(np.array([b"ab"] * 1000, dtype=np.object_))
    with pytest.raises(ValueError, match="holds 1000 elements, expected 3"):  # counted first
        deserialize_bytes(buffer, 3)
