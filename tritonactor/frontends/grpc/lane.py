"""Calls read and answered beside h2: the HTTP/2 frames of a call taken without h2's state
machines.

h2 (Python) spends ~80 µs of a unary call reading its HEADERS and DATA frames and writing its
answer's three frames, most of it in objects made per frame and per stream (frames, flags,
events, a stream with its own state machine and window managers), where the call itself needs a
few slices of bytes; a streaming call pays the same for each message each way. A connection's
`Lane` reads the frames arriving on it. A HEADERS frame that opens a new stream (its block
whole, END_HEADERS) is read here: its header block decoded once, with the connection's HPACK
decoder (a block read before, the table unchanged since, is not decoded again: a gRPC client
sends the same block with every call; hpack_cache.py). A call of a method served (unary or
streaming, as `methods` lists them) is then the lane's: its frames go to a `LaneStream`
(lane_stream.py), a `grpclib.protocol.Stream` that reads and writes them itself, and the call
goes to grpclib's request handler (a ModelInfer call that `direct` takes is answered by
direct.py). Any other (a method no one serves, a request h2 checks further, one whose HEADERS
end the stream) is h2's, and the decoder hands h2 the headers it decoded, so that the block's
changes to the table are made once. Every other frame goes to h2, in the order it came, so h2
still owns the connection (settings, pings, GOAWAY, the connection's flow-control windows,
HPACK) and every other stream; but for a WINDOW_UPDATE of the connection's window, which a
client sends after each answer it reads: the lane grows h2's window and tells grpclib's
streams, as h2 and grpclib do (h2 took ~20 µs a call for it), and hands h2 one that h2
refuses, or one that follows frames of h2's in the same read (h2 reads those together). What
h2 keeps for the connection, the lane keeps in step: the highest stream id opened (GOAWAY
names it), the connection's windows both ways, the streams it closed (`_closed_streams`: h2
then answers a late frame on one as it would on its own), the connection state machine's
inputs; and a lane stream counts against the concurrent streams h2 allows.

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

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from grpclib.protocol import Connection, EventsProcessor
from h2.connection import ConnectionInputs, ConnectionState, H2Connection, _decode_headers
from h2.events import RemoteSettingsChanged, SettingsAcknowledged, WindowUpdated
from h2.exceptions import ProtocolError, TooManyStreamsError
from h2.settings import SettingCodes
from h2.stream import StreamClosedBy
from h2.utilities import guard_increment_window, is_informational_response

from tritonactor.frontends.grpc.frames import (
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    HEADERS,
    MAX_WINDOW,
    PADDED,
    PREFACE,
    PUSH_PROMISE,
    RST_STREAM,
    WINDOW_UPDATE,
    advance,
    frame_header,
    header_block,
    refuse_self_dependency,
)
from tritonactor.frontends.grpc.hpack_cache import KEPT_BYTES, keep
from tritonactor.frontends.grpc.lane_stream import LaneStream

if TYPE_CHECKING:
    from grpclib.server import Handler

LANE_FRAMES = (DATA, HEADERS, RST_STREAM, WINDOW_UPDATE)  # a lane stream's; the rest are h2's
# Headers of a request h2 checks further (a body held to its length; a status, which a request
# has none of): such a call is h2's.
H2_CHECKS = frozenset({"content-length", ":status"})


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


# A DATA frame's payload at least this large is handed on as a view of what was read.
VIEW_FROM = 64 * 1024


class Lane:
    """A connection's frames, read once: the calls of `methods` to `LaneStream`s, the rest to
    h2."""

    def __init__(
        self,
        h2: H2Connection,
        connection: Connection,
        processor: EventsProcessor,
        handler: Handler,
        methods: frozenset[str],
        direct: DirectCalls | None = None,
    ) -> None:
        self.h2 = h2
        self.connection = connection
        self.processor = processor
        self.handler = handler
        self.methods = methods  # the paths of the calls the lane takes
        self.direct = direct  # ModelInfer calls it takes (direct.py); the rest are grpclib's
        self.streams: dict[int, LaneStream] = {}
        self.opened = 0  # the calls it has opened, in all
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
                        # a large DATA frame's payload as a read-only view: what it views is
                        # not written again (a buffer that frames were taken from is replaced,
                        # below); a small one copied, not to keep a whole read for it
                        payload = (
                            memoryview(buffer).toreadonly()[position + 9 : after]
                            if kind == DATA and length >= VIEW_FROM
                            else buffer[position + 9 : after]
                        )
                        self._stream_frame(stream, kind, flags, payload)
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
                            headers = self._known(header_block(payload, flags))
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
                self._buffer = bytearray(memoryview(buffer)[position:])

    def _window_update(self, increment: int) -> bool:
        """A WINDOW_UPDATE of the connection's window, taken as h2 takes it (the window grown,
        grpclib's streams told); False where h2 refuses it (an increment of 0 or past the
        largest window, the reserved bit set), to let h2 answer it."""
        h2 = self.h2
        # (the window is never below 0: nothing is sent past it, h2 asserts it)
        if not 1 <= increment <= MAX_WINDOW - h2.outbound_flow_control_window:
            return False
        advance(h2, ConnectionInputs.RECV_WINDOW_UPDATE)
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
        """The headers of `block`, read here, where they open a call of a method in `methods`; None
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
        if fields.get(":path") in self.methods and not fields.keys() & H2_CHECKS:
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
        advance(h2, ConnectionInputs.RECV_HEADERS)
        h2.highest_inbound_stream_id = stream_id
        refuse_self_dependency(payload, flags, stream_id)  # (h2 has opened it by then)
        stream = LaneStream(self, stream_id)
        self.streams[stream_id] = stream
        self.opened += 1
        release = self.processor.register(stream)
        handler, direct = self.handler, self.direct
        if direct is None or not direct.accept(handler, stream, headers, release):
            handler.accept(stream, headers, release)

    def _stream_frame(
        self, stream: LaneStream, kind: int, flags: int, payload: bytes | bytearray | memoryview
    ) -> None:
        h2 = self.h2
        if kind == DATA:
            size = len(payload)
            if flags & PADDED:  # (checked as h2 reads the frame, before anything counts it)
                pad = payload[0] if payload else size
                if pad >= size:
                    raise ProtocolError("Received frame with invalid padding.")
                payload = payload[1 : size - pad]
            advance(h2, ConnectionInputs.RECV_DATA)
            h2._inbound_flow_control_window_manager.window_consumed(size)
            stream.receive_data(payload, size, bool(flags & END_STREAM))
        elif kind == WINDOW_UPDATE:
            increment = int.from_bytes(payload, "big") if len(payload) == 4 else 0
            if not 1 <= increment <= MAX_WINDOW:  # h2 refuses it, before it looks for the stream
                self._to_h2(frame_header(len(payload), kind, flags, stream.id) + payload)
                return
            advance(h2, ConnectionInputs.RECV_WINDOW_UPDATE)
            stream.receive_window_update(increment)
        elif kind == RST_STREAM:
            if len(payload) != 4:
                raise ProtocolError("Invalid RST_STREAM frame")
            advance(h2, ConnectionInputs.RECV_RST_STREAM)
            stream.receive_reset(int.from_bytes(payload, "big"))
        elif (
            kind == HEADERS and flags & END_HEADERS and (flags & END_STREAM or stream.remote_closed)
        ):
            # trailers; or headers on a stream the peer ended (a stream error, once read)
            advance(h2, ConnectionInputs.RECV_HEADERS)
            raw = _decode_headers(h2.decoder, header_block(payload, flags))
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
            refuse_self_dependency(payload, flags, stream.id)
            stream.receive_trailers(trailers)
        else:
            raise ProtocolError(f"Frame of type {kind} on lane stream {stream.id}")

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

    def writelines(self, pieces: list[Any]) -> None:
        """`pieces` (buffers that nothing changes) to the socket one after another, after what
        h2 has to send: one `writev` on uvloop, which keeps them, uncopied, until written."""
        pending = self.h2.data_to_send()
        if pending:
            pieces = [pending, *pieces]
        self.connection._transport.writelines(pieces)

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


__all__ = ["DirectCalls", "Lane"]
