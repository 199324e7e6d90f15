"""The lane (frontends/grpc/lane.py): unary calls read and answered beside h2 behave as h2 and
grpclib behave without it.

Each test plays the same client frames to a server connection with the lane and to one
without it (h2 reads every frame), and compares what the client gets back, stream by stream
(headers, data, trailers, resets) and for the connection (GOAWAY, closed); it also checks that
the lane did take the calls it should (a test of parity where the lane took nothing would pass
for nothing).
"""

from __future__ import annotations

import ast
import asyncio
import gc
import weakref
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import grpclib.const
import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import pytest
from grpclib import GRPCError
from grpclib.config import Configuration
from grpclib.const import Status
from grpclib.server import Stream
from hyperframe.frame import DataFrame, Frame, RstStreamFrame, WindowUpdateFrame

from tests.unit.test_grpc_unary import Raw
from tritonactor.frontends.grpc import connection
from tritonactor.frontends.grpc.connection import FRAME, GrpcServer
from tritonactor.frontends.grpc.direct import DirectInfer
from tritonactor.frontends.grpc.frames import LANE_INPUTS, advance, frame_header
from tritonactor.frontends.grpc.hpack_cache import KEPT_BYTES
from tritonactor.frontends.grpc.lane_stream import LaneStream
from tritonactor.frontends.grpc.listener import grpc_listener
from tritonactor.frontends.grpc.unary import unary_answers
from tritonactor.frontends.listen import listening_socket
from tritonactor.settings import Settings

pytestmark = pytest.mark.anyio

ECHO, WAIT, FAIL, CHAT = "/t.S/Echo", "/t.S/Wait", "/t.S/Fail", "/t.S/Chat"
FIRST, PAUSE = "/t.S/First", "/t.S/Pause"  # streaming: answer one message, then end / wait
RST_STREAM, GOAWAY, WINDOW_UPDATE_TYPE = 3, 7, 8
HEADERS = [
    (":method", "POST"),
    (":scheme", "http"),
    (":authority", "test"),
    ("content-type", "application/grpc"),
    ("te", "trailers"),
]


class Service:
    def __init__(self) -> None:
        self.lane_calls = 0
        self.calls = 0
        self.release = asyncio.Event()
        self.cancelled = 0
        self.raw_streams: list[weakref.ref[Any]] = []  # each call's protocol stream

    async def _seen(self, stream: Stream[Raw, Raw]) -> None:
        self.calls += 1
        self.lane_calls += isinstance(stream._stream, LaneStream)
        self.raw_streams.append(weakref.ref(stream._stream))

    async def echo(self, stream: Stream[Raw, Raw]) -> None:
        await self._seen(stream)
        message = await stream.recv_message()
        assert message is not None
        await stream.send_message(Raw(message.data[::-1]))

    async def wait(self, stream: Stream[Raw, Raw]) -> None:
        await self._seen(stream)
        message = await stream.recv_message()
        assert message is not None
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        await stream.send_message(Raw(message.data))

    async def fail(self, stream: Stream[Raw, Raw]) -> None:
        await self._seen(stream)
        await stream.recv_message()
        raise GRPCError(Status.INVALID_ARGUMENT, "refused, as asked")

    async def chat(self, stream: Stream[Raw, Raw]) -> None:
        await self._seen(stream)
        async for message in stream:
            await stream.send_message(Raw(message.data.upper()))

    async def first(self, stream: Stream[Raw, Raw]) -> None:
        """Answers the first message and ends the call (OK), the client's side still open."""
        await self._seen(stream)
        message = await stream.recv_message()
        assert message is not None
        await stream.send_message(Raw(message.data[:3]))

    async def pause(self, stream: Stream[Raw, Raw]) -> None:
        """Answers the first message, then reads no more until `release`."""
        await self._seen(stream)
        message = await stream.recv_message()
        assert message is not None
        await stream.send_message(Raw(message.data[:3]))
        await self.release.wait()
        async for message in stream:
            await stream.send_message(Raw(message.data[:3]))

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        unary = grpclib.const.Cardinality.UNARY_UNARY
        streaming = grpclib.const.Cardinality.STREAM_STREAM
        return unary_answers(
            {
                ECHO: grpclib.const.Handler(self.echo, unary, Raw, Raw),
                WAIT: grpclib.const.Handler(self.wait, unary, Raw, Raw),
                FAIL: grpclib.const.Handler(self.fail, unary, Raw, Raw),
                CHAT: grpclib.const.Handler(self.chat, streaming, Raw, Raw),
                FIRST: grpclib.const.Handler(self.first, streaming, Raw, Raw),
                PAUSE: grpclib.const.Handler(self.pause, streaming, Raw, Raw),
            }
        )


