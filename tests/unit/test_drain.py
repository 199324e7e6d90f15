"""The drain's rules, each on its own (frontends/drain.py, frontends/signals.py): what the gate
admits and refuses, what a request cancelled at the exit timeout answers, gRPC's hook, and
signals held until the drain ends. The whole, with real servers: tests/e2e/test_drain_e2e.py."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from typing import Any

import pytest
import uvloop
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from tritonactor.frontends.drain import SHUTTING_DOWN, Drain, timed_out
from tritonactor.frontends.event_loop import SignalsKept, registered_signal_handler
from tritonactor.frontends.signals import held_signals

SCOPE = {"type": "http", "http_version": "1.1", "method": "GET", "path": "/"}


class Sent:
    """An ASGI `send` that keeps what it is given."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []

    async def __call__(self, message: dict[str, Any]) -> None:
        self.messages.append(message)

    @property
    def status(self) -> int:
        return int(self.messages[0]["status"])

    @property
    def headers(self) -> dict[bytes, bytes]:
        return dict(self.messages[0]["headers"])

    @property
    def error(self) -> str:
        return str(json.loads(self.messages[1]["body"])["error"])


async def receive() -> dict[str, Any]:
    return {"type": "http.request", "body": b"", "more_body": False}


class Held:
    """An ASGI app whose answer waits until `release` is set."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.entered.set()
        await self.release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def test_a_request_admitted_before_the_drain_finishes_and_says_close() -> None:
    async def scenario() -> None:
        drain = Drain(exit_timeout=30)
        app, sent = Held(), Sent()
        request = asyncio.create_task(drain.http(SCOPE, receive, sent, app))
        await app.entered.wait()
        assert drain.in_flight == 1
        drain.begin()
        waiting = asyncio.create_task(drain.wait())
        await asyncio.sleep(0)
        assert not waiting.done()
        app.release.set()
        await request
        await waiting
        assert sent.status == 200
        assert sent.headers[b"connection"] == b"close"
        assert drain.in_flight == 0 and not drain.expired

    run(scenario())


def test_a_request_before_any_drain_is_left_alone() -> None:
    async def scenario() -> None:
        drain = Drain(exit_timeout=30)
        app, sent = Held(), Sent()
        app.release.set()
        await drain.http(SCOPE, receive, sent, app)
        assert sent.status == 200
        assert b"connection" not in sent.headers
        assert drain.in_flight == 0

    run(scenario())


def test_a_request_during_the_drain_gets_503_with_the_message() -> None:
    async def scenario() -> None:
        drain = Drain(exit_timeout=30)
        drain.begin()
        app, sent = Held(), Sent()
        await drain.http(SCOPE, receive, sent, app)
        assert not app.entered.is_set()
        assert sent.status == 503
        assert sent.headers[b"connection"] == b"close"
        assert sent.headers[b"content-type"] == b"application/json"
        assert sent.error == SHUTTING_DOWN
        # HTTP/2 has no Connection header.
        sent2 = Sent()
        await drain.http({**SCOPE, "http_version": "2"}, receive, sent2, app)
        assert sent2.status == 503 and b"connection" not in sent2.headers

    run(scenario())


def test_the_exit_timeout_answers_what_is_left_503_not_an_empty_500() -> None:
    async def scenario() -> None:
        drain = Drain(exit_timeout=0)
        app, sent = Held(), Sent()
        request = asyncio.create_task(drain.http(SCOPE, receive, sent, app))
        await app.entered.wait()
        await drain.wait()
        await request  # answered, not cancelled
        assert drain.expired
        assert sent.status == 503
        assert sent.error == timed_out(0)
        assert "shutting down" in sent.error and "exit timeout (0 s)" in sent.error

    run(scenario())


def test_an_answer_already_begun_is_cut_short_rather_than_answered_twice() -> None:
    async def scenario() -> None:
        drain = Drain(exit_timeout=0)
        started = asyncio.Event()

        async def streaming(scope: Any, receive: Any, send: Any) -> None:
            await send({"type": "http.response.start", "status": 200, "headers": []})
            started.set()
            await asyncio.Event().wait()

        sent = Sent()
        request = asyncio.create_task(drain.http(SCOPE, receive, sent, streaming))
        await started.wait()
        await drain.wait()
        with pytest.raises(asyncio.CancelledError):
            await request
        assert [m["type"] for m in sent.messages] == ["http.response.start"]

    run(scenario())


def test_a_cancellation_outside_a_drain_is_not_swallowed() -> None:
    async def scenario() -> None:
        drain = Drain(exit_timeout=30)
        app, sent = Held(), Sent()
        request = asyncio.create_task(drain.http(SCOPE, receive, sent, app))
        await app.entered.wait()
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request
        assert sent.messages == [] and drain.in_flight == 0

    run(scenario())


def test_grpc_calls_during_the_drain_are_unavailable() -> None:
    async def scenario() -> None:
        drain = Drain(exit_timeout=30)
        drain.begin()

        async def method(stream: Any) -> None:
            raise AssertionError("not admitted")

        with pytest.raises(GRPCError) as refused:
            await drain.gate_grpc(method)(None)  # type: ignore[arg-type]
        assert refused.value.status is Status.UNAVAILABLE
        assert refused.value.message == SHUTTING_DOWN

    run(scenario())


def test_a_grpc_call_still_running_at_the_exit_timeout_is_unavailable() -> None:
    async def scenario() -> None:
        drain = Drain(exit_timeout=0)
        entered = asyncio.Event()

        async def method(stream: Any) -> None:
            entered.set()
            await asyncio.Event().wait()

        running = asyncio.create_task(drain.gate_grpc(method)(None))  # type: ignore[arg-type]
        await entered.wait()
        assert drain.in_flight == 1
        await drain.wait()
        with pytest.raises(GRPCError) as ended:
            await running
        assert ended.value.status is Status.UNAVAILABLE
        assert ended.value.message == timed_out(0)
        assert drain.in_flight == 0

    run(scenario())


def test_a_grpc_call_admitted_before_the_drain_finishes() -> None:
    async def scenario() -> None:
        drain = Drain(exit_timeout=30)
        release = asyncio.Event()
        answered: list[str] = []

        async def method(stream: Any) -> None:
            await release.wait()
            answered.append("ok")

        running = asyncio.create_task(drain.gate_grpc(method)(None))  # type: ignore[arg-type]
        await asyncio.sleep(0)
        drain.begin()
        waiting = asyncio.create_task(drain.wait())
        await asyncio.sleep(0)
        assert not waiting.done()
        release.set()
        await running
        await waiting
        assert answered == ["ok"] and not drain.expired

    run(scenario())


@pytest.mark.parametrize(
    ("installed_by", "loop_factory"),
    [
        ("signal module", None),
        ("event loop", None),
        # The uvloop loop the app has hypercorn's worker make (frontends/event_loop.py).
        ("event loop", SignalsKept),
    ],
)
def test_a_signal_is_held_until_the_drain_ends(installed_by: str, loop_factory: Any) -> None:
    """As uvicorn (signal.signal) and hypercorn in one process (loop.add_signal_handler)
    install their handlers: the signal begins the drain at once and reaches the server's handler
    only once the admitted request has been answered; the server's handler is back after."""
    reached: list[int] = []
    before = signal.getsignal(signal.SIGTERM)

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        passed_on = asyncio.Event()

        def server_handler(*args: Any) -> None:
            reached.append(1)
            loop.call_soon_threadsafe(passed_on.set)

        if installed_by == "signal module":
            signal.signal(signal.SIGTERM, server_handler)
        else:
            loop.add_signal_handler(signal.SIGTERM, server_handler)
        drain = Drain(exit_timeout=30)
        app, sent = Held(), Sent()
        try:
            with held_signals(drain):
                request = asyncio.create_task(drain.http(SCOPE, receive, sent, app))
                await app.entered.wait()
                os.kill(os.getpid(), signal.SIGTERM)
                while not drain.draining:
                    await asyncio.sleep(0.01)
                assert reached == []
                app.release.set()
                await request
                await passed_on.wait()
                assert reached == [1]
            # Put back: the server's own handler.
            if installed_by == "signal module":
                assert signal.getsignal(signal.SIGTERM) == server_handler
        finally:
            if installed_by == "event loop":
                loop.remove_signal_handler(signal.SIGTERM)

    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.run(scenario())
    finally:
        signal.signal(signal.SIGTERM, before)
    assert reached == [1]


