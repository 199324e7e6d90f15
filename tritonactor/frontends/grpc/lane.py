"""Unary calls read and answered beside h2: the HTTP/2 frames of a unary call taken without h2's
state machines.

h2 (Python) spends ~80 µs of a unary call reading its HEADERS and DATA frames and writing its
answer's three frames, most of it in objects made per frame and per stream (frames, flags,
events, a stream with its own state machine and window managers), where the call itself needs a
few slices of bytes. A connection's `Lane` reads the frames arriving on it. A HEADERS frame
that opens a new stream (its block whole, END_HEADERS) is read here: its header block decoded
once, with the connection's HPACK decoder (a block read before, the table unchanged since, is
not decoded again: a gRPC client sends the same block with every call; hpack_cache.py). A call
of a unary-unary method is then the lane's: its frames go to a `LaneStream`, a
`grpclib.protocol.Stream` that reads and writes them itself, and the call goes to grpclib's
request handler (a ModelInfer call that `direct` takes is answered by direct.py). Any other (a
streaming method, a method no one serves, a request h2 checks further) is h2's, and the decoder
hands h2 the headers it decoded, so that the block's changes to the table are made once. Every
other frame goes to h2, in the order it came, so h2 still owns the connection (settings, pings,
GOAWAY, the connection's flow-control windows, HPACK) and every other stream; but for a
WINDOW_UPDATE of the connection's window, which a client sends after each answer it reads: the
lane grows h2's window and tells grpclib's streams, as h2 and grpclib do (h2 took ~20 µs a call
for it), and hands h2 one that h2 refuses, or one that follows frames of h2's in the same read
(h2 reads those together). What h2 keeps for the connection, the lane keeps in step: the
highest stream id opened (GOAWAY names it), the connection's windows both ways, the streams it
closed (`_closed_streams`: h2 then answers a late frame on one as it would on its own), the
connection state machine's inputs; and a lane stream counts against the concurrent streams h2
allows.

What a lane stream does not take is left to h2's rules as h2 applies them: a frame on a stream
the lane closed goes to h2, which knows it closed. A lane stream takes DATA, RST_STREAM,
WINDOW_UPDATE and a last HEADERS (trailers, END_STREAM and END_HEADERS set); a frame of another
type goes to h2 (PRIORITY needs no stream there); request trailers split over CONTINUATION
frames, which no gRPC client sends, are refused as a connection error. After a frame longer than
h2 allows, every byte is h2's (h2 reads them as that frame's body until it has it all, then
ends the connection). grpclib's keepalive pings (every 2 hours by default, while a call is
open) look for calls among h2's streams: connection.py shows them the lane's too.

tests/unit/test_grpc_lane.py feeds the same frames to a connection with and without the lane
and compares what the two send back and what reaches grpclib.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from grpclib.protocol import Buffer, Connection, EventsProcessor, Stream
from h2.connection import ConnectionInputs, ConnectionState, H2Connection, _decode_headers
from h2.errors import ErrorCodes
from h2.events import RemoteSettingsChanged, SettingsAcknowledged, WindowUpdated
from h2.exceptions import (
    FlowControlError,
    ProtocolError,
    StreamClosedError,
    TooManyStreamsError,
)
from h2.settings import SettingCodes
from h2.stream import StreamClosedBy
from h2.utilities import guard_increment_window, is_informational_response

from tritonactor.frontends.grpc.hpack_cache import KEPT_BYTES, keep

if TYPE_CHECKING:
    from grpclib.server import Handler

# Frame types and flags (RFC 9113 §6).
DATA, HEADERS, RST_STREAM, PUSH_PROMISE, WINDOW_UPDATE, CONTINUATION = 0, 1, 3, 5, 8, 9
LANE_FRAMES = (DATA, HEADERS, RST_STREAM, WINDOW_UPDATE)  # a lane stream's; the rest are h2's
# Headers of a request h2 checks further (a body held to its length; a status, which a request
# has none of): such a call is h2's.
H2_CHECKS = frozenset({"content-length", ":status"})
END_STREAM, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x4, 0x8, 0x20
PREFACE = 24  # b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", read by h2
MAX_WINDOW = 2**31 - 1


def frame_header(length: int, kind: int, flags: int, stream_id: int) -> bytes:
    return (length << 48 | kind << 40 | flags << 32 | stream_id).to_bytes(9, "big")


class DirectCalls(Protocol):
    """Calls answered without grpclib's request handler (direct.py's `DirectInfer`)."""

    def accept(
        self,
        handler: Handler,
        stream: LaneStream,
        headers: list[tuple[str, str]],
        release: Callable[[], Any],
    ) -> bool:
        """Take the call `headers` open on `stream` (False: grpclib's handler takes it)."""
        ...


class Lane:
    """A connection's frames, read once: unary calls to `LaneStream`s, the rest to h2."""

    def __init__(
        self,
        h2: H2Connection,
        connection: Connection,
        processor: EventsProcessor,
        handler: Handler,
        unary: frozenset[str],
        direct: DirectCalls | None = None,
    ) -> None:
        self.h2 = h2
        self.connection = connection
        self.processor = processor
        self.handler = handler
        self.unary = unary
        self.direct = direct  # ModelInfer calls it takes (direct.py); the rest are grpclib's
        self.streams: dict[int, LaneStream] = {}
        self._buffer = bytearray()  # a frame not yet whole (grown in place as it comes)
        self._preface = PREFACE
        self._h2_block = False  # h2 holds a header block waiting for its CONTINUATION frames
        self._h2_only = False  # h2 holds a frame past its size limit: every byte is h2's now
        self._headers: dict[tuple[Any, ...], list[tuple[str, str]] | None] = {}

    def feed(self, data: bytes) -> None:
        """Take what the connection read: raises h2's ProtocolError where h2 would (the
        connection is then terminated, as h2 terminates it)."""
        if self._h2_only:
            self._to_h2(data)
            return
        if self._preface:
            taken = data[: self._preface]
            self._preface -= len(taken)
            self._to_h2(taken)
            data = data[len(taken) :]
        if self._buffer:
            self._buffer += data
            buffer: bytes | bytearray = self._buffer
        else:
            buffer = data
        end = len(buffer)
        position = start = 0  # start: where the frames for h2 not yet given to it begin
        streams = self.streams
        try:
            while end - position >= 9:
                head = int.from_bytes(buffer[position : position + 9], "big")
                length = head >> 48
                if length > self.h2.max_inbound_frame_size:
                    # h2 refuses it once it has all of it, and until then reads every byte
                    # after its header as its body: from here on, every byte is h2's
                    self._h2_only = True
                    position = end
                    break
                after = position + 9 + length
                if after > end:
                    break
                kind = head >> 40 & 0xFF
                flags = head >> 32 & 0xFF
                stream_id = head & 0x7FFFFFFF
                if not self._h2_block:
                    stream = streams.get(stream_id)
                    if stream is not None and kind in LANE_FRAMES:
                        if start < position:
                            self._to_h2(buffer[start:position])
                        start = after
                        self._stream_frame(stream, kind, flags, buffer[position + 9 : after])
                        position = after
                        continue
                    if (
                        kind == WINDOW_UPDATE
                        and not stream_id
                        and length == 4
                        and start == position
                    ):
                        # the connection's window (a client gives it back after each answer);
                        # one after frames of h2's in the same read is h2's, with them (h2
                        # reads a read's frames together: a GOAWAY, then this, say)
                        if self._window_update(int.from_bytes(buffer[position + 9 : after], "big")):
                            start = after
                        position = after
                        continue
                    if kind == HEADERS and stream_id & 1 and stream is None:
                        # h2 reads what came before first: it may change the HPACK table,
                        # the highest stream id, the connection's state
                        if start < position:
                            self._to_h2(buffer[start:position])
                            start = position
                        if stream_id > self.h2.highest_inbound_stream_id:
                            # h2's first check, before it reads the block (a stream it opens
                            # counts the lane's too)
                            self._check_limit()
                        if self._opens(stream_id, flags):
                            payload = bytes(buffer[position + 9 : after])
                            headers = self._known(_header_block(payload, flags))
                            if headers is not None:
                                start = after
                                self._open(stream_id, headers, payload, flags)
                                position = after
                                continue
                if kind in (HEADERS, PUSH_PROMISE, CONTINUATION):
                    self._h2_block = not flags & END_HEADERS
                position = after
            if start < position:
                self._to_h2(buffer[start:position])
        finally:
            # a block handed over went to h2 in this feed (or the connection ends): none is left
            self.h2.decoder.hand_back()
            if position == end:
                self._buffer = bytearray()
            elif position or buffer is not self._buffer:
                self._buffer = bytearray(buffer[position:])

    def _window_update(self, increment: int) -> bool:
        """A WINDOW_UPDATE of the connection's window, taken as h2 takes it (the window grown,
        grpclib's streams told); False where h2 refuses it (an increment of 0 or past the
        largest window, the reserved bit set), to let h2 answer it."""
        h2 = self.h2
        # (the window is never below 0: nothing is sent past it, h2 asserts it)
        if not 1 <= increment <= MAX_WINDOW - h2.outbound_flow_control_window:
            return False
        h2.state_machine.process_input(ConnectionInputs.RECV_WINDOW_UPDATE)
        h2.outbound_flow_control_window += increment
        self.processor.process(WindowUpdated(stream_id=0, delta=increment))
        # (as grpclib after each read: what h2 holds, a reset made while writes were paused)
        self.connection.flush()
        return True

    def _opens(self, stream_id: int, flags: int) -> bool:
        """Whether a HEADERS frame on `stream_id` opens a stream the lane may take."""
        h2 = self.h2
        return (
            flags & (END_HEADERS | END_STREAM) == END_HEADERS
            and stream_id > h2.highest_inbound_stream_id
            and h2.state_machine.state in (ConnectionState.IDLE, ConnectionState.SERVER_OPEN)
        )

    def _known(self, block: bytes) -> list[tuple[str, str]] | None:
        """The headers of `block`, read here, where they open a call of a unary method; None
        otherwise, and the frame is then h2's: the decoder hands h2 what it read (reading
        a block may change the HPACK table: it is read once). A block read before, the table
        unchanged since, is not read again (hpack_cache.py)."""
        decoder = self.h2.decoder
        generation = decoder.header_table.generation
        key = (block, generation, decoder.max_header_list_size, decoder.max_allowed_table_size)
        headers = self._headers.get(key, False)
        if headers is not False:  # read before, under this table: its reading changed nothing
            # (h2 reads one not the lane's again, as hpack_cache.py keeps its result)
            return None if headers is None else list(headers)
        raw = list(_decode_headers(decoder, block))  # a ProtocolError as h2 raises it
        try:
            named = [(n.decode("ascii"), v.decode("ascii")) for n, v, *_ in raw]
        except UnicodeDecodeError:
            named = None
        fields = dict(named or ())
        headers = None
        if fields.get(":path") in self.unary and not fields.keys() & H2_CHECKS:
            headers = named
        else:
            decoder.hand_over(block, raw)
        # kept where it can be found again (its reading changed nothing) and as hpack_cache.py
        # keeps blocks (a client cannot make a connection hold much)
        if decoder.header_table.generation == generation and len(block) <= KEPT_BYTES:
            keep(self._headers, key, headers)
        return None if headers is None else list(headers)

    def _check_limit(self) -> None:
        """h2's limit of concurrent streams, counted over its streams and the lane's."""
        h2 = self.h2
        limit = h2.local_settings.max_concurrent_streams
        opened = len(self.streams) + h2.open_inbound_streams
        if opened + 1 > limit:
            raise TooManyStreamsError(f"Max inbound streams is {limit}, {opened} open")

    def _open(
        self, stream_id: int, headers: list[tuple[str, str]], payload: bytes, flags: int
    ) -> None:
        h2 = self.h2
        h2.state_machine.process_input(ConnectionInputs.RECV_HEADERS)
        h2.highest_inbound_stream_id = stream_id
        _refuse_self_dependency(payload, flags, stream_id)  # (h2 has opened it by then)
        stream = LaneStream(self, stream_id)
        self.streams[stream_id] = stream
        release = self.processor.register(stream)
        handler, direct = self.handler, self.direct
        if direct is None or not direct.accept(handler, stream, headers, release):
            handler.accept(stream, headers, release)

    def _stream_frame(
        self, stream: LaneStream, kind: int, flags: int, payload: bytes | bytearray
    ) -> None:
        h2 = self.h2
        if kind == DATA:
            size = len(payload)
            if flags & PADDED:  # (checked as h2 reads the frame, before anything counts it)
                pad = payload[0] if payload else size
                if pad >= size:
                    raise ProtocolError("Received frame with invalid padding.")
                payload = payload[1 : size - pad]
            h2.state_machine.process_input(ConnectionInputs.RECV_DATA)
            h2._inbound_flow_control_window_manager.window_consumed(size)
            stream.receive_data(payload, size, bool(flags & END_STREAM))
        elif kind == WINDOW_UPDATE:
            increment = int.from_bytes(payload, "big") if len(payload) == 4 else 0
            if not 1 <= increment <= MAX_WINDOW:  # h2 refuses it, before it looks for the stream
                self._to_h2(frame_header(len(payload), kind, flags, stream.id) + payload)
                return
            h2.state_machine.process_input(ConnectionInputs.RECV_WINDOW_UPDATE)
            stream.receive_window_update(increment)
        elif kind == RST_STREAM:
            if len(payload) != 4:
                raise ProtocolError("Invalid RST_STREAM frame")
            h2.state_machine.process_input(ConnectionInputs.RECV_RST_STREAM)
            stream.receive_reset(int.from_bytes(payload, "big"))
        elif (
            kind == HEADERS and flags & END_HEADERS and (flags & END_STREAM or stream.remote_closed)
        ):
            # trailers; or headers on a stream the peer ended (a stream error, once read)
            h2.state_machine.process_input(ConnectionInputs.RECV_HEADERS)
            raw = _decode_headers(h2.decoder, _header_block(payload, flags))
            if stream.remote_closed:  # refused before they are read as text, as h2 does
                stream.receive_trailers([])
                return
            if is_informational_response(raw):  # as h2's stream refuses them
                raise ProtocolError("Cannot set END_STREAM on informational responses")
            for name, value, *_ in raw:
                if name == b"content-length" and not value.isdigit():
                    raise ProtocolError(f"Invalid content-length header: {value!r}")
            try:
                trailers = [(n.decode("ascii"), v.decode("ascii")) for n, v, *_ in raw]
            except UnicodeDecodeError as error:
                # ("ascii": grpclib's encoding; h2 lets the error out of the protocol, and
                # asyncio closes the connection with a traceback in the log)
                raise ProtocolError(f"Error decoding header block: {error}") from error
            _refuse_self_dependency(payload, flags, stream.id)
            stream.receive_trailers(trailers)
        else:
            raise ProtocolError(f"Frame of type {kind} on unary stream {stream.id}")

    def _to_h2(self, data: bytes | bytearray) -> None:
        """h2's frames, and what it asks to send; its events to grpclib, as grpclib's
        protocol does. A change of the initial window size reaches the lane's streams as h2
        applies it to its own: the peer's (its SETTINGS) to what they may send, ours (once
        the peer acknowledges it) to what they may receive."""
        if self.connection.is_closing():  # grpclib closed it (and let go of h2's dispatch)
            return
        h2 = self.h2
        events = h2.receive_data(data)
        self.connection.flush()
        for event in events:
            kind = event.__class__
            if kind is RemoteSettingsChanged or kind is SettingsAcknowledged:
                changed = event.changed_settings.get(SettingCodes.INITIAL_WINDOW_SIZE)
                if changed is not None and self.streams:
                    delta = changed.new_value - (changed.original_value or 0)
                    for stream in self.streams.values():
                        if kind is RemoteSettingsChanged:
                            stream.window = guard_increment_window(stream.window, delta)
                        else:
                            stream._inbound += delta
            self.processor.process(event)
        self.connection.flush()

    def write(self, frames: bytes) -> None:
        """`frames` to the socket, after what h2 has to send."""
        pending = self.h2.data_to_send()
        self.connection._transport.write(pending + frames if pending else frames)

    def ack_connection(self, size: int) -> None:
        """`size` bytes read: their share of the connection's window back, by h2's count."""
        increment = self.h2._inbound_flow_control_window_manager.process_bytes(size)
        if increment:
            self.write(frame_header(4, WINDOW_UPDATE, 0, 0) + increment.to_bytes(4, "big"))

    def close(self) -> None:
        """The connection is gone: let go of what the lane holds (grpclib breaks its own
        connection's cycles at its close, so that it is freed without the cyclic collector)."""
        self.streams.clear()
        self._buffer = bytearray()
        self._headers.clear()

    def closed(self, stream: LaneStream, by: StreamClosedBy) -> None:
        """`stream` closed: h2 answers its late frames as it answers its own streams'."""
        if self.streams.pop(stream.id, None) is not None:
            self.h2._closed_streams[stream.id] = by


def _header_block(payload: bytes | bytearray, flags: int) -> bytes | bytearray:
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


def _refuse_self_dependency(payload: bytes | bytearray, flags: int, stream_id: int) -> None:
    """A HEADERS frame's priority naming its own stream is a connection error (h2 checks it
    once it has read the block)."""
    if flags & PRIORITY_FLAG:
        start = 1 if flags & PADDED else 0
        if int.from_bytes(payload[start : start + 4], "big") & 0x7FFFFFFF == stream_id:
            raise ProtocolError(f"Stream {stream_id} may not depend on itself")


class LaneStream(Stream):
    """A unary call's stream, its frames read and written by its connection's `Lane`."""

    def __init__(self, lane: Lane, stream_id: int) -> None:
        self.lane = lane  # (before grpclib's init, which makes the stream's buffer)
        connection = lane.connection
        super().__init__(connection, lane.h2, connection._transport, stream_id=stream_id)
        h2 = lane.h2
        self.window = h2.remote_settings.initial_window_size  # ours to send
        self._inbound = h2.local_settings.initial_window_size  # the peer's to send
        self._unacked = 0
        self.remote_closed = self.local_closed = self.reset_done = False

    def init_stream(self, stream_id: int, connection: Connection) -> None:
        # grpclib's, but for the buffer, made once: it acks through the lane, as grpclib's
        # acks through the connection (the stream is then freed when its call lets it go, not
        # by the cyclic collector)
        self.id = stream_id
        self.buffer = Buffer(functools.partial(self.lane_ack, self.lane, stream_id))
        connection.streams_started += 1
        self.created = connection.last_stream_created = time.monotonic()

    def released(self, release: Callable[[], Any], _task: object) -> None:
        """The call's task is done: its stream let go, if the call has not (a reset in the
        same read as the call's HEADERS cancels the task before its first step)."""
        if self.lane.processor.streams.get(self.id) is self:
            release()

    @staticmethod
    def lane_ack(lane: Lane, stream_id: int, size: int) -> None:
        stream = lane.streams.get(stream_id)
        if stream is not None:
            stream._ack(size)
        elif size and not lane.connection.is_closing():  # closed: the connection's window
            lane.ack_connection(size)

    # frames received (from the lane)

    def receive_data(self, data: bytes, size: int, end: bool) -> None:
        if self.remote_closed:  # h2: STREAM_CLOSED, the data's window handed back
            self.lane.ack_connection(size)
            self._reset_now(ErrorCodes.STREAM_CLOSED)
            return
        self._inbound -= size
        if self._inbound < 0:
            raise FlowControlError(f"Flow control window exceeded on stream {self.id}")
        if self.id not in self.lane.processor.streams:
            # the call let its stream go: no one reads it, its window goes back at once, as
            # grpclib gives back data for a stream it does not know
            self.lane.ack_connection(size)
            if end:
                self._remote_end()
            return
        self.buffer.add(data, size)
        self.data_received += len(data)
        connection = self.connection
        connection.data_received += len(data)
        connection.last_data_received = time.monotonic()
        if end:
            self._remote_end()

    def receive_trailers(self, headers: list[tuple[str, str]]) -> None:
        if self.remote_closed:
            self._reset_now(ErrorCodes.STREAM_CLOSED)
            return
        self.trailers = headers
        self.trailers_received.set()
        self._remote_end()

    def _remote_end(self) -> None:
        self.remote_closed = True
        self.__ended__()
        self.connection.streams_succeeded += 1
        if self.local_closed:
            self.lane.closed(self, StreamClosedBy.RECV_END_STREAM)

    def receive_window_update(self, increment: int) -> None:
        if self.window + increment > MAX_WINDOW:
            self._reset_now(ErrorCodes.FLOW_CONTROL_ERROR)
            return
        self.window += increment
        self.window_updated.set()

    def receive_reset(self, error_code: int) -> None:
        self.lane.closed(self, StreamClosedBy.RECV_RST_STREAM)
        self.reset_done = True
        try:
            code: Any = ErrorCodes(error_code)
        except ValueError:
            code = error_code
        self.__terminated__(f"Stream reset by remote party, error_code: {code}")
        self._cancel_call()
        self.connection.streams_failed += 1

    def _cancel_call(self) -> None:
        """grpclib's cancel of the call's task (which it may have let go once done); the
        stream is let go when the task ends, if the call has not."""
        handler = self.lane.handler
        task = getattr(handler, "_tasks", {}).get(self)
        if task is not None:
            if self.lane.processor.streams.get(self.id) is self:
                # grpclib's release of this stream (registered again: the same entry)
                release = self.lane.processor.register(self)
                task.add_done_callback(functools.partial(self.released, release))
            handler.cancel(self)

    def _reset_now(self, code: ErrorCodes) -> None:
        """A stream error found in what was received: reset, and the call ends as grpclib ends
        it on h2's reset."""
        self.reset_nowait(code, now=True)
        self.__terminated__("Protocol error")
        self._cancel_call()
        self.connection.streams_failed += 1

    # flow control of what is received

    def _ack(self, size: int) -> None:
        """The call read `size` bytes: their window goes back to the peer (the connection's by
        h2's manager; the stream's while the peer may still send on it)."""
        if not size or self.connection.is_closing():
            return
        self.lane.ack_connection(size)
        if self.remote_closed:
            return
        self._unacked += size
        if self._unacked * 2 >= self.lane.h2.local_settings.initial_window_size:
            increment, self._unacked = self._unacked, 0
            self._inbound += increment
            self._write(frame_header(4, WINDOW_UPDATE, 0, self.id) + increment.to_bytes(4, "big"))

    # frames sent (grpclib's Stream API)

    @property
    def closable(self) -> bool:
        if self._transport.is_closing():
            return False
        if self.lane.h2.state_machine.state is ConnectionState.CLOSED:
            return False
        return self.id in self.lane.streams

    def check_open(self) -> None:
        if self.local_closed or self.reset_done or self.id not in self.lane.streams:
            raise StreamClosedError(self.id)

    def _headers_frames(self, headers: Any, end_stream: bool) -> bytes:
        h2 = self.lane.h2
        h2.state_machine.process_input(ConnectionInputs.SEND_HEADERS)
        block = h2.encoder.encode(headers)
        size = h2.max_outbound_frame_size
        flags = END_STREAM if end_stream else 0
        if len(block) <= size:
            return frame_header(len(block), HEADERS, flags | END_HEADERS, self.id) + block
        parts = [block[i : i + size] for i in range(0, len(block), size)]
        frames = [frame_header(len(parts[0]), HEADERS, flags, self.id), parts[0]]
        for index, part in enumerate(parts[1:], 2):
            last = END_HEADERS if index == len(parts) else 0
            frames += (frame_header(len(part), CONTINUATION, last, self.id), part)
        return b"".join(frames)

    def _data_frame(self, data: bytes, end_stream: bool) -> bytes:
        h2 = self.lane.h2
        h2.state_machine.process_input(ConnectionInputs.SEND_DATA)
        size = len(data)
        self.window -= size
        h2.outbound_flow_control_window -= size
        flags = END_STREAM if end_stream else 0
        return frame_header(size, DATA, flags, self.id) + data

    def _local_end(self) -> None:
        self.local_closed = True
        if self.remote_closed:
            self.lane.closed(self, StreamClosedBy.SEND_END_STREAM)

    def _write(self, frames: bytes) -> None:
        self.lane.write(frames)

    def fits(self, size: int) -> bool:
        """Whether `size` bytes of data may be sent at once, in one frame."""
        h2 = self.lane.h2
        return size <= min(self.window, h2.outbound_flow_control_window, h2.max_outbound_frame_size)

    def send_answer(self, headers: Any, data: bytes | None, trailers: Any) -> None:
        """Headers, a message that `fits` (or None) and trailers (or None), in one write."""
        self.check_open()
        frames = self._headers_frames(headers, False)
        if data is not None:
            frames += self._data_frame(data, False)
            self.data_sent += len(data)
            self.connection.data_sent += len(data)
            self.connection.data_send_process()
        if trailers is not None:
            frames += self._headers_frames(trailers, True)
        self._write(frames)
        self.connection.headers_send_process()
        if trailers is not None:
            self._local_end()

    async def send_headers(self, headers: Any, end_stream: bool = False) -> None:
        await self.connection.write_ready.wait()
        self.check_open()
        self._write(self._headers_frames(headers, end_stream))
        self.connection.headers_send_process()
        if end_stream:
            self._local_end()

    async def send_data(self, data: bytes, end_stream: bool = False) -> None:
        view, sent = memoryview(data), 0
        h2 = self.lane.h2
        while True:
            await self.connection.write_ready.wait()
            self.check_open()
            window = min(self.window, h2.outbound_flow_control_window)
            if window <= 0 and len(view) > sent:
                self.window_updated.clear()
                await self.window_updated.wait()
                continue
            chunk = bytes(view[sent : sent + min(window, h2.max_outbound_frame_size)])
            sent += len(chunk)
            last = sent == len(view)
            self._write(self._data_frame(chunk, end_stream and last))
            self.data_sent += len(chunk)
            self.connection.data_sent += len(chunk)
            self.connection.data_send_process()
            if last:
                if end_stream:
                    self._local_end()
                return

    async def end(self) -> None:
        await self.send_data(b"", end_stream=True)

    async def reset(self, error_code: ErrorCodes = ErrorCodes.NO_ERROR) -> None:
        await self.connection.write_ready.wait()
        self.reset_nowait(error_code)

    def reset_nowait(self, error_code: ErrorCodes = ErrorCodes.NO_ERROR, now: bool = False) -> None:
        """grpclib's reset (held while the socket's buffer is full, as grpclib holds it); `now`,
        one found in what was received (sent at once, as grpclib sends what h2 answers)."""
        if self.id not in self.lane.streams:  # as h2 refuses a closed stream's reset
            raise StreamClosedError(self.id)
        h2 = self.lane.h2
        h2.state_machine.process_input(ConnectionInputs.SEND_RST_STREAM)
        self.reset_done = True
        self.lane.closed(self, StreamClosedBy.SEND_RST_STREAM)
        frame = frame_header(4, RST_STREAM, 0, self.id) + int(error_code).to_bytes(4, "big")
        if now or self.connection.write_ready.is_set():
            self._write(frame)
        else:  # as h2 holds it until grpclib next writes
            h2._data_to_send += frame


__all__ = ["DirectCalls", "Lane", "LaneStream"]