class Transport:
    """Records the server's writes."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.pieces: list[int] = []  # the number of buffers of each `writelines`
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def writelines(self, pieces: list[Any]) -> None:
        self.pieces.append(len(pieces))
        self.writes.append(b"".join(memoryview(piece).cast("B") for piece in pieces))

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


def message(payload: bytes) -> bytes:
    return b"\0" + len(payload).to_bytes(4, "big") + payload


class Session:
    """A server connection (GrpcServer's protocol, with or without the lane) and an h2 client
    in process; `split` feeds the server the client's bytes that many at a time; without the
    `handshake`, the client has not read the server's settings when the test begins."""

    def __init__(
        self,
        lanes: bool,
        window: int | None = None,
        config: Configuration | None = None,
        frame: int | None = None,
        split: int | None = None,
        handshake: bool = True,
        service: Any = None,
        direct: DirectInfer | None = None,
    ) -> None:
        self.service = Service() if service is None else service
        self.server = GrpcServer([self.service], config=config, direct=direct)
        self.protocol = self.server._protocol_factory()
        self.protocol.lanes = lanes  # type: ignore[attr-defined]
        self.transport = Transport()
        self.protocol.connection_made(self.transport)  # type: ignore[arg-type]
        assert (self.protocol.lane is not None) is lanes  # type: ignore[attr-defined]
        self.split = split
        self.client = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        )
        values = {}
        if window is not None:
            values[h2.settings.SettingCodes.INITIAL_WINDOW_SIZE] = window
        if frame is not None:  # frames this large accepted, and the connection's window
            values[h2.settings.SettingCodes.MAX_FRAME_SIZE] = frame
        if values:
            self.client.local_settings = h2.settings.Settings(client=True, initial_values=values)
        self.client.initiate_connection()
        if frame is not None:
            self.client.max_inbound_frame_size = frame  # (h2 reads it at its start only)
            self.client.increment_flow_control_window(4 * frame)
        self.streams: dict[int, dict[str, Any]] = {}
        self.connection: list[tuple[str, Any]] = []
        self.bodies: dict[int, bytes] = {}  # what the client still has to send
        self.gives_window = True  # the client gives the window back as it reads
        self.sent: list[tuple[int, int, int]] = []  # the server's RST_STREAM and GOAWAY frames
        self._unread = b""
        if handshake:
            self.pump()
        else:
            self.feed(self.client.data_to_send())

    def feed(self, data: bytes) -> None:
        step = self.split or len(data) or 1
        for start in range(0, len(data), step):
            if self.transport.closed:
                return
            self.protocol.data_received(data[start : start + step])

    def pump(self) -> None:
        client = self.client
        while True:
            pending, self.transport.writes[:] = b"".join(self.transport.writes), []
            self._note(pending)
            try:
                events = client.receive_data(pending) if pending else []
            except h2.exceptions.ProtocolError as error:
                self.connection.append(("client refused", type(error).__name__))
                events = []
            for event in events:
                self._record(event)
            for stream_id, body in list(self.bodies.items()):
                self._send_body(stream_id, body)
            out = client.data_to_send()
            if out:
                self.feed(out)
            if not out and not self.transport.writes:
                return

    def _note(self, data: bytes) -> None:
        """The server's resets and GOAWAYs, as frames (a client ignores a reset of a stream it
        has closed)."""
        noted, self._unread = resets_and_goaways(self._unread + data)
        self.sent += noted

    def _record(self, event: Any) -> None:
        stream_id = getattr(event, "stream_id", None)
        entry = self.streams.setdefault(stream_id, {}) if stream_id else None
        if isinstance(event, h2.events.ResponseReceived):
            entry["headers"] = event.headers  # type: ignore[index]
        elif isinstance(event, h2.events.DataReceived):
            entry["data"] = entry.get("data", b"") + event.data  # type: ignore[union-attr,index]
            if self.gives_window:
                self.client.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.TrailersReceived):
            entry["trailers"] = event.headers  # type: ignore[index]
        elif isinstance(event, h2.events.StreamEnded):
            entry["ended"] = True  # type: ignore[index]
        elif isinstance(event, h2.events.StreamReset):
            entry["reset"] = event.error_code  # type: ignore[index]
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.connection.append(("goaway", (event.error_code, event.last_stream_id)))

    def _send_body(self, stream_id: int, body: bytes) -> None:
        client = self.client
        window = min(client.local_flow_control_window(stream_id), client.max_outbound_frame_size)
        if window <= 0:
            return
        chunk, rest = body[:window], body[window:]
        client.send_data(stream_id, chunk, end_stream=not rest)
        if rest:
            self.bodies[stream_id] = rest
        else:
            del self.bodies[stream_id]

    def open(self, method: str, extra: list[tuple[str, str]] | None = None, **kwargs: Any) -> int:
        stream_id = self.client.get_next_available_stream_id()
        headers = [*HEADERS[:3], (":path", method), *HEADERS[3:], *(extra or [])]
        self.client.send_headers(stream_id, headers, **kwargs)
        return stream_id

    def send_out(self) -> None:
        """What the client has to send, to the server, without reading what comes back."""
        self.feed(self.client.data_to_send())

    def call(self, method: str, payload: bytes, **kwargs: Any) -> int:
        """Open a call and send its message (without pumping)."""
        stream_id = self.open(method)
        self.bodies[stream_id] = message(payload)
        self._send_body(stream_id, self.bodies[stream_id])
        return stream_id

    def raw(self, *frames: Frame) -> None:
        """Frames the client's h2 would not send: straight to the server."""
        self.feed(b"".join(frame.serialize() for frame in frames))
        self.pump()

    async def settle(self, until: Callable[[], bool] | None = None) -> None:
        """Loop turns (not time) until the client has nothing more to read, or `until`."""
        self.pump()
        for _ in range(200):
            await asyncio.sleep(0)
            self.pump()
            if until is not None and until():
                return
        assert until is None, "never came"

    def ended(self, *stream_ids: int) -> Callable[[], bool]:
        return lambda: all(
            self.streams.get(s, {}).get("ended") or "reset" in self.streams.get(s, {})
            for s in stream_ids
        )

    def outcome(self) -> tuple[Any, ...]:
        streams = dict(sorted(self.streams.items()))
        # the connection's window the client may still fill, by the server's count
        window = self.protocol.connection._connection.inbound_flow_control_window
        closed, calls = self.transport.closed, self.service.calls
        # what h2 had still to send (grpclib closes a connection without sending the GOAWAY
        # h2 makes for a protocol error)
        unsent, _ = resets_and_goaways(bytes(self.protocol.connection._connection._data_to_send))
        return streams, self.connection, self.sent, unsent, closed, calls, window


Play = Callable[[Session], Awaitable[None]]


def resets_and_goaways(data: bytes) -> tuple[list[tuple[int, int, int]], bytes]:
    """The RST_STREAM (type, stream, code) and GOAWAY (type, last stream, code) frames in
    `data`, and what is left of a frame not yet whole."""
    found = []
    while len(data) >= 9:
        length = int.from_bytes(data[:3], "big")
        if len(data) < 9 + length:
            break
        kind, stream_id = data[3], int.from_bytes(data[5:9], "big") & 0x7FFFFFFF
        payload, data = data[9 : 9 + length], data[9 + length :]
        if kind == RST_STREAM:
            found.append((kind, stream_id, int.from_bytes(payload, "big")))
        elif kind == GOAWAY:
            found.append(
                (kind, int.from_bytes(payload[:4], "big"), int.from_bytes(payload[4:8], "big"))
            )
    return found, data


async def warm(session: Session, *methods: str) -> None:
    """Calls of each method, twice over, before what a test looks at (the lane's count of
    calls starts after them)."""
    session.service.release.set()
    for _ in range(2):
        for method in methods:
            stream_id = session.call(method, b"warm")
            await session.settle(session.ended(stream_id))
    session.service.release.clear()
    session.service.lane_calls = 0


@pytest.fixture
def h2_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The connection's limits as h2's defaults (100 streams, 64 KiB of headers), low enough
    for a test to reach: the lane must count and refuse at them as h2 does."""
    monkeypatch.setattr(connection, "STREAMS", 100)
    monkeypatch.setattr(connection, "HEADER_LIST", 2**16)


def past_the_limit(session: Session) -> None:
    """Let the client open streams past the server's limit (100, `h2_limits`), as h2 would
    not."""
    limits = session.client.remote_settings
    limits.max_concurrent_streams = 1000
    limits.acknowledge()


async def at_the_limit(session: Session) -> None:
    """100 calls the lane takes, held open: h2's limit of streams open at once."""
    await warm(session, WAIT)
    past_the_limit(session)
    for _ in range(100):
        session.call(WAIT, b"held")
    session.pump()
    await session.settle()


def raw_frame(kind: int, flags: int, stream_id: int, payload: bytes) -> bytes:
    """A frame as bytes, whatever it says (the client's h2 would refuse to send some)."""
    return frame_header(len(payload), kind, flags, stream_id) + payload


