"""Unary answers in one write (frontends/grpc/unary.py): the same frames and header fields as
grpclib's own answer, written once; what is not the common case goes out as grpclib sends it.

Each test serves one call on a server protocol fed by an h2 client in process, for a server
whose handlers answer through `unary_answers` and for a plain grpclib server, and compares
what the client receives."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import grpclib.const
import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
import pytest
from grpclib import GRPCError
from grpclib.const import Status
from grpclib.events import SendInitialMetadata, SendTrailingMetadata, listen
from grpclib.exceptions import ProtocolError
from grpclib.server import Stream

from tritonactor.frontends.drain import Drain
from tritonactor.frontends.grpc.connection import GrpcServer
from tritonactor.frontends.grpc.unary import (
    DEADLINE_MESSAGE,
    UnaryStream,
    WordedStream,
    unary_answers,
)

pytestmark = pytest.mark.anyio

METHOD = "/test.Echo/Echo"
WINDOW = 100  # bytes: a client's window smaller than the answers that test it
STREAMING = "/test.Echo/Chat"


class Raw:
    def __init__(self, data: bytes) -> None:
        self.data = data

    @classmethod
    def FromString(cls, data: bytes) -> Raw:
        return cls(data)

    def SerializeToString(self) -> bytes:
        return self.data


Answer = Callable[[Stream[Raw, Raw]], Any]


REQUEST_HEADERS = [
    (":method", "POST"),
    (":scheme", "http"),
    (":path", METHOD),
    (":authority", "test"),
    ("content-type", "application/grpc"),
    ("te", "trailers"),
]


async def reversed_echo(stream: Stream[Raw, Raw]) -> None:
    message = await stream.recv_message()
    await stream.send_message(Raw(message.data[::-1]))


async def later_reversed_echo(stream: Stream[Raw, Raw]) -> None:
    """`reversed_echo`, answering in a later loop turn than the one its request was read in
    (as an answer from the engine comes), where no cork gathers a turn's writes."""
    message = await stream.recv_message()
    await asyncio.sleep(0)
    await stream.send_message(Raw(message.data[::-1]))


class Service:
    def __init__(self, answer: Answer, one_write: bool) -> None:
        self.answer = answer
        self.one_write = one_write
        self.classes: list[type] = []
        self.streams: list[Stream[Raw, Raw]] = []
        self.returned = False
        self.deadline_fired = False

    async def handle(self, stream: Stream[Raw, Raw]) -> None:
        self.classes.append(type(stream))
        self.streams.append(stream)
        await self.answer(stream)
        self.returned = True

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        mapping = {
            METHOD: grpclib.const.Handler(
                self.handle, grpclib.const.Cardinality.UNARY_UNARY, Raw, Raw
            )
        }
        return unary_answers(mapping) if self.one_write else mapping


