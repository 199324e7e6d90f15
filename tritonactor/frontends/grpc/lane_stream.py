"""A call's stream on a connection's lane: a `grpclib.protocol.Stream` whose frames the lane
reads (lane.py) and that writes its own, without h2's stream state machine. A unary call's
answer goes in one write (`send_answer`); a streaming call's messages each way go through the
same frames and windows as grpclib's `send_data` and `recv_data` (its messages read from the
stream's buffer, its window given back as they are read).

The lane hands it the frames of its stream it takes (DATA, RST_STREAM, WINDOW_UPDATE, the
request's trailers); it keeps the stream's flow-control windows both ways, gives the window
back as the call reads, and writes the answer's frames (HEADERS, DATA, trailers) as h2 would,
through the connection's HPACK encoder, in one write where they fit (`send_answer`). What h2
keeps for the connection it keeps in step through the lane: the connection's windows, the
state machine's inputs, and the stream's close (h2 then answers a late frame on it as on its
own). A reset by the client, or one found in what it sent, ends the call as grpclib ends it on
h2's reset.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from grpclib.protocol import Connection, EventsProcessor, Stream
from h2.connection import ConnectionInputs, ConnectionState, H2Connection
from h2.errors import ErrorCodes
from h2.exceptions import FlowControlError, StreamClosedError
from h2.stream import StreamClosedBy

from tritonactor.frontends.grpc.frames import (
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    HEADERS,
    MAX_WINDOW,
    RST_STREAM,
    WINDOW_UPDATE,
    advance,
    frame_header,
)
from tritonactor.frontends.grpc.lane_buffer import LaneBuffer

if TYPE_CHECKING:
    from grpclib.server import Handler


# A message at least this large is written as its pieces (one `writev`), not joined first.
WRITE_AS_IS = 64 * 1024


class StreamLane(Protocol):
    """What a lane stream needs of its connection's lane (lane.py's `Lane`)."""

    h2: H2Connection
    connection: Connection
    processor: EventsProcessor
    handler: Handler
    streams: dict[int, LaneStream]  # the lane's open streams, by id

    def write(self, frames: bytes) -> None:
        """`frames` to the socket, after what h2 has to send."""
        ...

    def writelines(self, pieces: list[Any]) -> None:
        """`pieces` (buffers) to the socket one after another, after what h2 has to send."""
        ...

    def ack_connection(self, size: int) -> None:
        """`size` bytes read: their share of the connection's window back."""
        ...

    def closed(self, stream: LaneStream, by: StreamClosedBy) -> None:
        """`stream` closed: h2 answers its late frames as it answers its own streams'."""
        ...


class LaneStream(Stream):
    """A call's stream, its frames read and written by its connection's `Lane`."""

    def __init__(self, lane: StreamLane, stream_id: int) -> None:
        self.lane = lane  # (before grpclib's init, which makes the stream's buffer)
        connection = lane.connection
        super().__init__(connection, lane.h2, connection._transport, stream_id=stream_id)
        h2 = lane.h2
        self.window = h2.remote_settings.initial_window_size  # ours to send
        self._inbound = h2.local_settings.initial_window_size  # the peer's to send
        self._unacked = 0
        self.remote_closed = self.local_closed = self.reset_done = False

    def init_stream(self, stream_id: int, connection: Connection) -> None:
        # grpclib's, but for the buffer (a LaneBuffer, lane_buffer.py, made once): it acks
        # through the lane, as grpclib's acks through the connection (the stream is then freed
        # when its call lets it go, not by the cyclic collector)
        self.id = stream_id
        self.buffer = LaneBuffer(  # type: ignore[assignment]
            functools.partial(self.lane_ack, self.lane, stream_id)
        )
        connection.streams_started += 1
        self.created = connection.last_stream_created = time.monotonic()

    def released(self, release: Callable[[], Any], _task: object) -> None:
        """The call's task is done: its stream let go, if the call has not (a reset in the
        same read as the call's HEADERS cancels the task before its first step)."""
        if self.lane.processor.streams.get(self.id) is self:
            release()

    @staticmethod
    def lane_ack(lane: StreamLane, stream_id: int, size: int) -> None:
        stream = lane.streams.get(stream_id)
        if stream is not None:
            stream.acknowledge(size)
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
            # grpclib gives back data for a stream it does not know (and h2 counts it to the
            # stream too while the peer may still send on it: a streaming call that ended
            # before its client did)
            if end:
                self._remote_end()
            self.acknowledge(size)
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

    def acknowledge(self, size: int) -> None:
        """`size` bytes read by the call (or left to no one once it let its stream go): their
        window goes back to the peer (the connection's by h2's manager; the stream's while the
        peer may still send on it, by the rule of h2's window manager)."""
        if not size or self.connection.is_closing():
            return
        self.lane.ack_connection(size)
        if self.remote_closed:
            return
        self._unacked += size
        initial = self.lane.h2.local_settings.initial_window_size
        # as h2's window manager: half the window read, or a little of it once it is empty
        if self._unacked * 2 >= initial or (
            self._inbound <= 0 and self._unacked > min(1024, initial // 4)
        ):
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
        advance(h2, ConnectionInputs.SEND_HEADERS)
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
        return self._data_header(len(data), end_stream) + data

    def _data_header(self, size: int, end_stream: bool) -> bytes:
        """The header of a DATA frame of `size` bytes, counted against the windows."""
        h2 = self.lane.h2
        advance(h2, ConnectionInputs.SEND_DATA)
        self.window -= size
        h2.outbound_flow_control_window -= size
        flags = END_STREAM if end_stream else 0
        return frame_header(size, DATA, flags, self.id)

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

    def send_answer(
        self, headers: Any, data: Sequence[Any] | None, trailers: Any, size: int = 0
    ) -> None:
        """Headers, a message that `fits` (or None) and trailers (or None), in one write. The
        message is `data`, buffers of `size` bytes in all: joined with the frames when small,
        written as they are when large (`WRITE_AS_IS`: a large tensor's bytes are not copied
        into the frame)."""
        self.check_open()
        frames = [self._headers_frames(headers, False)]
        if data is not None:
            frames.append(self._data_header(size, False))
            frames += data
            self.data_sent += size
            self.connection.data_sent += size
            self.connection.data_send_process()
        if trailers is not None:
            frames.append(self._headers_frames(trailers, True))
        if size < WRITE_AS_IS:
            self._write(b"".join(frames))
        else:
            self.lane.writelines(frames)
        self.connection.headers_send_process()
        if trailers is not None:
            self._local_end()

    async def recv_view(self, size: int) -> bytes | memoryview:
        """`recv_data`, a part of one received chunk as a view of it (LaneBuffer.read)."""
        return await self.buffer.read(size, copy=False)  # type: ignore[call-arg]

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
        advance(h2, ConnectionInputs.SEND_RST_STREAM)
        self.reset_done = True
        self.lane.closed(self, StreamClosedBy.SEND_RST_STREAM)
        frame = frame_header(4, RST_STREAM, 0, self.id) + int(error_code).to_bytes(4, "big")
        if now or self.connection.write_ready.is_set():
            self._write(frame)
        else:  # as h2 holds it until grpclib next writes
            h2._data_to_send += frame


__all__ = ["LaneStream", "StreamLane"]