async def both(play: Play, unsent: bool = True, **kwargs: Any) -> tuple[Session, Session]:
    """`play` on a connection with the lane and on one without: their outcomes are equal (but
    for what h2 had still to send, without `unsent`)."""
    sessions = []
    for lanes in (True, False):
        session = Session(lanes, **kwargs)
        await play(session)
        await session.settle()
        sessions.append(session)
    ours, theirs = sessions
    if unsent:
        assert ours.outcome() == theirs.outcome()
    else:
        assert (
            ours.outcome()[:3] + ours.outcome()[4:] == theirs.outcome()[:3] + theirs.outcome()[4:]
        )
    assert theirs.service.lane_calls == 0
    return ours, theirs


def status(entry: dict[str, Any]) -> str:
    return dict(entry.get("trailers") or entry["headers"])["grpc-status"]


async def test_calls_in_turn_take_the_lane() -> None:
    async def play(session: Session) -> None:
        for n in range(6):
            stream_id = session.call(ECHO, bytes([n]) * (n * 100 + 1))
            await session.settle(session.ended(stream_id))

    ours, _ = await both(play)
    assert all(status(entry) == "0" for entry in ours.streams.values())
    assert ours.streams[11]["data"] == message(bytes([5]) * 501)
    assert ours.service.lane_calls == 6  # the first too: the lane reads every block
    assert not ours.protocol.lane.streams  # every lane stream closed and let go


async def test_calls_together_and_read_a_byte_at_a_time() -> None:
    async def play(session: Session) -> None:
        ids = [session.call(ECHO, b"x" * n) for n in (1, 2, 3, 4, 5, 6)]
        await session.settle(session.ended(*ids))

    for split in (None, 1, 7):
        ours, _ = await both(play, split=split)
        assert ours.service.lane_calls == 6, split


@pytest.mark.parametrize("split", [None, 1000], ids=["whole", "in 1000-byte reads"])
async def test_a_request_larger_than_the_windows_is_read_as_they_are_given_back(
    split: int | None,
) -> None:
    small = Configuration(http2_connection_window_size=2**16, http2_stream_window_size=2**16)
    payload = bytes(range(256)) * 1024  # 256 KiB through 64 KiB windows

    async def play(session: Session) -> None:
        for _ in range(3):
            stream_id = session.call(ECHO, payload)
            await session.settle(session.ended(stream_id))

    ours, _ = await both(play, config=small, split=split)
    assert ours.service.lane_calls == 3
    assert ours.streams[5]["data"] == message(payload[::-1])


async def test_an_answer_larger_than_the_clients_window_waits_for_it() -> None:
    payload = bytes(range(256)) * 8

    async def play(session: Session) -> None:
        for _ in range(3):
            stream_id = session.call(ECHO, payload)
            await session.settle(session.ended(stream_id))

    ours, _ = await both(play, window=100)
    assert ours.service.lane_calls == 3
    assert ours.streams[5]["data"] == message(payload[::-1])


async def test_a_settings_change_of_the_window_reaches_a_waiting_answer() -> None:
    async def play(session: Session) -> None:
        await warm(session, ECHO)
        session.gives_window = False
        stream_id = session.call(ECHO, b"b" * 5000)
        await session.settle()
        assert len(session.streams[stream_id]["data"]) == 100  # the window, and waiting
        session.client.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 10**6})
        await session.settle(session.ended(stream_id))

    ours, _ = await both(play, window=100)
    assert ours.service.lane_calls == 1
    assert ours.streams[5]["data"] == message(b"b" * 5000)


async def test_a_client_reset_cancels_the_call() -> None:
    async def play(session: Session) -> None:
        await warm(session, ECHO, WAIT)
        stream_id = session.call(WAIT, b"held")
        await session.settle(lambda: session.service.calls == 5)
        session.client.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
        await session.settle(lambda: session.service.cancelled == 1)
        after = session.call(ECHO, b"after")
        await session.settle(session.ended(after))

    ours, theirs = await both(play)
    assert ours.service.lane_calls == 2 and ours.service.cancelled == theirs.service.cancelled == 1
    assert status(ours.streams[11]) == "0"


async def test_frames_after_a_lane_stream_closed_are_h2s_to_answer() -> None:
    async def play(session: Session) -> None:
        for _ in range(3):
            session.call(ECHO, b"a")
        await session.settle(session.ended(1, 3, 5))
        late_window = WindowUpdateFrame(5)
        late_window.window_increment = 10
        late_reset = RstStreamFrame(5)
        late_reset.error_code = 8
        session.raw(late_window, late_reset, DataFrame(5, data=b"late"))
        after = session.call(ECHO, b"after")
        await session.settle(session.ended(after))

    ours, _ = await both(play)
    assert ours.service.lane_calls == 4
    assert (RST_STREAM, 5, h2.errors.ErrorCodes.STREAM_CLOSED) in ours.sent  # the late data's
    assert not ours.connection and status(ours.streams[7]) == "0"


async def test_headers_on_a_lane_stream_the_client_reset_are_a_stream_error() -> None:
    """h2 tells a stream closed by a reset (a stream error) from one closed by its end (a
    connection error): it knows the lane's streams as it knows its own."""

    async def play(session: Session) -> None:
        await warm(session, ECHO, WAIT)
        stream_id = session.call(WAIT, b"held")
        await session.settle(lambda: session.service.calls == 5)
        session.client.reset_stream(stream_id)
        await session.settle(lambda: session.service.cancelled == 1)
        block = session.client.encoder.encode([("x-late", "1")])
        session.feed(raw_frame(1, 0x5, stream_id, block))
        after = session.call(ECHO, b"after")
        await session.settle(session.ended(after))

    ours, _ = await both(play)
    assert ours.service.lane_calls == 2 and not ours.transport.closed
    assert (RST_STREAM, 9, h2.errors.ErrorCodes.STREAM_CLOSED) in ours.sent
    assert status(ours.streams[11]) == "0"


async def test_data_after_the_end_of_a_lane_stream_resets_it() -> None:
    async def play(session: Session) -> None:
        await warm(session, ECHO, WAIT)
        stream_id = session.call(WAIT, b"held")
        await session.settle(lambda: session.service.calls == 5)
        late = DataFrame(stream_id, data=message(b"late"), flags=["END_STREAM"])
        session.raw(late)
        await session.settle(lambda: session.service.cancelled == 1)
        after = session.call(ECHO, b"after")
        await session.settle(session.ended(after))

    ours, _ = await both(play)
    assert ours.service.lane_calls == 2
    assert ours.streams[9]["reset"] == h2.errors.ErrorCodes.STREAM_CLOSED


