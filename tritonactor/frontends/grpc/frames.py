"""HTTP/2 frames as the lane reads and writes them (RFC 9113 §6): the frame types and flags it
names, a frame's header, and a HEADERS frame's header block read as hyperframe reads it.

The lane (lane.py) reads a unary call's frames beside h2, and its streams (lane_stream.py)
write the answer's: these are the pieces of the frame layout they use.
"""

from __future__ import annotations

from h2.connection import ConnectionInputs, ConnectionState, H2Connection
from h2.exceptions import ProtocolError

# Frame types and flags (RFC 9113 §6).
DATA, HEADERS, RST_STREAM, PUSH_PROMISE, WINDOW_UPDATE, CONTINUATION = 0, 1, 3, 5, 8, 9
END_STREAM, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x4, 0x8, 0x20
PREFACE = 24  # b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", read by h2
MAX_WINDOW = 2**31 - 1


def advance(h2: H2Connection, input_: ConnectionInputs) -> None:
    """What h2 does to its connection's state for a frame the lane sends or receives
    (`process_input`), with one of `LANE_INPUTS`, skipped where it changes nothing: on an open
    server connection each of those leaves the state as it is (h2's transitions from
    SERVER_OPEN, checked by tests/unit/test_grpc_lane.py). In any other state, h2's own step:
    it may close the connection, or refuse the frame (ProtocolError)."""
    machine = h2.state_machine
    if machine.state is not ConnectionState.SERVER_OPEN:
        machine.process_input(input_)


# The inputs the lane gives `advance` (an enum's hash is a Python call: not looked up per frame).
LANE_INPUTS = (
    ConnectionInputs.SEND_HEADERS,
    ConnectionInputs.SEND_DATA,
    ConnectionInputs.SEND_RST_STREAM,
    ConnectionInputs.RECV_HEADERS,
    ConnectionInputs.RECV_DATA,
    ConnectionInputs.RECV_WINDOW_UPDATE,
    ConnectionInputs.RECV_RST_STREAM,
)


def frame_header(length: int, kind: int, flags: int, stream_id: int) -> bytes:
    """A frame's 9-byte header."""
    return (length << 48 | kind << 40 | flags << 32 | stream_id).to_bytes(9, "big")


def header_block(payload: bytes | bytearray, flags: int) -> bytes | bytearray:
    """A HEADERS frame's header block, read as hyperframe reads it: the pad length, the
    priority fields, the block, the padding (a block the padding overlaps is empty)."""
    size, start, pad = len(payload), 0, 0
    if flags & PADDED:
        if not payload or payload[0] >= size:
            raise ProtocolError("Received frame with invalid padding.")
        start, pad = 1, payload[0]
    if flags & PRIORITY_FLAG:
        if size - start < 5:
            raise ProtocolError("Invalid HEADERS frame")
        start += 5
    return payload[start : size - pad] if start or pad else payload


def refuse_self_dependency(payload: bytes | bytearray, flags: int, stream_id: int) -> None:
    """A HEADERS frame's priority naming its own stream is a connection error (h2 checks it
    once it has read the block)."""
    if flags & PRIORITY_FLAG:
        start = 1 if flags & PADDED else 0
        if int.from_bytes(payload[start : start + 4], "big") & 0x7FFFFFFF == stream_id:
            raise ProtocolError(f"Stream {stream_id} may not depend on itself")


__all__ = [
    "CONTINUATION",
    "DATA",
    "END_HEADERS",
    "END_STREAM",
    "HEADERS",
    "MAX_WINDOW",
    "PADDED",
    "PREFACE",
    "PRIORITY_FLAG",
    "PUSH_PROMISE",
    "RST_STREAM",
    "WINDOW_UPDATE",
    "frame_header",
    "header_block",
    "refuse_self_dependency",
]