def test_the_apps_uvloop_loop_shows_the_signal_handlers_registered_on_it() -> None:
    """`SignalsKept` (frontends/event_loop.py) keeps what uvloop keeps out of Python's reach,
    by signal number (a real-time signal has no `signal.Signals` member)."""
    realtime = signal.SIGRTMIN + 1
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, realtime)}

    def handler() -> None:
        pass

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, realtime):
            loop.add_signal_handler(sig, handler, 1)
            assert registered_signal_handler(loop, sig) == (handler, (1,))
            assert registered_signal_handler(loop, int(sig)) == (handler, (1,))
            assert loop.remove_signal_handler(sig)
            assert registered_signal_handler(loop, sig) is None
            assert not loop.remove_signal_handler(sig)

    try:
        with asyncio.Runner(loop_factory=SignalsKept) as runner:
            runner.run(scenario())
    finally:
        for sig, handler_before in before.items():
            signal.signal(sig, handler_before)


@pytest.mark.parametrize("installed_by", ["event loop", "signal module"])
def test_a_handler_uvloops_own_loop_does_not_show_is_said_not_to_be_held(
    installed_by: str, caplog: pytest.LogCaptureFixture
) -> None:
    """`hypercorn -k uvloop` in one process registers its handler on uvloop's own loop, which
    Python cannot read: hypercorn's handler would stop the server at once, and the hold says so.
    uvicorn on the same loop (a handler of the signal module) is held, and nothing is said."""
    before = signal.getsignal(signal.SIGTERM)

    def handler(*args: Any) -> None:
        pass

    async def scenario() -> None:
        if installed_by == "event loop":
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, handler)
        else:
            signal.signal(signal.SIGTERM, handler)
        with held_signals(Drain(exit_timeout=30)):
            pass
        if installed_by == "event loop":
            asyncio.get_running_loop().remove_signal_handler(signal.SIGTERM)

    try:
        with (
            caplog.at_level("WARNING", "tritonactor.drain"),
            asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner,
        ):
            runner.run(scenario())
    finally:
        signal.signal(signal.SIGTERM, before)
    said = "SIGTERM stops the server at once, without the drain" in caplog.text
    assert said is (installed_by == "event loop")


def test_an_app_started_again_admits_requests_again() -> None:
    async def scenario() -> None:
        drain = Drain(exit_timeout=30)
        await drain.wait()
        sent = Sent()
        app = Held()
        app.release.set()
        await drain.http(SCOPE, receive, sent, app)
        assert sent.status == 503
        drain.open()
        sent = Sent()
        await drain.http(SCOPE, receive, sent, app)
        assert sent.status == 200

    run(scenario())