async def test_padding_priority_and_request_trailers() -> None:
    async def play(session: Session) -> None:
        await warm(session, ECHO)
        stream_id = session.open(ECHO, priority_weight=200, priority_depends_on=0)
        body = message(b"padded")
        session.client.send_data(stream_id, body[:4], pad_length=9)
        session.client.send_data(stream_id, body[4:], pad_length=0)
        session.client.send_headers(stream_id, [("x-trailer", "1")], end_stream=True)
        await session.settle(session.ended(stream_id))

    ours, _ = await both(play)
    assert ours.streams[5]["data"] == message(b"deddap") and ours.service.lane_calls == 1


async def test_bad_padding_on_a_lane_stream_ends_the_connection_as_h2_ends_it() -> None:
    async def play(session: Session) -> None:
        await warm(session, ECHO)
        stream_id = session.open(ECHO)
        await session.settle(lambda: session.service.calls == 3)  # reading its message
        session.feed(raw_frame(0, 0x8, stream_id, b"\xff" + b"x" * 4))  # padding past the end

    ours, theirs = await both(play)
    assert ours.transport.closed and ours.service.lane_calls == 1
    assert ours.connection == theirs.connection


async def test_errors_streams_and_unknown_methods_answer_as_before() -> None:
    nothing = "/t.S/Nothing"

    async def play(session: Session) -> None:
        await warm(session, ECHO, FAIL, nothing)
        for method in (ECHO, FAIL, nothing):
            stream_id = session.call(method, b"q")
            await session.settle(session.ended(stream_id))
        chat = session.open(CHAT)
        session.client.send_data(chat, message(b"one") + message(b"two"), end_stream=True)
        await session.settle(session.ended(chat))

    ours, _ = await both(play)
    assert status(ours.streams[15]) == str(Status.INVALID_ARGUMENT.value)
    assert status(ours.streams[17]) == str(Status.UNIMPLEMENTED.value)
    assert ours.streams[19]["data"] == message(b"ONE") + message(b"TWO")
    assert ours.service.lane_calls == 3  # ECHO, FAIL and CHAT; not the method no one serves


async def test_a_streaming_call_takes_the_lane_past_both_windows_each_way() -> None:
    """A streaming call's messages, both ways past the stream's and the connection's windows
    (64 KiB each way): read, answered and given their windows back by the lane as by h2."""
    small = Configuration(http2_connection_window_size=2**16, http2_stream_window_size=2**16)
    parts = [bytes([97 + n]) * (30_000 + n) for n in range(8)]
    opened: list[int] = []

    async def play(session: Session) -> None:
        await warm(session, CHAT)
        stream_id = session.open(CHAT)
        opened.append(stream_id)
        session.bodies[stream_id] = b"".join(message(part) for part in parts)
        await session.settle(session.ended(stream_id))

    ours, theirs = await both(play, config=small)
    assert ours.streams[opened[0]]["data"] == b"".join(message(p.upper()) for p in parts)
    assert status(ours.streams[opened[0]]) == "0"
    assert ours.service.lane_calls == 1 and theirs.service.calls == ours.service.calls == 3


async def test_a_streaming_call_the_client_resets_mid_way_ends_as_on_h2() -> None:
    """A client that resets a streaming call after an answer: the handler cancelled, the
    stream closed, a late frame on it answered as h2 answers one on a stream it reset."""
    opened: list[int] = []

    async def play(session: Session) -> None:
        await warm(session, CHAT)
        stream_id = session.open(CHAT)
        opened.append(stream_id)
        session.client.send_data(stream_id, message(b"first"))
        await session.settle(lambda: "data" in session.streams.get(stream_id, {}))
        session.client.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
        session.send_out()
        await session.settle()
        session.raw(DataFrame(stream_id, message(b"late")))
        await session.settle()

    ours, _ = await both(play)
    assert ours.streams[opened[0]]["data"] == message(b"FIRST")
    assert ours.service.lane_calls == 1 and not ours.protocol.lane.streams
    assert not ours.transport.closed


async def test_a_call_that_ended_before_its_client_gives_the_streams_window_back() -> None:
    """A streaming call answers one message and ends (OK) while its client goes on sending,
    past the stream's window: the window goes back for what no one reads (what the call left
    unread, and what came after), the stream's as well as the connection's, as with h2; the
    client is not left holding its bytes."""
    small = Configuration(http2_connection_window_size=2**20, http2_stream_window_size=2**16)
    opened: list[int] = []
    windows: list[int] = []  # the client's window on the stream once the call ended

    async def play(session: Session) -> None:
        stream_id = session.open(FIRST)
        opened.append(stream_id)
        session.client.send_data(stream_id, message(b"one"))
        session.client.send_data(stream_id, message(b"x" * 40_000))  # unread: a frame of its own
        await session.settle(lambda: "trailers" in session.streams.get(stream_id, {}))
        windows.append(session.client.local_flow_control_window(stream_id))
        session.bodies[stream_id] = message(b"z" * 200_000)
        await session.settle()

    ours, _ = await both(play, config=small)
    assert windows[0] == windows[1] > 2**16 - 40_013  # the unread message's window back
    assert opened[0] not in ours.bodies  # all sent
    assert ours.streams[opened[0]]["data"] == message(b"one")
    assert ours.service.lane_calls == 1


async def test_a_streams_window_emptied_goes_back_once_a_little_is_read() -> None:
    """The client fills the stream's window; the call reads one message (20 KB, under half the
    window) and waits: the window goes back then, as h2's window manager gives back a window
    that is empty, and the client sends on."""
    small = Configuration(http2_connection_window_size=2**20, http2_stream_window_size=2**16)
    left: list[int] = []

    async def play(session: Session) -> None:
        stream_id = session.open(PAUSE)
        first = message(b"a" * 20_000)
        session.client.send_data(stream_id, first)
        session.client.send_data(stream_id, message(b"b" * (2**16 - len(first) - 5)))
        session.bodies[stream_id] = message(b"c" * 50_000)
        await session.settle()
        left.append(len(session.bodies.get(stream_id, b"")))
        session.service.release.set()
        await session.settle(session.ended(stream_id))

    ours, _ = await both(play, config=small)
    assert left[0] == left[1] < 50_005  # some of it sent while the call waits
    assert ours.service.lane_calls == 1


@pytest.mark.usefixtures("h2_limits")
async def test_streams_past_the_limit_end_the_connection_as_h2_ends_it() -> None:
    async def play(session: Session) -> None:
        await warm(session, WAIT)
        past_the_limit(session)
        for _ in range(101):
            session.call(WAIT, b"held")
        await session.settle()

    ours, _ = await both(play)
    assert ours.transport.closed and len(ours.protocol.lane.streams) == 100


