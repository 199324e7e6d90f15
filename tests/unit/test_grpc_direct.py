"""ModelInfer answered by the lane (frontends/grpc/direct.py) as grpclib's request handler and the
service's wrappers answer it.

Each test plays the same client frames (tests/unit/test_grpc_lane.py's in-process h2 client)
to a connection whose lane takes ModelInfer itself and to one whose lane hands it to grpclib,
both serving the real `InferenceService` (its `_model_infer`, `infer_call` and wrappers, its
`direct_infer()`) over a `model_infer` of the test's, and compares what the client gets back
and what the model saw; it also checks which path took the calls (a parity test where the
direct path took nothing would pass for nothing).
"""

from __future__ import annotations

import asyncio
import logging
import mmap
import pickle
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpclib.server
import h2.errors
import numpy as np
import pytest
from grpclib.const import Status
from grpclib.events import RecvRequest, listen

from tests.unit.test_grpc_lane import Session, message, status
from tritonactor._proto_c.grpc_service_pb2 import ModelInferRequest, ModelInferResponse
from tritonactor.core.errors import invalid_arg
from tritonactor.core.tensors import HeldView
from tritonactor.frontends.drain import Drain
from tritonactor.frontends.grpc import direct as direct_module
from tritonactor.frontends.grpc import limits
from tritonactor.frontends.grpc.direct import MODEL_INFER
from tritonactor.frontends.grpc.lane_stream import LaneStream
from tritonactor.frontends.grpc.service import InferenceService
from tritonactor.frontends.grpc.status import translate_errors
from tritonactor.frontends.grpc.wire import InferRequestMessage, InferResponseMessage
from tritonactor.observability.logging import REQUESTS
from tritonactor.settings import Settings

pytestmark = pytest.mark.anyio


class Infer(InferenceService):
    """The real service's ModelInfer paths over a model that answers by its name: `wait` until
    released, `fail` (a TritonError), `boom` (a bug), `big` (a 200 KB output), else an echo."""

    def __init__(self, settings: Settings, drain: Drain | None = None) -> None:
        server = SimpleNamespace(
            settings=settings, router=SimpleNamespace(loader=None), tracing=None
        )
        super().__init__(server, drain)  # type: ignore[arg-type]
        self.calls = 0
        self.grpclib_calls = 0
        self.cancelled = 0
        self.release = asyncio.Event()
        self.seen: list[tuple[str, Any]] = []
        self.readonly: list[bool] = []  # echo_raw's request contents: read-only each
        self.owners: list[tuple[str, int]] = []  # and what their memory belongs to

    async def _model_infer(self, stream: grpclib.server.Stream[Any, Any]) -> None:
        self.grpclib_calls += 1
        await super()._model_infer(stream)

    @translate_errors
    async def model_infer(
        self, message: InferRequestMessage, trace: Any = None, metadata: Any = None
    ) -> InferResponseMessage:
        self.calls += 1
        name = message.model_name
        # the metadata as the real model_infer reads it: only where a header is forwarded
        forwarded = self._headers.enabled and metadata is not None
        self.seen.append((name, sorted(metadata.items()) if forwarded else None))
        if name == "wait":
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        elif name == "stubborn":  # turns its cancel into an error of its own
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise invalid_arg("cancelled, and said otherwise") from None
        elif name == "fail":
            raise invalid_arg("no such input 'X', as asked")
        elif name == "boom":
            raise RuntimeError("a bug")
        raw: list[Any] = [b"\x07" * 200_000] if name == "big" else []
        if name == "echo_raw":  # the request's raw contents as they came, answered as they are
            self.readonly += [memoryview(entry).readonly for entry in message.raw]
            self.owners += [
                (type(memoryview(entry).obj).__name__, len(memoryview(entry).obj))
                for entry in message.raw
            ]
            raw = [np.frombuffer(entry, np.uint8) for entry in message.raw]
        return InferResponseMessage(ModelInferResponse(model_name=name, id=message.id), raw)