class Transport:
    """Records the server's writes."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def writelines(self, pieces: list[Any]) -> None:  # (one system call, as uvloop's)
        self.writes.append(b"".join(memoryview(piece).cast("B") for piece in pieces))

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def is_closing(self) -> bool:
        return False


async def call(
    answer: Answer,
    one_write: bool,
    payload: bytes = b"abc",
    window: int | None = None,
    headers: tuple[tuple[str, str], ...] = (),
    paused_until: Callable[[Service], bool] | None = None,
    serve: Callable[[Service], Any] = lambda service: service,
    on_server: Callable[[GrpcServer], None] = lambda server: None,
    gives_window: bool = True,
    each_turn: Callable[[Service, bytes], None] = lambda service, data: None,
) -> tuple[list[tuple[str, Any]], int, Service]:
    """One unary call of METHOD carrying `payload`: what the client received (its events,
    the answer's DATA joined), how many writes the answer took, and the service.

    `headers` are added to the request's; with `paused_until`, the server's transport is
    paused (its buffer full) from the request on until `paused_until(service)` holds; `serve`
    turns the service into what the server serves; `on_server` sees the server first; a client
    that `gives_window` back gives it as it reads; `each_turn` sees the service and the data
    received so far at each turn of the loop."""
    service = Service(answer, one_write)
    server = GrpcServer([serve(service)])
    on_server(server)
    protocol = server._protocol_factory()
    transport = Transport()
    protocol.connection_made(transport)  # type: ignore[arg-type]
    client = h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
    )
    if window is not None:
        client.local_settings = h2.settings.Settings(
            client=True, initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window}
        )
    client.initiate_connection()
    received: list[tuple[str, Any]] = []
    data = bytearray()
    ended = False

    def exchange() -> None:
        nonlocal ended
        while True:
            pending, transport.writes[:] = b"".join(transport.writes), []
            for event in client.receive_data(pending):
                if isinstance(event, h2.events.ResponseReceived):
                    received.append(("headers", event.headers))
                elif isinstance(event, h2.events.DataReceived):
                    data.extend(event.data)
                    if gives_window:  # given back as the client reads, as a client does
                        client.acknowledge_received_data(
                            event.flow_controlled_length, event.stream_id
                        )
                        with contextlib.suppress(h2.exceptions.StreamClosedError):  # answered
                            client.increment_flow_control_window(event.flow_controlled_length, 1)
                elif isinstance(event, h2.events.TrailersReceived):
                    received.append(("trailers", event.headers))
                elif isinstance(event, h2.events.StreamEnded):
                    ended = True
                elif isinstance(event, h2.events.StreamReset):
                    received.append(("reset", event.error_code))
                    ended = True
            out = client.data_to_send()
            if out:
                protocol.data_received(out)
            if not out and not transport.writes:
                return

    exchange()
    client.send_headers(
        1,
        [*REQUEST_HEADERS, *headers],
    )
    client.send_data(1, b"\0" + len(payload).to_bytes(4, "big") + payload, end_stream=True)
    paused = paused_until is not None
    if paused:
        protocol.pause_writing()
    protocol.data_received(client.data_to_send())
    writes = 0
    for _ in range(1000):  # loop iterations, not time: the handler needs a few
        await asyncio.sleep(0)
        each_turn(service, bytes(data))
        if paused and paused_until(service):  # type: ignore[misc]
            paused = False
            protocol.resume_writing()
        writes += len(transport.writes)
        exchange()
        if ended:
            break
    assert ended, received
    received.append(("data", bytes(data)))
    return received, writes, service


def grpc_message(payload: bytes) -> bytes:
    return b"\0" + len(payload).to_bytes(4, "big") + payload


async def test_a_unary_answer_is_one_write_of_grpclibs_frames() -> None:
    ours, our_writes, service = await call(later_reversed_echo, one_write=True)
    theirs, their_writes, plain = await call(later_reversed_echo, one_write=False)
    assert ours == theirs
    assert ours[-1] == ("data", grpc_message(b"cba"))
    assert [kind for kind, _ in ours] == ["headers", "trailers", "data"]
    assert (our_writes, their_writes) == (1, 3)
    assert service.classes == [UnaryStream] and plain.classes == [Stream]


async def test_the_answers_of_calls_one_read_began_go_together() -> None:
    """Two calls in one read: grpclib's frames for both, written one by one in the loop turn
    that the read began, go in one write (the connection's cork holds them, core/cork.py);
    one call alone in a read is written as it always was."""

    async def writes_for(calls: int) -> tuple[list[bytes], dict[int, bytes]]:
        protocol = GrpcServer([Service(reversed_echo, one_write=False)])._protocol_factory()
        transport = Transport()
        protocol.connection_made(transport)  # type: ignore[arg-type]
        client = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        )
        client.initiate_connection()
        protocol.data_received(client.data_to_send())
        client.receive_data(b"".join(transport.writes))
        transport.writes.clear()
        for stream_id in range(1, 2 * calls, 2):
            client.send_headers(stream_id, REQUEST_HEADERS)
            message = str(stream_id).encode() * 3
            client.send_data(stream_id, grpc_message(message), end_stream=True)
        protocol.data_received(client.data_to_send())  # the calls, in one read
        answers: dict[int, bytes] = {}
        seen = 0
        for _ in range(1000):  # loop iterations, not time: the handlers need a few
            await asyncio.sleep(0)
            for event in client.receive_data(b"".join(transport.writes[seen:])):
                if isinstance(event, h2.events.DataReceived):
                    answers[event.stream_id] = event.data
            seen = len(transport.writes)
            if len(answers) == calls:
                break
        return list(transport.writes), answers

    together, answers = await writes_for(2)
    assert len(together) == 1 and answers == {1: grpc_message(b"111"), 3: grpc_message(b"333")}
    alone, answers = await writes_for(1)
    assert len(alone) == 3 and answers == {1: grpc_message(b"111")}


async def test_an_error_is_grpclibs_trailers_only_answer() -> None:
    async def refuse(stream: Stream[Raw, Raw]) -> None:
        await stream.recv_message()
        raise GRPCError(Status.INVALID_ARGUMENT, "no, and 100% sure")

    ours, _, _ = await call(refuse, one_write=True)
    theirs, _, _ = await call(refuse, one_write=False)
    assert ours == theirs
    (kind, headers), *_ = ours
    assert kind == "headers" and ("grpc-status", "3") in headers


async def test_a_status_after_the_message_follows_it_as_grpclib_sends_it() -> None:
    async def answer_then_fail(stream: Stream[Raw, Raw]) -> None:
        await stream.recv_message()
        await stream.send_message(Raw(b"partial"))
        await stream.send_trailing_metadata(status=Status.ABORTED, status_message="stopped")

    ours, _, _ = await call(answer_then_fail, one_write=True)
    theirs, _, _ = await call(answer_then_fail, one_write=False)
    assert ours == theirs
    assert ("grpc-status", str(Status.ABORTED.value)) in dict(ours)["trailers"]


async def test_initial_metadata_from_the_handler_goes_out_as_grpclib_sends_it() -> None:
    async def with_metadata(stream: Stream[Raw, Raw]) -> None:
        message = await stream.recv_message()
        await stream.send_initial_metadata(metadata={"x-answer": "yes"})
        await stream.send_message(Raw(message.data))

    ours, our_writes, _ = await call(with_metadata, one_write=True)
    theirs, their_writes, _ = await call(with_metadata, one_write=False)
    assert ours == theirs
    assert ("x-answer", "yes") in dict(ours)["headers"]
    assert our_writes == their_writes


async def test_an_answer_larger_than_the_window_goes_out_as_the_window_allows() -> None:
    payload = bytes(range(256)) * 8  # 2 KiB, the client's window 100 bytes
    ours, our_writes, _ = await call(reversed_echo, one_write=True, payload=payload, window=100)
    theirs, _, _ = await call(reversed_echo, one_write=False, payload=payload, window=100)
    assert ours == theirs
    assert ours[-1] == ("data", grpc_message(payload[::-1]))
    assert our_writes > 3  # in pieces, each as the client gave the window back


async def test_only_unary_handlers_answer_in_one_write() -> None:
    async def chat(stream: Stream[Raw, Raw]) -> None:
        pass

    streaming = grpclib.const.Handler(chat, grpclib.const.Cardinality.STREAM_STREAM, Raw, Raw)
    unary = grpclib.const.Handler(chat, grpclib.const.Cardinality.UNARY_UNARY, Raw, Raw)
    wrapped = unary_answers({STREAMING: streaming, METHOD: unary})
    assert wrapped[STREAMING].cardinality is grpclib.const.Cardinality.STREAM_STREAM
    assert wrapped[STREAMING].func is not chat  # (its stream only words a deadline)
    assert wrapped[METHOD].func is not chat


def status_of(received: list[tuple[str, Any]]) -> str:
    """The grpc-status the client got: from the trailers, or a trailers-only answer."""
    kinds = dict(received)
    return dict(kinds.get("trailers") or kinds["headers"])["grpc-status"]


async def test_an_answer_between_frame_size_and_window_goes_out_in_frames() -> None:
    # 20 KiB: within the stream's window (64 KiB), beyond the client's frame size (16 KiB)
    payload = bytes(range(256)) * 80
    ours, _, _ = await call(reversed_echo, one_write=True, payload=payload)
    theirs, _, _ = await call(reversed_echo, one_write=False, payload=payload)
    assert ours == theirs
    assert ours[-1] == ("data", grpc_message(payload[::-1]))
    assert status_of(ours) == "0"


async def test_trailing_metadata_after_the_message_goes_out_as_grpclib_sends_it() -> None:
    async def with_trailers(stream: Stream[Raw, Raw]) -> None:
        await stream.recv_message()
        await stream.send_message(Raw(b"answer"))
        await stream.send_trailing_metadata(metadata={"x-trailer": "kept"})

    ours, _, _ = await call(with_trailers, one_write=True)
    theirs, _, _ = await call(with_trailers, one_write=False)
    assert ours == theirs
    assert ("x-trailer", "kept") in dict(ours)["trailers"]
    assert ours[-1] == ("data", grpc_message(b"answer"))


async def test_a_second_message_is_refused_as_grpclib_refuses_it() -> None:
    refusals: list[str] = []

    async def twice(stream: Stream[Raw, Raw]) -> None:
        await stream.recv_message()
        await stream.send_message(Raw(b"one"))
        try:
            await stream.send_message(Raw(b"two"))
        except ProtocolError as error:
            refusals.append(str(error))

    ours, _, _ = await call(twice, one_write=True)
    theirs, _, _ = await call(twice, one_write=False)
    assert ours == theirs
    assert ours[-1] == ("data", grpc_message(b"one"))
    assert len(refusals) == 2 and refusals[0] == refusals[1]


async def test_a_cancel_after_the_message_sends_it_then_resets() -> None:
    async def answer_then_cancel(stream: Stream[Raw, Raw]) -> None:
        await stream.recv_message()
        await stream.send_message(Raw(b"sent"))
        await stream.cancel()

    ours, _, _ = await call(answer_then_cancel, one_write=True)
    theirs, _, _ = await call(answer_then_cancel, one_write=False)
    assert ours == theirs
    assert [kind for kind, _ in ours] == ["headers", "reset", "data"]
    assert ours[-1] == ("data", grpc_message(b"sent"))


def worded(received: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """grpclib's answer to a call past its deadline as ours words it: Triton's message beside
    the status (grpclib sends the status alone)."""
    return [
        (kind, [*fields, ("grpc-message", DEADLINE_MESSAGE)])
        if kind in ("headers", "trailers") and ("grpc-status", "4") in fields
        else (kind, fields)
        for kind, fields in received
    ]


def deadline_fires(service: Service) -> None:
    """What the call's deadline timer does when it fires (grpclib.utils.DeadlineWrapper)."""
    service.streams[0]._stream.wrapper.cancel(TimeoutError("Deadline exceeded"))


async def test_a_deadline_while_the_answer_waits_for_the_socket_is_grpclibs_answer() -> None:
    """The socket's buffer is full when the answer is due. grpclib's handler is blocked before
    its headers; ours has returned, its answer kept: a deadline then ends both the same way, a
    trailers-only DEADLINE_EXCEEDED, and nothing kept goes out after it."""

    def deadline_once_blocked(one_write: bool) -> Callable[[Service], bool]:
        def fire(service: Service) -> bool:
            if not service.streams or (one_write and not service.returned):
                return False
            deadline_fires(service)
            return True

        return fire

    timeout = (("grpc-timeout", "100S"),)
    ours, _, service = await call(
        reversed_echo, True, headers=timeout, paused_until=deadline_once_blocked(True)
    )
    theirs, _, _ = await call(
        reversed_echo, False, headers=timeout, paused_until=deadline_once_blocked(False)
    )
    assert ours == worded(theirs)
    assert status_of(ours) == str(Status.DEADLINE_EXCEEDED.value)
    assert [kind for kind, _ in ours] == ["headers", "data"] and ours[-1] == ("data", b"")
    assert service.classes == [UnaryStream]


async def test_a_failure_after_a_large_message_is_still_under_the_deadline() -> None:
    """A handler fails after sending a message larger than the client's window, and the client
    gives no window back: the message is written inside the handler's deadline, as grpclib
    writes it, so the deadline ends the call (rather than a wait for the window without end)."""

    async def answer_then_fail(stream: Stream[Raw, Raw]) -> None:
        message = await stream.recv_message()
        await stream.send_message(Raw(message.data))
        raise GRPCError(Status.INTERNAL, "failed after answering")

    def deadline_once_the_window_is_spent(service: Service, data: bytes) -> None:
        if len(data) == WINDOW and not service.returned and not service.deadline_fired:
            service.deadline_fired = True
            deadline_fires(service)

    payload = bytes(range(256)) * 8  # 2 KiB
    answers = [
        await call(
            answer_then_fail,
            one_write,
            payload=payload,
            window=WINDOW,
            gives_window=False,
            headers=(("grpc-timeout", "100S"),),
            each_turn=deadline_once_the_window_is_spent,
        )
        for one_write in (True, False)
    ]
    (ours, _, service), (theirs, _, _) = answers
    assert ours == worded(theirs)
    assert status_of(ours) == str(Status.DEADLINE_EXCEEDED.value)
    assert ours[-1] == ("data", grpc_message(payload)[:WINDOW])
    assert service.deadline_fired and service.classes == [UnaryStream]


@pytest.mark.parametrize("one_write", [True, False])
async def test_the_drains_exit_timeout_while_the_answer_waits_for_the_socket(
    one_write: bool,
) -> None:
    """The drain's exit timeout (0 s: at once) while the answer waits for a full socket buffer:
    trailers-only UNAVAILABLE from both servers."""
    drain = Drain(exit_timeout=0.0)
    drain.open()
    waits: list[asyncio.Task[None]] = []

    def expire_once_blocked(service: Service) -> bool:
        if not waits and service.streams and (service.returned or not one_write):
            waits.append(asyncio.ensure_future(drain.wait()))
        return bool(waits) and drain.expired

    got, _, _ = await call(
        reversed_echo, one_write, paused_until=expire_once_blocked, serve=drain.grpc_service
    )
    await waits[0]
    assert status_of(got) == str(Status.UNAVAILABLE.value)
    assert [kind for kind, _ in got] == ["headers", "data"] and got[-1] == ("data", b"")
    assert drain.in_flight == 0


async def test_the_drain_waits_for_an_answer_still_being_written() -> None:
    drain = Drain(exit_timeout=60.0)
    drain.open()
    in_flight_once_returned: list[int] = []

    def returned(service: Service) -> bool:
        if service.returned:
            in_flight_once_returned.append(drain.in_flight)
        return service.returned

    ours, _, _ = await call(
        reversed_echo, one_write=True, paused_until=returned, serve=drain.grpc_service
    )
    assert in_flight_once_returned == [1]  # the answer, not yet written, still counts
    assert ours[-1] == ("data", grpc_message(b"cba")) and status_of(ours) == "0"
    assert drain.in_flight == 0


async def test_metadata_listeners_see_each_step_as_grpclib_takes_it() -> None:
    seen: list[str] = []

    async def initial(event: SendInitialMetadata) -> None:
        seen.append("initial")

    async def trailing(event: SendTrailingMetadata) -> None:
        seen.append("trailing")

    def listening(server: GrpcServer) -> None:
        listen(server, SendInitialMetadata, initial)
        listen(server, SendTrailingMetadata, trailing)

    ours, our_writes, service = await call(later_reversed_echo, one_write=True, on_server=listening)
    theirs, _, _ = await call(later_reversed_echo, one_write=False)
    assert ours == theirs
    assert seen == ["initial", "trailing"]
    assert service.classes == [WordedStream] and our_writes == 3