async def test_goaway_names_the_last_stream_the_lane_took() -> None:
    async def play(session: Session) -> None:
        for _ in range(4):
            stream_id = session.call(ECHO, b"a")
            await session.settle(session.ended(stream_id))
        session.protocol.connection._connection.close_connection()
        session.protocol.connection.flush()

    ours, _ = await both(play)
    assert ours.connection == [("goaway", (0, 7))] and ours.service.lane_calls == 4


async def test_a_known_block_with_a_content_length_is_h2s() -> None:
    async def play(session: Session) -> None:
        for _ in range(3):
            stream_id = session.open(ECHO, [("content-length", "6")])
            session.client.send_data(stream_id, message(b"a"), end_stream=True)
            await session.settle(session.ended(stream_id))

    ours, _ = await both(play)
    assert ours.service.lane_calls == 0 and status(ours.streams[5]) == "0"


async def test_grpcs_own_client_many_calls_on_one_channel() -> None:
    """gRPC's own client (grpcio's C core, as tritonclient's and perf_analyzer's): calls in
    turn and together on one channel, small and large, some with a deadline (a grpc-timeout
    header, whose value changes each call)."""
    import grpc

    service = Service()
    service.release.set()
    server = GrpcServer([service], config=Configuration(http2_stream_window_size=2**20))
    await server.start("127.0.0.1", 0)
    assert server._server is not None
    port = server._server.sockets[0].getsockname()[1]
    sizes = [1, 100, 20 * 1024, 70 * 1024, 3 * 1024 * 1024] * 6

    def calls() -> None:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            echo = channel.unary_unary(ECHO)
            for n, size in enumerate(sizes):
                payload = bytes([n % 251]) * size
                timeout = 30 if n % 5 == 4 else None
                assert echo(payload, timeout=timeout) == payload[::-1]
            futures = [echo.future(bytes([n]) * n * 1000) for n in range(1, 40)]
            for n, future in enumerate(futures, 1):
                assert future.result() == bytes([n]) * n * 1000
            try:
                channel.unary_unary(FAIL)(b"x")
            except grpc.RpcError as error:
                assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
            else:
                raise AssertionError("no error")

    try:
        await anyio.to_thread.run_sync(calls)
    finally:
        server.close()
        await server.wait_closed()
    assert service.calls == len(sizes) + 40
    assert service.lane_calls == service.calls  # every one a unary call


async def test_calls_before_the_settings_are_acknowledged_get_their_larger_window() -> None:
    """A call the lane takes before the client acknowledged the server's larger stream window
    (grpclib's settings, the front end's 64 MiB): the window grows when the client
    acknowledges it, as h2 grows its own streams'."""
    larger = Configuration(http2_connection_window_size=2**24, http2_stream_window_size=2**20)
    body = bytes(range(256)) * 800  # 200 KiB: past the 64 KiB a stream starts with

    async def play(session: Session) -> None:
        ids = []
        for _ in range(3):
            ids.append(session.call(ECHO, body))
            session.send_out()  # each its own read, the client not reading the server yet
        await session.settle(session.ended(*ids))

    ours, _ = await both(play, config=larger, handshake=False)
    assert ours.service.lane_calls == 3 and not ours.transport.closed
    assert ours.streams[5]["data"] == message(body[::-1])


@pytest.mark.usefixtures("h2_limits")
async def test_streams_h2_opens_count_the_lanes_against_the_limit() -> None:
    async def play(session: Session) -> None:
        await at_the_limit(session)
        session.open("/t.S/Nothing")  # h2's stream (a method no one serves): the 101st open
        await session.settle()

    ours, _ = await both(play)
    assert ours.transport.closed and len(ours.protocol.lane.streams) == 100


async def test_data_after_the_answer_gives_the_connections_window_back() -> None:
    small = Configuration(http2_connection_window_size=2**16, http2_stream_window_size=2**16)

    async def play(session: Session) -> None:
        await warm(session, ECHO)
        stream_id = session.open(ECHO)
        session.client.send_data(stream_id, message(b"abc"))  # the message; the stream open
        await session.settle(lambda: "trailers" in session.streams.get(stream_id, {}))
        for _ in range(4):  # 60 KB more: the client may go on sending (half-closed remote)
            session.client.send_data(stream_id, b"\0" * 15_000)
        session.client.end_stream(stream_id)
        await session.settle()
        after = session.call(ECHO, b"y" * 20_000)
        await session.settle(session.ended(after))

    ours, _ = await both(play, config=small)
    assert ours.service.lane_calls == 2 and status(ours.streams[7]) == "0"


async def held_call(session: Session, end: bool) -> int:
    """A WAIT call the lane takes, its handler holding it; the client `end`ed its stream."""
    await warm(session, WAIT)
    calls = session.service.calls + 1
    stream_id = session.open(WAIT)
    session.client.send_data(stream_id, message(b"held"), end_stream=end)
    await session.settle(lambda: session.service.calls == calls)
    assert session.service.lane_calls in (0, 1)
    return stream_id


BAD_INDEX = b"\xff\x80\x80\x80\x08"  # an index past the table
NOT_ASCII = b"\x00\x03x-t\x02\xc3\xa9"  # x-t: é


async def test_request_trailers_h2_cannot_decode_end_the_connection_as_h2_ends_it() -> None:
    async def play(session: Session) -> None:
        stream_id = await held_call(session, end=False)
        session.feed(raw_frame(1, 0x5, stream_id, BAD_INDEX))

    ours, _ = await both(play)
    assert ours.transport.closed and ours.service.lane_calls == 1


async def test_request_trailers_that_are_not_ascii_end_the_connection() -> None:
    """h2 decodes them as text only in grpclib's protocol: its UnicodeDecodeError leaves the
    protocol (asyncio then logs it and closes the connection); the lane ends the connection
    as a protocol error."""
    session = Session(lanes=True)
    stream_id = await held_call(session, end=False)
    session.feed(raw_frame(1, 0x5, stream_id, NOT_ASCII))
    assert session.transport.closed and session.service.lane_calls == 1
    plain = Session(lanes=False)
    stream_id = await held_call(plain, end=False)
    with pytest.raises(UnicodeDecodeError):
        plain.feed(raw_frame(1, 0x5, stream_id, NOT_ASCII))


@pytest.mark.parametrize("block", [BAD_INDEX, NOT_ASCII], ids=["bad index", "not ascii"])
async def test_trailers_on_a_lane_stream_the_client_ended(block: bytes) -> None:
    async def play(session: Session) -> None:
        stream_id = await held_call(session, end=True)
        session.feed(raw_frame(1, 0x5, stream_id, block))
        await session.settle()

    ours, _ = await both(play)
    assert ours.service.lane_calls == 1