def settings(tmp_path: Path, **env: str) -> Settings:
    values = {"TRITONACTOR_MODEL_REPOSITORY": str(tmp_path)}
    values.update({f"TRITONACTOR_{key.upper()}": value for key, value in env.items()})
    return Settings.from_env(values)


def request(model: str, request_id: str = "") -> bytes:
    return ModelInferRequest(model_name=model, id=request_id).SerializeToString()


def infer(session: Session, model: str, extra: list[tuple[str, str]] | None = None) -> int:
    """A ModelInfer call of `model`, its message sent whole (without pumping)."""
    stream_id = session.open(MODEL_INFER, extra)
    session.bodies[stream_id] = message(request(model, f"id-{stream_id}"))
    session._send_body(stream_id, session.bodies[stream_id])
    return stream_id


def answer(entry: dict[str, Any]) -> ModelInferResponse:
    data = entry["data"]
    assert data[0] == 0 and int.from_bytes(data[1:5], "big") == len(data) - 5
    return ModelInferResponse.FromString(data[5:])


async def both(
    play: Any, tmp_path: Path, env: dict[str, str] | None = None, drain: bool = False, **kwargs: Any
) -> tuple[Session, Session]:
    """`play` on a connection whose lane answers ModelInfer itself, and on one whose lane hands
    it to grpclib: what the clients get and what the model sees are equal."""
    sessions = []
    for direct in (True, False):
        the_drain = Drain(exit_timeout=0) if drain else None
        service = Infer(settings(tmp_path, **(env or {})), the_drain)
        served = the_drain.grpc_service(service) if the_drain is not None else service
        session = Session(
            True, service=served, direct=service.direct_infer() if direct else None, **kwargs
        )
        session.service = session.infer = service  # type: ignore[attr-defined]
        session.drain = the_drain  # type: ignore[attr-defined]
        await play(session)
        await session.settle()
        sessions.append(session)
    ours, theirs = sessions
    assert ours.outcome()[1:] == theirs.outcome()[1:]
    assert counters(ours) == counters(theirs)
    assert streams(ours) == streams(theirs)
    assert ours.infer.seen == theirs.infer.seen  # type: ignore[attr-defined]
    return ours, theirs


def counters(session: Session) -> tuple[int, ...]:
    """grpclib's counts of the connection's streams, messages and data."""
    connection = session.protocol.connection
    names = (
        "streams_started",
        "streams_succeeded",
        "streams_failed",
        "messages_sent",
        "messages_received",
        "data_sent",
        "data_received",
    )
    return tuple(getattr(connection, name) for name in names)


def streams(session: Session) -> dict[int, dict[str, Any]]:
    return dict(sorted(session.streams.items()))


def direct_calls(session: Session) -> int:
    """How many calls reached the model by the direct path (none may have gone grpclib's)."""
    infer: Infer = session.infer  # type: ignore[attr-defined]
    return infer.calls if not infer.grpclib_calls else -infer.grpclib_calls


async def test_calls_in_turn_and_together_are_answered_as_grpclib_answers_them(
    tmp_path: Path,
) -> None:
    async def play(session: Session) -> None:
        for model in ("a", "b", "c"):
            stream_id = infer(session, model)
            await session.settle(session.ended(stream_id))
        ids = [infer(session, f"m{n}") for n in range(5)]
        await session.settle(session.ended(*ids))

    for split in (None, 1, 7):
        ours, _ = await both(play, tmp_path, split=split)
        assert direct_calls(ours) == 8, split
        assert answer(ours.streams[1]).model_name == "a"
        assert answer(ours.streams[1]).id == "id-1"
        assert all(status(entry) == "0" for entry in ours.streams.values())
        assert not ours.protocol.lane.streams  # type: ignore[attr-defined]
        assert not ours.protocol.processor.streams  # every call let its stream go


async def test_errors_are_grpclibs_trailers_only_answers(tmp_path: Path) -> None:
    async def play(session: Session) -> None:
        for model in ("fail", "boom"):
            stream_id = infer(session, model)
            await session.settle(session.ended(stream_id))

    ours, _ = await both(play, tmp_path)
    assert direct_calls(ours) == 2
    failed, broken = ours.streams[1], ours.streams[3]
    assert "data" not in failed and "trailers" not in failed
    assert dict(failed["headers"])["grpc-status"] == str(Status.INVALID_ARGUMENT.value)
    assert dict(failed["headers"])["grpc-message"] == "no such input 'X', as asked"
    assert dict(broken["headers"])["grpc-status"] == str(Status.INTERNAL.value)


@pytest.mark.parametrize(
    "body",
    [
        b"",  # no message: the handler's assertion, UNKNOWN
        b"\0\0\0",  # a prefix cut short
        b"\0\0\0\0\x10abc",  # a message cut short
        b"\1\0\0\0\3abc",  # compressed
        b"\0\0\0\0\3\xff\xff\xff",  # not a ModelInferRequest
        message(b"x" * 600),  # past the limit
    ],
    ids=["empty", "short prefix", "short message", "compressed", "garbage", "too large"],
)
async def test_bad_messages_are_refused_as_limits_refuses_them(tmp_path: Path, body: bytes) -> None:
    async def play(session: Session) -> None:
        stream_id = session.open(MODEL_INFER)
        session.client.send_data(stream_id, body, end_stream=True)
        await session.settle(session.ended(stream_id))

    ours, theirs = await both(play, tmp_path, {"grpc_max_message_size": "500"})
    assert ours.infer.calls == ours.infer.grpclib_calls == 0  # type: ignore[attr-defined]
    assert theirs.infer.grpclib_calls == 1  # type: ignore[attr-defined]
    assert status(ours.streams[1]) != "0"


async def test_a_message_past_the_limit_is_refused_before_the_client_ends(tmp_path: Path) -> None:
    """Refused from its prefix while the client still sends: the stream is then reset, as
    grpclib resets it after a failure."""

    async def play(session: Session) -> None:
        stream_id = session.open(MODEL_INFER)
        session.client.send_data(stream_id, message(b"x" * 600)[:100])
        await session.settle(session.ended(stream_id))

    ours, _ = await both(play, tmp_path, {"grpc_max_message_size": "500"})
    entry = ours.streams[1]
    assert dict(entry["headers"])["grpc-status"] == str(Status.RESOURCE_EXHAUSTED.value)
    assert entry["reset"] == h2.errors.ErrorCodes.NO_ERROR
    assert (3, 1, 0) in ours.sent


async def test_a_client_reset_cancels_the_call(tmp_path: Path) -> None:
    async def play(session: Session) -> None:
        stream_id = infer(session, "wait")
        await session.settle(lambda: session.infer.calls == 1)  # type: ignore[attr-defined]
        session.client.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
        await session.settle(lambda: session.infer.cancelled == 1)  # type: ignore[attr-defined]
        after = infer(session, "after")
        await session.settle(session.ended(after))

    ours, theirs = await both(play, tmp_path)
    assert direct_calls(ours) == 2
    assert theirs.infer.cancelled == 1  # type: ignore[attr-defined]
    assert "headers" not in ours.streams.get(1, {}) and status(ours.streams[3]) == "0"
    assert not ours.protocol.processor.streams