async def test_goaway_then_a_call_in_one_read() -> None:
    async def play(session: Session) -> None:
        await warm(session, ECHO)
        goaway = raw_frame(7, 0, 0, bytes(8))
        stream_id = session.open(ECHO)
        session.client.send_data(stream_id, message(b"x"), end_stream=True)
        session.feed(goaway + session.client.data_to_send())

    # grpclib closes the connection on the client's GOAWAY: the lane gives h2 nothing after it,
    # where h2 alone reads the call too and makes a GOAWAY of its own, never sent
    ours, _ = await both(play, unsent=False)
    assert ours.transport.closed


async def test_headers_again_on_a_lane_stream_the_client_ended_reset_it() -> None:
    async def play(session: Session) -> None:
        await warm(session, WAIT)
        stream_id = session.call(WAIT, b"held")
        await session.settle(lambda: session.service.calls == 3)
        block = session.client.encoder.encode([("x-again", "1")])
        session.feed(raw_frame(1, 0x4, stream_id, block))  # END_HEADERS, no END_STREAM
        await session.settle(lambda: session.service.cancelled == 1)
        after = session.call(ECHO, b"after")
        await session.settle(session.ended(after))

    ours, _ = await both(play)
    assert not ours.transport.closed and ours.service.lane_calls == 2
    assert (RST_STREAM, 5, h2.errors.ErrorCodes.STREAM_CLOSED) in ours.sent


async def test_frames_of_other_types_on_a_lane_stream_are_h2s() -> None:
    async def play(session: Session) -> None:
        await warm(session, WAIT)
        stream_id = session.call(WAIT, b"held")
        await session.settle(lambda: session.service.calls == 3)
        altsvc = raw_frame(10, 0, stream_id, b'\0\0h2=":443"')  # ALTSVC: a server ignores it
        priority = raw_frame(2, 0, stream_id, bytes(4) + b"\x10")
        session.feed(altsvc + priority)
        session.service.release.set()
        await session.settle(session.ended(stream_id))

    ours, _ = await both(play)
    assert not ours.transport.closed and status(ours.streams[5]) == "0"


async def test_a_window_setting_past_the_largest_ends_the_connection_as_h2_ends_it() -> None:
    async def play(session: Session) -> None:
        stream_id = await held_call(session, end=True)
        session.feed(raw_frame(8, 0, stream_id, (90).to_bytes(4, "big")))  # 2**31 - 10 now
        setting = (4).to_bytes(2, "big") + (2**31 - 1).to_bytes(4, "big")  # INITIAL_WINDOW_SIZE
        session.feed(raw_frame(4, 0, 0, setting))

    ours, _ = await both(play, window=2**31 - 100)
    assert ours.transport.closed and ours.service.lane_calls == 1


async def test_a_call_depending_on_itself_ends_the_connection_as_h2_ends_it() -> None:
    async def play(session: Session) -> None:
        await warm(session, ECHO)
        stream_id = session.client.get_next_available_stream_id()
        block = session.client.encoder.encode([*HEADERS[:3], (":path", ECHO), *HEADERS[3:]])
        priority = stream_id.to_bytes(4, "big") + b"\x10"
        session.feed(raw_frame(1, 0x4 | 0x20, stream_id, priority + block))

    ours, _ = await both(play)
    assert ours.transport.closed


async def test_keepalive_pings_while_a_lane_call_is_open() -> None:
    """grpclib pings a client (every 2 hours by default) only while a call is open, and looks
    for them among h2's streams: it sees the lane's too."""
    for lanes in (True, False):
        session = Session(lanes)
        assert not session.protocol.connection._is_need_send_ping()  # no call open
        stream_id = await held_call(session, end=True)
        assert session.service.lane_calls == int(lanes)
        assert session.protocol.connection._is_need_send_ping()
        session.service.release.set()
        await session.settle(session.ended(stream_id))
        assert not session.protocol.connection._is_need_send_ping()


async def test_a_frame_past_the_size_limit_makes_every_later_byte_h2s() -> None:
    """h2 reads every byte after such a frame's header as its body until it has all of it (and
    then ends the connection): the lane serves nothing from those bytes either."""

    async def play(session: Session) -> None:
        await warm(session, ECHO)
        too_large = (FRAME + 1).to_bytes(3, "big") + bytes([0, 0]) + (1).to_bytes(4, "big")
        session.feed(too_large + b"\0" * 100)
        stream_id = session.open(ECHO)
        session.client.send_data(stream_id, message(b"x"), end_stream=True)
        session.send_out()
        await session.settle()

    ours, _ = await both(play)
    assert ours.service.calls == 2 and ours.service.lane_calls == 0


async def test_a_reset_for_what_was_received_leaves_while_writes_are_paused() -> None:
    async def play(session: Session) -> None:
        stream_id = await held_call(session, end=True)
        session.protocol.pause_writing()
        session.feed(raw_frame(0, 0x1, stream_id, message(b"late")))  # DATA after the end
        session._note(b"".join(session.transport.writes))
        assert (RST_STREAM, stream_id, h2.errors.ErrorCodes.STREAM_CLOSED) in session.sent
        session.protocol.resume_writing()
        session.transport.writes.clear()

    ours, _ = await both(play)
    assert ours.service.lane_calls == 1


@pytest.mark.parametrize(
    "frame",
    [
        raw_frame(8, 0, 5, (2**31 + 10).to_bytes(4, "big")),  # WINDOW_UPDATE, reserved bit set
        raw_frame(1, 0x5, 5, b"\x08"),  # trailers: :status 200 (an informational one: below)
        raw_frame(1, 0x5, 5, b"\x00\x07:status\x03100"),
        raw_frame(1, 0x5, 5, b"\x00\x0econtent-length\x02ab"),
        raw_frame(1, 0x5 | 0x8 | 0x20, 5, b"\x08" + bytes(4) + b"\x10" + bytes(4)),
    ],
    ids=["reserved bit", "status", "informational", "bad length", "padding over the block"],
)
async def test_malformed_frames_on_a_lane_stream_as_h2_takes_them(frame: bytes) -> None:
    async def play(session: Session) -> None:
        stream_id = await held_call(session, end=False)
        assert stream_id == 5
        session.feed(frame)
        await session.settle()

    await both(play)


async def test_a_lane_stream_is_freed_without_the_cyclic_collector() -> None:
    """grpclib frees a call's stream by reference counting (its buffer acks through the
    connection, not the stream): a lane stream too; and a lost connection lets its lane go."""
    session = Session(lanes=True)
    await warm(session, ECHO)
    gc.disable()
    try:
        for _ in range(5):
            stream_id = session.call(ECHO, b"x")
            await session.settle(session.ended(stream_id))
        await asyncio.sleep(0)
        session.protocol.handler.__gc_collect__()  # grpclib's own, every 10 calls: done tasks
        assert session.service.lane_calls == 5
        assert all(ref() is None for ref in session.service.raw_streams[-5:])
    finally:
        gc.enable()
    held = await held_call(session, end=True)
    lane = session.protocol.lane
    assert held in lane.streams
    session.protocol.connection_lost(None)
    assert session.protocol.lane is None and session.protocol.connection.lane is None
    assert not lane.streams and not lane._buffer


async def test_a_deadline_on_a_lane_call_ends_it_as_grpclib_ends_it() -> None:
    """A call with a deadline (grpc-timeout, its value changing each call) is the lane's; its
    deadline firing ends it as grpclib ends one (the timer's own cancel, as it fires)."""

    async def play(session: Session) -> None:
        await warm(session, WAIT)
        for calls, timeout in ((3, "100S"), (4, "99S")):
            stream_id = session.open(WAIT, [("grpc-timeout", timeout)])
            session.client.send_data(stream_id, message(b"held"), end_stream=True)
            await session.settle(lambda calls=calls: session.service.calls == calls)
        call = session.service.raw_streams[-1]()
        assert call is not None
        call.wrapper.cancel(TimeoutError("Deadline exceeded"))
        await session.settle(session.ended(stream_id))
        session.service.release.set()
        await session.settle()

    ours, _ = await both(play)
    assert ours.service.lane_calls == 2
    assert status(ours.streams[7]) == str(Status.DEADLINE_EXCEEDED.value)
    assert status(ours.streams[5]) == "0"


@pytest.mark.usefixtures("h2_limits")
async def test_a_new_stream_past_the_limit_is_refused_before_its_block_is_read() -> None:
    """h2 counts the streams before it reads a new one's header block: past the limit, a block
    it could not read (too large) ends the connection as too many streams."""

    async def play(session: Session) -> None:
        await at_the_limit(session)
        session.open(WAIT, [("x-big", "a" * 70_000)])
        session.send_out()

    ours, _ = await both(play)
    (kind, _, code), *_ = ours.outcome()[3]
    assert kind == GOAWAY and code == h2.errors.ErrorCodes.PROTOCOL_ERROR


@pytest.mark.usefixtures("h2_limits")
async def test_a_block_too_large_to_read_before_a_priority_on_itself() -> None:
    async def play(session: Session) -> None:
        await warm(session, ECHO)
        stream_id = session.client.get_next_available_stream_id()
        headers = [*HEADERS[:3], (":path", ECHO), *HEADERS[3:], ("x-big", "a" * 70_000)]
        block = session.client.encoder.encode(headers)
        priority = stream_id.to_bytes(4, "big") + b"\x10"
        session.feed(raw_frame(1, 0x4 | 0x20, stream_id, priority + block))

    ours, _ = await both(play)
    (kind, _, code), *_ = ours.outcome()[3]
    assert kind == GOAWAY and code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM


async def test_large_header_blocks_are_not_kept() -> None:
    """A connection keeps what it read of a block as hpack_cache.py keeps blocks: none past
    its 4 KiB (a client cannot make a connection hold much)."""

    async def play(session: Session) -> None:
        for n in range(4):
            stream_id = session.open(ECHO, [("x-big", "a" * (n + 1) * 3000)])
            session.client.send_data(stream_id, message(b"x"), end_stream=True)
            await session.settle(session.ended(stream_id))

    ours, _ = await both(play)
    assert ours.service.lane_calls == 4
    assert all(len(key[0]) <= KEPT_BYTES for key in ours.protocol.lane._headers)


@pytest.mark.parametrize("value", ["true", "false"])
async def test_the_lane_is_a_setting(value: str, tmp_path: Path) -> None:
    """`--grpc-lane` / TRITONACTOR_GRPC_LANE: `false` serves every call through h2."""
    env = {"TRITONACTOR_MODEL_REPOSITORY": str(tmp_path), "TRITONACTOR_GRPC_LANE": value}
    settings = Settings.from_env(env)
    served = SimpleNamespace(settings=settings, router=None)
    sock = listening_socket("gRPC", "127.0.0.1", 0)
    async with grpc_listener(served, sock) as listener:  # type: ignore[arg-type]
        assert listener is not None
        protocol = listener._protocol_factory()
        protocol.connection_made(Transport())  # type: ignore[arg-type]
        assert (protocol.lane is not None) is (value == "true")  # type: ignore[attr-defined]


def given_to_h2(session: Session, given: list[tuple[int, int]]) -> None:
    """(type, stream) of each frame the lane hands h2 from here on, to `given` (none without
    the lane)."""
    lane = session.protocol.lane  # type: ignore[attr-defined]
    if lane is None:
        return
    to_h2 = lane._to_h2

    def spy(data: bytes | bytearray) -> None:
        view = bytes(data)  # (whole frames)
        while len(view) >= 9:
            length = int.from_bytes(view[:3], "big")
            given.append((view[3], int.from_bytes(view[5:9], "big") & 0x7FFFFFFF))
            view = view[9 + length :]
        to_h2(data)

    lane._to_h2 = spy


async def test_the_connections_window_given_back_is_the_lanes_to_read() -> None:
    """A client gives the connection's window back after each answer: the lane reads that
    WINDOW_UPDATE itself, and an answer waiting for the connection's window goes on."""
    payload = bytes(range(256)) * 1024  # 256 KiB answers, past the connection's 64 KiB
    given: list[tuple[int, int]] = []

    async def play(session: Session) -> None:
        given_to_h2(session, given)
        for _ in range(3):
            stream_id = session.call(ECHO, payload)
            await session.settle(session.ended(stream_id))

    ours, _ = await both(play, window=2**24)  # the stream's window is not what holds it
    assert ours.service.lane_calls == 3
    assert ours.streams[5]["data"] == message(payload[::-1])
    # (the answers went past the connection's first window: the client gave it back)
    assert (WINDOW_UPDATE_TYPE, 0) not in given


@pytest.mark.parametrize(
    "payload",
    [
        (0).to_bytes(4, "big"),
        (2**31 + 5).to_bytes(4, "big"),
        (2**31 - 1).to_bytes(4, "big"),
        b"\0\0\x01",
        b"\0\0\0\x01\0",
    ],
    ids=["no increment", "reserved bit", "past the largest window", "short", "long"],
)
async def test_a_connection_window_update_h2_refuses_is_h2s_to_answer(payload: bytes) -> None:
    given: list[tuple[int, int]] = []

    async def play(session: Session) -> None:
        stream_id = await held_call(session, end=True)
        given_to_h2(session, given)
        session.feed(raw_frame(WINDOW_UPDATE_TYPE, 0, 0, payload))
        session.service.release.set()
        await session.settle()
        assert stream_id == 5

    ours, _ = await both(play)
    assert ours.transport.closed
    assert given == [(WINDOW_UPDATE_TYPE, 0)]