@pytest.mark.parametrize(
    ("model", "logged"),
    [("wait", "Deadline exceeded"), ("stubborn", "Failed to handle cancellation")],
)
async def test_a_deadline_ends_the_call_as_grpclib_ends_it(
    tmp_path: Path, model: str, logged: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Its timer's own cancel, fired by hand (not by the clock), as test_grpc_lane does; a
    model that turns the cancel into an error of its own still ends DEADLINE_EXCEEDED."""

    async def play(session: Session) -> None:
        stream_id = infer(session, model, [("grpc-timeout", "100S")])
        await session.settle(lambda: session.infer.calls == 1)  # type: ignore[attr-defined]
        lane_stream = session.protocol.lane.streams[stream_id]  # type: ignore[attr-defined]
        lane_stream.wrapper.cancel(TimeoutError("Deadline exceeded"))
        await session.settle(session.ended(stream_id))

    caplog.set_level(logging.INFO, "grpclib.server")
    ours, _ = await both(play, tmp_path)
    assert direct_calls(ours) == 1
    assert status(ours.streams[1]) == str(Status.DEADLINE_EXCEEDED.value)
    # in Triton's words (grpclib sends the status alone: clients showed an empty message)
    assert dict(ours.streams[1]["headers"])["grpc-message"] == "Deadline Exceeded"
    assert ours.infer.cancelled == 1  # type: ignore[attr-defined]
    assert [record.getMessage() for record in caplog.records].count(logged) == 2  # both paths


async def test_a_timeout_grpclib_cannot_read_is_grpclibs(tmp_path: Path) -> None:
    async def play(session: Session) -> None:
        stream_id = infer(session, "a", [("grpc-timeout", "soon")])
        await session.settle(session.ended(stream_id))

    ours, _ = await both(play, tmp_path)
    assert status(ours.streams[1]) == str(Status.UNKNOWN.value)
    assert dict(ours.streams[1]["headers"])["grpc-message"] == "Invalid grpc-timeout header"


async def test_a_deadline_past_when_the_call_begins(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The one difference chosen: DEADLINE_EXCEEDED, logged as a deadline that fires (INFO),
    where grpclib logs "Timeout occurred" with a traceback and answers UNKNOWN."""
    caplog.set_level(logging.INFO, "grpclib.server")
    outcomes = []
    for direct in (True, False):
        service = Infer(settings(tmp_path))
        session = Session(True, service=service, direct=service.direct_infer() if direct else None)
        caplog.clear()
        stream_id = infer(session, "a", [("grpc-timeout", "0n")])
        await session.settle(session.ended(stream_id))
        logged = [
            (r.levelname, r.getMessage()) for r in caplog.records if r.name == "grpclib.server"
        ]
        outcomes.append((status(session.streams[stream_id]), logged, service.calls))
        assert not session.protocol.processor.streams
    assert outcomes[0] == (str(Status.DEADLINE_EXCEEDED.value), [("INFO", "Deadline exceeded")], 0)
    assert outcomes[1] == (str(Status.UNKNOWN.value), [("ERROR", "Timeout occurred")], 0)


async def test_headers_grpclib_looks_at_are_grpclibs(tmp_path: Path) -> None:
    """Another method, content type (or subtype), no `te: trailers`: grpclib answers them."""
    base = [(":scheme", "http"), (":authority", "test"), (":path", MODEL_INFER)]
    calls = [
        [(":method", "POST"), *base, ("content-type", "application/grpc+json"), ("te", "trailers")],
        [(":method", "POST"), *base, ("content-type", "text/plain"), ("te", "trailers")],
        [(":method", "POST"), *base, ("content-type", "application/grpc")],
        [(":method", "PUT"), *base, ("content-type", "application/grpc"), ("te", "trailers")],
    ]

    async def play(session: Session) -> None:
        for headers in calls:
            stream_id = session.client.get_next_available_stream_id()
            session.client.send_headers(stream_id, headers)
            session.client.send_data(stream_id, message(request("a")), end_stream=True)
            await session.settle(session.ended(stream_id))

    ours, _ = await both(play, tmp_path)
    assert ours.infer.calls == 0  # type: ignore[attr-defined]
    statuses = [dict(entry["headers"])[":status"] for entry in ours.streams.values()]
    assert statuses == ["415", "415", "400", "405"]


async def test_a_large_answer_waits_for_the_clients_window(tmp_path: Path) -> None:
    async def play(session: Session) -> None:
        for _ in range(2):
            stream_id = infer(session, "big")
            await session.settle(session.ended(stream_id))

    ours, _ = await both(play, tmp_path, window=20_000)
    assert direct_calls(ours) == 2
    assert answer(ours.streams[3]).raw_output_contents == [b"\x07" * 200_000]


async def test_a_large_answer_that_fits_goes_in_one_write_of_its_pieces(tmp_path: Path) -> None:
    """Where the client's windows and frame size take the whole answer, its headers, message
    and trailers go in one `writelines`, the tensor's bytes a buffer of their own (not copied
    into the frame), and the client reads the same answer as grpclib's."""

    async def play(session: Session) -> None:
        for _ in range(2):
            stream_id = infer(session, "big")
            await session.settle(session.ended(stream_id))

    ours, _ = await both(play, tmp_path, window=1 << 20, frame=1 << 20)
    assert direct_calls(ours) == 2
    assert answer(ours.streams[3]).raw_output_contents == [b"\x07" * 200_000]
    # one write an answer: the headers and the DATA frame's header, the message's head, the
    # entry's prefix, the entry, and the trailers (after what h2 had to send, if anything)
    assert len(ours.transport.pieces) == 2  # type: ignore[attr-defined]
    assert all(count >= 5 for count in ours.transport.pieces)  # type: ignore[attr-defined]


async def test_a_large_request_is_read_in_place_and_its_contents_are_read_only(
    tmp_path: Path,
) -> None:
    """A request message in one large DATA frame is read as a view of what the socket read
    (or of the lane's buffer, where the frame came in several reads), read-only either way;
    the answer echoing its contents is the same as grpclib's."""
    contents = bytes(range(256)) * 400  # 100 KiB
    body = ModelInferRequest(model_name="echo_raw", id="x", raw_input_contents=[contents])
    payload = message(body.SerializeToString())  # one DATA frame's

    async def play(session: Session) -> None:
        stream_id = session.open(MODEL_INFER)
        session.bodies[stream_id] = payload
        session._send_body(stream_id, payload)
        await session.settle(session.ended(stream_id))

    # in one read, the frame's payload views the bytes read; in pieces, the lane's buffer
    for split, owner in ((None, "bytes"), (7_000, "bytearray")):
        ours, theirs = await both(play, tmp_path, split=split, window=1 << 20, frame=1 << 20)
        assert direct_calls(ours) == 1
        assert answer(ours.streams[1]).raw_output_contents == [contents]
        assert ours.infer.readonly == [True]  # type: ignore[attr-defined]
        assert theirs.infer.readonly == [True]  # type: ignore[attr-defined]
        [(kind, size)] = ours.infer.owners  # type: ignore[attr-defined]
        assert kind == owner and size > len(payload)  # not a copy of the frame's payload


async def test_the_restricted_protocol(tmp_path: Path) -> None:
    header = "triton-grpc-protocol-infer-key"

    async def play(session: Session) -> None:
        for extra in ([], [(header, "wrong")], [(header, "secret")]):
            stream_id = infer(session, "a", extra)
            await session.settle(session.ended(stream_id))

    env = {"grpc_restricted_protocol": "inference:infer-key=secret"}
    ours, _ = await both(play, tmp_path, env)
    assert direct_calls(ours) == 1
    for refused in (1, 3):
        headers = dict(ours.streams[refused]["headers"])
        assert headers["grpc-status"] == str(Status.UNAVAILABLE.value)
        assert header in headers["grpc-message"]
    assert status(ours.streams[5]) == "0"


async def test_forwarded_metadata_reaches_the_model(tmp_path: Path) -> None:
    async def play(session: Session) -> None:
        stream_id = infer(session, "a", [("x-pass", "1"), ("x-other", "2")])
        await session.settle(session.ended(stream_id))

    ours, _ = await both(play, tmp_path, {"grpc_header_forward_pattern": "x-pass"})
    assert direct_calls(ours) == 1
    assert ours.infer.seen[0][1] is not None  # type: ignore[attr-defined]
    assert ("x-pass", "1") in ours.infer.seen[0][1]  # type: ignore[attr-defined]


async def test_a_draining_server_refuses_and_answers_what_it_admitted(tmp_path: Path) -> None:
    async def play(session: Session) -> None:
        drain: Drain = session.drain  # type: ignore[attr-defined]
        held = infer(session, "wait")
        await session.settle(lambda: session.infer.calls == 1)  # type: ignore[attr-defined]
        assert drain.in_flight == 1
        drain.begin()
        refused = infer(session, "a")
        await session.settle(session.ended(refused))
        await drain.wait()  # exit timeout 0: the call held is cancelled, and answered
        await session.settle(session.ended(held))
        assert drain.in_flight == 0

    ours, _ = await both(play, tmp_path, drain=True)
    assert direct_calls(ours) == 1
    held, refused = dict(ours.streams[1]["headers"]), dict(ours.streams[3]["headers"])
    assert refused["grpc-status"] == held["grpc-status"] == str(Status.UNAVAILABLE.value)
    assert "shutting down" in refused["grpc-message"]
    assert "exit timeout" in held["grpc-message"]


async def test_the_servers_close_cancels_a_call(tmp_path: Path) -> None:
    async def play(session: Session) -> None:
        infer(session, "wait")
        await session.settle(lambda: session.infer.calls == 1)  # type: ignore[attr-defined]
        handler = session.protocol.handler
        handler.close()
        await handler.wait_closed()
        assert handler.check_closed()

    ours, _ = await both(play, tmp_path)
    assert direct_calls(ours) == 1
    assert ours.infer.cancelled == 1  # type: ignore[attr-defined]


async def test_a_server_with_event_listeners_leaves_every_call_to_grpclib(tmp_path: Path) -> None:
    seen: list[str] = []

    async def on_request(event: RecvRequest) -> None:
        seen.append(event.method_name)

    async def play(session: Session) -> None:
        listen(session.server, RecvRequest, on_request)
        stream_id = infer(session, "a")
        await session.settle(session.ended(stream_id))

    ours, _ = await both(play, tmp_path)
    assert ours.infer.grpclib_calls == ours.infer.calls == 1  # type: ignore[attr-defined]
    assert seen == [MODEL_INFER, MODEL_INFER]


async def test_a_deadline_while_the_answer_waits_for_the_window(tmp_path: Path) -> None:
    """The answer's headers and first pieces sent, the rest waiting for a window the client
    does not give: the deadline ends it with trailers, not a trailers-only answer."""

    async def play(session: Session) -> None:
        session.gives_window = False
        stream_id = infer(session, "big", [("grpc-timeout", "100S")])
        await session.settle(lambda: "data" in session.streams.get(stream_id, {}))
        lane_stream = session.protocol.lane.streams[stream_id]  # type: ignore[attr-defined]
        lane_stream.wrapper.cancel(TimeoutError("Deadline exceeded"))
        await session.settle(session.ended(stream_id))

    ours, _ = await both(play, tmp_path, window=20_000)
    assert direct_calls(ours) == 1
    entry = ours.streams[1]
    assert dict(entry["headers"])[":status"] == "200" and len(entry["data"]) == 20_000
    assert dict(entry["trailers"])["grpc-status"] == str(Status.DEADLINE_EXCEEDED.value)


async def test_a_failure_waiting_for_the_socket_when_the_drain_expires(tmp_path: Path) -> None:
    """The call is answered, for the drain, before its status is written: the drain's exit
    timeout does not cancel the status waiting for a paused socket."""

    async def play(session: Session) -> None:
        drain: Drain = session.drain  # type: ignore[attr-defined]
        session.protocol.pause_writing()
        stream_id = infer(session, "fail")
        session.send_out()
        await session.settle(lambda: session.infer.calls == 1)  # type: ignore[attr-defined]
        assert drain.in_flight == 0
        await drain.wait()
        session.protocol.resume_writing()
        await session.settle(session.ended(stream_id))

    ours, _ = await both(play, tmp_path, drain=True)
    assert direct_calls(ours) == 1
    assert status(ours.streams[1]) == str(Status.INVALID_ARGUMENT.value)


async def test_a_deadline_while_the_socket_is_paused(tmp_path: Path) -> None:
    async def play(session: Session) -> None:
        stream_id = infer(session, "wait", [("grpc-timeout", "100S")])
        await session.settle(lambda: session.infer.calls == 1)  # type: ignore[attr-defined]
        session.protocol.pause_writing()
        session.infer.release.set()  # type: ignore[attr-defined]
        await session.settle()
        lane_stream = session.protocol.lane.streams[stream_id]  # type: ignore[attr-defined]
        lane_stream.wrapper.cancel(TimeoutError("Deadline exceeded"))
        await session.settle()
        session.protocol.resume_writing()
        await session.settle(session.ended(stream_id))

    ours, _ = await both(play, tmp_path)
    assert direct_calls(ours) == 1
    assert status(ours.streams[1]) == str(Status.DEADLINE_EXCEEDED.value)


@pytest.mark.parametrize(
    ("extra", "calls"),
    [
        ([("x-bad-bin", "a")], 0),  # binary metadata grpclib cannot decode: it answers nothing
        ([("x-good-bin", "AAE=")], 1),  # binary metadata
        ([("x-pass", "1"), ("x-pass", "2")], 1),  # a header twice
        ([("traceparent", "00-" + "1" * 32 + "-" + "2" * 16 + "-01")] * 2, 1),
    ],
    ids=["bad binary metadata", "binary metadata", "a header twice", "traceparent twice"],
)
async def test_metadata_grpclib_reads_its_own_way_is_grpclibs(
    tmp_path: Path, extra: list[tuple[str, str]], calls: int
) -> None:
    async def play(session: Session) -> None:
        infer(session, "a", extra)
        await session.settle()

    ours, _ = await both(play, tmp_path, {"grpc_header_forward_pattern": "x-pass"})
    assert ours.infer.grpclib_calls == ours.infer.calls == calls  # type: ignore[attr-defined]


async def test_a_reset_in_the_read_of_its_headers_lets_the_stream_go(tmp_path: Path) -> None:
    """The call's task is cancelled before its first step: the stream is let go all the same
    (on both paths)."""

    async def play(session: Session) -> None:
        stream_id = session.open(MODEL_INFER)
        session.client.send_data(stream_id, message(request("a")), end_stream=True)
        session.client.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
        session.send_out()
        await session.settle()
        assert not session.protocol.processor.streams
        after = infer(session, "after")
        await session.settle(session.ended(after))

    ours, _ = await both(play, tmp_path)
    assert ours.infer.calls == 1 and direct_calls(ours) == 1  # type: ignore[attr-defined]


@pytest.mark.parametrize("model", ["wait", "big"], ids=["paused socket", "client's window"])
async def test_the_request_log_ends_before_the_answer_is_written(
    tmp_path: Path, model: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The call's log line (its status, its error) is the model's answer's, as on grpclib's
    path, where the answer is written after the handler: a deadline that cuts the write short
    (a paused socket, the client's window) does not make it an error."""
    lines: list[list[tuple[str, Any, Any]]] = []

    async def play(session: Session) -> None:
        mark = len(caplog.records)
        if model == "big":
            session.gives_window = False
        stream_id = infer(session, model, [("grpc-timeout", "100S")])
        if model == "wait":
            await session.settle(lambda: session.infer.calls == 1)  # type: ignore[attr-defined]
            session.protocol.pause_writing()
            session.infer.release.set()  # type: ignore[attr-defined]
            await session.settle()
        else:
            await session.settle(lambda: "data" in session.streams.get(stream_id, {}))
        lane_stream = session.protocol.lane.streams[stream_id]  # type: ignore[attr-defined]
        lane_stream.wrapper.cancel(TimeoutError("Deadline exceeded"))
        await session.settle()
        session.protocol.resume_writing()
        await session.settle(session.ended(stream_id))
        lines.append(
            [
                (r.getMessage(), getattr(r, "status", None), getattr(r, "error", None))
                for r in caplog.records[mark:]
                if r.name == REQUESTS
            ]
        )

    caplog.set_level(logging.DEBUG, REQUESTS)
    ours, _ = await both(play, tmp_path, window=20_000)
    assert direct_calls(ours) == 1
    assert status(ours.streams[1]) == str(Status.DEADLINE_EXCEEDED.value)
    direct, grpclib = lines
    assert direct == grpclib and [status for _, status, _ in direct] == ["OK"]


async def test_a_failure_in_answering_a_failure_is_logged_as_grpclib_logs_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The status of a failed call cannot be written (here, a bug where it is): grpclib's
    "Server error", not an exception nobody retrieves from the call's task."""

    async def broken(*args: Any, **kwargs: Any) -> None:
        raise ValueError("cannot write")

    async def play(session: Session) -> None:
        infer(session, "fail")
        await session.settle(lambda: session.infer.calls == 1)  # type: ignore[attr-defined]
        await session.settle()

    monkeypatch.setattr(LaneStream, "send_headers", broken)
    ours, _ = await both(play, tmp_path)
    assert direct_calls(ours) == 1
    errors = [r.getMessage() for r in caplog.records if r.name == "grpclib.server"]
    assert errors.count("Server error") == 2  # both paths
    assert not ours.protocol.processor.streams


async def test_a_timeout_of_the_calls_own_is_grpclibs_unknown(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A TimeoutError that is not the call's deadline (here, from reading the message):
    UNKNOWN, "Internal Server Error", and "Timeout occurred" in the log, on both paths."""

    async def times_out(*args: Any, **kwargs: Any) -> None:
        raise TimeoutError("not the deadline")

    async def play(session: Session) -> None:
        stream_id = infer(session, "a", [("grpc-timeout", "100S")])
        await session.settle(session.ended(stream_id))

    monkeypatch.setattr(direct_module, "read_message", times_out)
    monkeypatch.setattr(limits, "read_message", times_out)
    ours, _ = await both(play, tmp_path)
    assert ours.infer.calls == 0  # type: ignore[attr-defined]
    headers = dict(ours.streams[1]["headers"])
    assert headers["grpc-status"] == str(Status.UNKNOWN.value)
    assert headers["grpc-message"] == "Internal Server Error"
    logged = [r.getMessage() for r in caplog.records if r.name == "grpclib.server"]
    assert logged.count("Timeout occurred") == 2  # both paths


async def test_a_large_answer_keeps_unchanging_tensors_as_they_are_and_copies_the_rest() -> None:
    """`_keep` (the answer's pieces, written later): a tensor in a lane's slot (a HeldView)
    or in `bytes` goes as it is; one a model may still change (its own array) is copied at
    once, so that what is written is what it answered."""
    mapping = mmap.mmap(-1, 1 << 17)
    mapping[:] = b"\x05" * (1 << 17)
    held = memoryview(HeldView((1 << 17,), np.uint8, buffer=pickle.PickleBuffer(mapping)))
    own = np.full(1 << 17, 6, np.uint8)
    data = b"\x07" * (1 << 17)
    response = InferResponseMessage(ModelInferResponse(model_name="m"), [held, own, data])
    kept: list[tuple[list[Any], int]] = []
    connection = SimpleNamespace(messages_sent=0, last_message_sent=0.0)
    await direct_module._keep(connection, kept, response)  # type: ignore[arg-type]
    [(pieces, size)] = kept
    assert held in pieces and any(piece is data for piece in pieces)
    own[:] = 0  # the model changes its array after answering
    body = b"".join(bytes(memoryview(piece).cast("B")) for piece in pieces)
    assert size == len(body) and body[0] == 0 and int.from_bytes(body[1:5], "big") == size - 5
    sent = ModelInferResponse.FromString(body[5:])
    assert sent.raw_output_contents == [b"\x05" * (1 << 17), b"\x06" * (1 << 17), data]
    del pieces, kept, held