async def test_a_connection_window_update_in_a_header_block_is_h2s() -> None:
    async def play(session: Session) -> None:
        await warm(session, ECHO)
        session.feed(raw_frame(1, 0, 9, b"\x83"))  # HEADERS without END_HEADERS
        session.feed(raw_frame(WINDOW_UPDATE_TYPE, 0, 0, (10).to_bytes(4, "big")))
        await session.settle()

    ours, _ = await both(play)
    assert ours.transport.closed


async def test_a_connection_window_update_after_the_servers_goaway() -> None:
    """h2's connection is closed once the server sent its GOAWAY: a WINDOW_UPDATE then is a
    protocol error to h2, and to the lane."""
    given: list[tuple[int, int]] = []

    async def play(session: Session) -> None:
        stream_id = await held_call(session, end=True)
        session.protocol.connection._connection.close_connection()
        session.protocol.connection.flush()
        given_to_h2(session, given)
        session.feed(raw_frame(WINDOW_UPDATE_TYPE, 0, 0, (10).to_bytes(4, "big")))
        session.service.release.set()
        await session.settle()
        assert stream_id == 5

    # (the GOAWAY h2 makes for its protocol error is never sent: grpclib closes the connection)
    ours, _ = await both(play, unsent=False)
    assert given == [] and ours.transport.closed


async def test_an_h2_stream_waiting_for_the_connections_window_goes_on() -> None:
    """The connection's window, given back through the lane, reaches h2's streams too (a
    streaming call's answer waiting for it), as grpclib tells every stream."""
    payload = bytes(range(256)) * 1024  # past the connection's 64 KiB
    given: list[tuple[int, int]] = []

    async def play(session: Session) -> None:
        given_to_h2(session, given)
        # a call with a content-length is h2's (h2 holds its body to it)
        body = message(payload)
        stream_id = session.open(CHAT, [("content-length", str(len(body)))])
        session.bodies[stream_id] = body
        await session.settle(
            lambda: len(session.streams.get(stream_id, {}).get("data", b"")) > len(payload)
        )

    ours, _ = await both(play, window=2**24)
    assert ours.streams[1]["data"] == message(payload.upper())
    assert (WINDOW_UPDATE_TYPE, 0) not in given and ours.service.lane_calls == 0


async def test_a_reset_held_while_writes_are_paused_leaves_with_the_next_window_update() -> None:
    """What h2 holds to send (a reset made while writes were paused) is sent once a frame is
    read, as grpclib flushes after every read: a connection WINDOW_UPDATE the lane reads too."""
    given: list[tuple[int, int]] = []

    async def play(session: Session) -> None:
        stream_id = await held_call(session, end=False)
        session.protocol.pause_writing()
        raw_stream = session.service.raw_streams[-1]()
        raw_stream.reset_nowait(h2.errors.ErrorCodes.CANCEL)
        assert not session.transport.writes  # held
        given_to_h2(session, given)
        session.feed(raw_frame(WINDOW_UPDATE_TYPE, 0, 0, (10).to_bytes(4, "big")))
        session._note(b"".join(session.transport.writes))
        assert (RST_STREAM, stream_id, h2.errors.ErrorCodes.CANCEL) in session.sent
        session.protocol.resume_writing()
        session.transport.writes.clear()
        session.service.release.set()

    ours, _ = await both(play)
    assert given == [] and ours.service.lane_calls == 1


async def test_a_client_goaway_and_a_window_update_in_one_read() -> None:
    """h2 reads a read's frames together: a WINDOW_UPDATE after its GOAWAY is refused by h2
    (its connection closed by then), and the GOAWAY's events are lost with it."""

    async def play(session: Session) -> None:
        stream_id = await held_call(session, end=True)
        goaway = raw_frame(7, 0, 0, stream_id.to_bytes(4, "big") + bytes(4))
        session.feed(goaway + raw_frame(WINDOW_UPDATE_TYPE, 0, 0, (10).to_bytes(4, "big")))
        await session.settle()

    ours, _ = await both(play)
    assert ours.transport.closed


@pytest.mark.parametrize(
    "before", [b"", raw_frame(6, 0, 0, bytes(8))], ids=["alone", "after a ping"]
)
async def test_nothing_is_read_once_grpclib_closed_the_connection(before: bytes) -> None:
    """Once grpclib closed the connection on the client's GOAWAY, a WINDOW_UPDATE changes
    nothing and sends nothing, whether the lane would read it itself or hand it to h2."""
    session = Session(lanes=True)
    stream_id = await held_call(session, end=True)
    session.feed(raw_frame(7, 0, 0, stream_id.to_bytes(4, "big") + bytes(4)))  # GOAWAY
    assert session.transport.closed
    window = session.protocol.connection._connection.outbound_flow_control_window
    state = session.protocol.connection._connection.state_machine.state
    session.transport.writes.clear()
    session.protocol.data_received(before + raw_frame(8, 0, 0, (10).to_bytes(4, "big")))
    assert session.protocol.connection._connection.outbound_flow_control_window == window
    assert session.protocol.connection._connection.state_machine.state == state
    assert not session.transport.writes


def test_advance_skips_only_steps_that_change_nothing() -> None:
    """`frames.advance` skips h2's state step on an open server connection: for each input the
    lane gives, h2's step from there leaves the state as it is and does nothing else; in any
    other state h2 takes the step (a closed connection refuses the frame)."""
    machine = h2.connection.H2ConnectionStateMachine
    open_ = h2.connection.ConnectionState.SERVER_OPEN
    for input_ in LANE_INPUTS:
        assert machine._transitions[(open_, input_)] == (None, open_), input_  # type: ignore[attr-defined]

    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    conn.initiate_connection()
    assert conn.state_machine.state is h2.connection.ConnectionState.IDLE
    advance(conn, h2.connection.ConnectionInputs.RECV_HEADERS)  # h2's step: opens it
    assert conn.state_machine.state is open_
    for input_ in LANE_INPUTS:
        advance(conn, input_)
        assert conn.state_machine.state is open_
    conn.close_connection()
    closed = conn.state_machine.state
    for input_ in LANE_INPUTS:
        with pytest.raises(h2.exceptions.ProtocolError):
            advance(conn, input_)
        assert conn.state_machine.state is closed


def test_the_lane_gives_advance_only_its_inputs() -> None:
    """Every state step of the lane and its streams goes through `advance`, with one of
    `LANE_INPUTS`: an input outside them (GOAWAY's, say) would change an open connection's
    state, which `advance` does not look for."""
    grpc = Path(__file__).resolve().parents[2] / "tritonactor" / "frontends" / "grpc"
    allowed = {input_.name for input_ in LANE_INPUTS}
    seen = set()
    for name in ("lane.py", "lane_stream.py"):
        tree = ast.parse((grpc / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                assert node.attr != "process_input", f"{name}: h2's step taken directly"
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "advance":
                input_ = node.args[1]
                assert isinstance(input_, ast.Attribute) and input_.attr in allowed, name
                seen.add(input_.attr)
    assert seen == allowed
