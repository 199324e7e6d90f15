"""The HTTP front end's bounds on a request (tritonactor/frontends/http/limits.py): the body's
size and time, read through ASGI `receive`/`send` doubles, and the JSON nesting check."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import anyio
import orjson
import pytest
from starlette.types import Message

from tritonactor.core.errors import TritonError
from tritonactor.frontends.http.codec import decode_infer_request
from tritonactor.frontends.http.generate import decode_generate_request
from tritonactor.frontends.http.json_body import decode_json
from tritonactor.frontends.http.limits import (
    BODY_COMPLETE,
    DEFAULT_JSON_DEPTH,
    BodyLimitError,
    BodyLimits,
    answer,
    check_json_depth,
)
from tritonactor.settings import Settings, SettingsError

pytestmark = pytest.mark.anyio

# The bound on a wait for an event (the client waiting): never a measure of speed, so generous
# enough that a busy machine never reaches it.
WAIT = 30


def nested(depth: int) -> bytes:
    return b"[" * depth + b"1" + b"]" * depth


# --- JSON nesting ------------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [1, 2, 50, 99, 100])
def test_json_at_most_the_limit_passes(depth: int) -> None:
    check_json_depth(nested(depth), 100)


@pytest.mark.parametrize("depth", [101, 1000, 100_000])
def test_json_past_the_limit_names_it(depth: int) -> None:
    with pytest.raises(TritonError) as raised:
        check_json_depth(nested(depth), 100)
    assert raised.value.message == (
        "JSON nesting depth exceeds maximum allowed limit (100). Use --http-max-json-depth to "
        "increase the limit."
    )
    assert raised.value.code.http_status == 400


def test_objects_count_as_arrays_do() -> None:
    doc = b'{"a":' * 3 + b"[[1]]" + b"}" * 3
    check_json_depth(doc, 5)
    with pytest.raises(TritonError):
        check_json_depth(doc, 4)


def test_many_brackets_side_by_side_are_not_depth() -> None:
    check_json_depth(orjson.dumps([[i] for i in range(10_000)]), 2)
    check_json_depth(orjson.dumps({"data": [[[1, 2]] * 500] * 4}), 4)
    with pytest.raises(TritonError):
        check_json_depth(orjson.dumps({"data": [[[1, 2]] * 500] * 4}), 3)


def test_depth_is_carried_across_the_blocks_it_is_counted_in() -> None:
    """Over a million brackets are counted a block at a time: the depth goes on from one block
    to the next."""
    many = b"[1]," * 600_000
    check_json_depth(b"[" + many + nested(99) + b"]", 100)
    with pytest.raises(TritonError):
        check_json_depth(b"[" + many + nested(100) + b"]", 100)
    opened = b"[" * 50 + b"[1]," * 600_000 + nested(51) + b"]" * 50
    with pytest.raises(TritonError):
        check_json_depth(opened, 100)
    check_json_depth(opened, 101)


@pytest.mark.parametrize(
    "text",
    [
        ["[" * 500],  # brackets inside strings are text
        ['\\"' + "[" * 500],  # an escaped quote does not end the string
        ["\\\\", "[" * 500],  # an escaped backslash does not escape the quote after it
        ["a\nb" + "{" * 500, "]]]]"],
        ["\u00e9[[[[" * 200],
    ],
)
def test_brackets_in_strings_are_not_nesting(text: list[str]) -> None:
    check_json_depth(orjson.dumps({"a": text}), 2)


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview, lambda b: b.decode()])
def test_every_kind_of_body(kind: Any) -> None:
    check_json_depth(kind(nested(10)), 10)
    with pytest.raises(TritonError):
        check_json_depth(kind(nested(11)), 10)


def test_decode_json_checks_before_it_parses() -> None:
    assert decode_json(nested(DEFAULT_JSON_DEPTH)) is not None
    with pytest.raises(TritonError, match=r"limit \(100\)"):
        decode_json(nested(DEFAULT_JSON_DEPTH + 1))
    assert decode_json(b'{"a":[[1]]}', 3) == {"a": [[1]]}
    with pytest.raises(TritonError, match=r"limit \(3\)"):
        decode_json(b'{"a":[[[1]]]}', 3)


def test_an_infer_request_with_data_nested_1000_deep_is_refused_not_crashed() -> None:
    body = b'{"inputs":[{"name":"X","datatype":"INT32","shape":[1],"data":' + nested(1000)
    body += b"}]}"
    with pytest.raises(TritonError) as raised:
        decode_infer_request(body, None, "m", "")
    assert "JSON nesting depth exceeds maximum allowed limit (100)" in raised.value.message
    # The binary form: the JSON header is checked as well.
    with pytest.raises(TritonError, match="nesting depth"):
        decode_infer_request(body + b"\x00" * 4, len(body), "m", "")


def test_data_nested_as_deep_as_a_raised_limit_decodes() -> None:
    """With the limit raised, data nested as deep as allowed decodes (nothing recurses past
    what Python allows)."""
    depth = 500  # the setting's largest value
    data = b"[" * (depth - 3) + b"7" + b"]" * (depth - 3)
    body = b'{"inputs":[{"name":"X","datatype":"INT32","shape":[1],"data":' + data + b"}]}"
    request = decode_infer_request(body, None, "m", "", max_depth=depth)
    assert request.inputs[0].data.tolist() == [7]


def test_a_generate_body_is_checked_too() -> None:
    with pytest.raises(TritonError, match="nesting depth"):
        decode_generate_request(b'{"x":' + nested(200) + b"}", None, "m", "")  # type: ignore[arg-type]


# --- settings ----------------------------------------------------------------------------------


def test_triton_like_defaults() -> None:
    settings = Settings()
    assert settings.http_max_input_size == 64 * 1024 * 1024
    assert settings.http_max_json_depth == 100
    assert settings.grpc_max_message_size == 2**31 - 1
    assert settings.http_body_timeout_secs == 30
    assert BodyLimits.of(settings) == BodyLimits(64 * 1024 * 1024, 30)


def test_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITONACTOR_HTTP_MAX_INPUT_SIZE", "1000")
    monkeypatch.setenv("TRITONACTOR_HTTP_BODY_TIMEOUT_SECS", "5")
    monkeypatch.setenv("TRITONACTOR_HTTP_MAX_JSON_DEPTH", "20")
    monkeypatch.setenv("TRITONACTOR_GRPC_MAX_MESSAGE_SIZE", "2000")
    settings = Settings.from_env()
    assert (
        settings.http_max_input_size,
        settings.http_body_timeout_secs,
        settings.http_max_json_depth,
        settings.grpc_max_message_size,
    ) == (1000, 5, 20, 2000)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("TRITONACTOR_HTTP_MAX_INPUT_SIZE", "0"),
        ("TRITONACTOR_HTTP_BODY_TIMEOUT_SECS", "0"),
        ("TRITONACTOR_HTTP_MAX_JSON_DEPTH", "501"),
        ("TRITONACTOR_HTTP_MAX_JSON_DEPTH", "0"),
        ("TRITONACTOR_GRPC_MAX_MESSAGE_SIZE", str(2**31)),
    ],
)
def test_settings_out_of_range_stop_the_server(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError, match=variable):
        Settings.from_env()


# --- the body's size and time ------------------------------------------------------------------


class Client:
    """An ASGI connection's two sides: what the client sends (`receive`) and what the server
    answers (`sent`)."""

    def __init__(self, messages: list[Message], then_wait: bool = False) -> None:
        self.messages: Iterator[Message] = iter(messages)
        self.then_wait = then_wait
        self.reads = 0
        self.sent: list[Message] = []
        self.waiting = anyio.Event()  # set once a read finds nothing more to come

    async def receive(self) -> Message:
        self.reads += 1
        for message in self.messages:
            return message
        if self.then_wait:
            self.waiting.set()
            await anyio.sleep(math.inf)
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        self.sent.append(message)

    def headers(self) -> list[tuple[bytes, bytes]]:
        return list(self.sent[0]["headers"])


def scope(*headers: tuple[bytes, bytes]) -> dict[str, Any]:
    return {"type": "http", "headers": list(headers)}


def chunk(body: bytes, more: bool = True) -> Message:
    return {"type": "http.request", "body": body, "more_body": more}


LIMITS = BodyLimits(max_size=100, timeout=60)


async def test_no_body_is_not_wrapped() -> None:
    client = Client([])
    receive, send, refused = LIMITS.bound(scope(), client.receive, client.send)
    assert refused is None
    assert receive == client.receive
    assert send == client.send


async def test_a_declared_length_past_the_limit_is_refused_unread() -> None:
    client = Client([chunk(b"x" * 50)])
    _, send, refused = LIMITS.bound(
        scope((b"content-length", b"1073741824")), client.receive, client.send
    )
    assert isinstance(refused, BodyLimitError)
    assert refused.message == (
        "request body size of 1073741824 bytes exceeds the maximum allowed input size of 100 "
        "bytes. Use --http-max-input-size to increase the limit."
    )
    await answer(refused, send)
    assert client.sent[0]["status"] == 400
    assert (b"connection", b"close") in client.headers()
    assert orjson.loads(client.sent[1]["body"]) == {"error": refused.message}
    assert client.sent[-1] == {"type": "http.response.body", "body": b""}  # after lingering
    assert client.reads == 2  # the linger's, which dropped what came: nothing else was read


def complete(headers_scope: dict[str, Any]) -> dict[str, Any]:
    """The scope of a request whose ASGI server says its body had all arrived."""
    return {**headers_scope, "extensions": {BODY_COMPLETE: {}}}


async def test_a_body_the_server_says_is_in_is_not_wrapped_when_within_the_limit() -> None:
    client = Client([chunk(b"x" * 100, more=False)])
    receive, send, refused = LIMITS.bound(
        complete(scope((b"content-length", b"100"))), client.receive, client.send
    )
    assert refused is None
    assert receive == client.receive and send == client.send  # no timer, no counting


async def test_a_body_the_server_says_is_in_is_still_refused_past_the_limit() -> None:
    for headers in [(b"content-length", b"101")], [(b"transfer-encoding", b"chunked")]:
        client = Client([chunk(b"x" * 101, more=False)])
        receive, _, refused = LIMITS.bound(complete(scope(*headers)), client.receive, client.send)
        if headers[0][0] == b"content-length":
            assert isinstance(refused, BodyLimitError)
        else:  # a chunked body is counted as it comes, whatever the server says
            assert refused is None and receive != client.receive
            with pytest.raises(BodyLimitError):
                await receive()


async def test_a_body_at_the_limit_is_read() -> None:
    client = Client([chunk(b"x" * 60), chunk(b"x" * 40, more=False)])
    receive, send, refused = LIMITS.bound(
        scope((b"content-length", b"100")), client.receive, client.send
    )
    assert refused is None
    assert (await receive())["body"] == b"x" * 60
    assert (await receive())["body"] == b"x" * 40
    await send({"type": "http.response.start", "status": 200, "headers": []})
    assert client.headers() == []  # the body was read: the connection may be kept


async def test_a_chunked_body_is_counted_as_it_arrives() -> None:
    client = Client([chunk(b"x" * 60), chunk(b"x" * 41), chunk(b"x", more=False)])
    receive, _, refused = LIMITS.bound(
        scope((b"transfer-encoding", b"chunked")), client.receive, client.send
    )
    assert refused is None
    await receive()
    with pytest.raises(BodyLimitError, match=r"size of 101 bytes exceeds .* of 100 bytes"):
        await receive()
    assert client.reads == 2
    # Whoever reads on sees the client gone: nothing more is taken in.
    assert await receive() == {"type": "http.disconnect"}
    assert client.reads == 2


async def test_a_body_that_does_not_arrive_in_time_is_408() -> None:
    limits = BodyLimits(max_size=100, timeout=0.01)
    client = Client([chunk(b"{")], then_wait=True)
    receive, send, refused = limits.bound(
        scope((b"content-length", b"10")), client.receive, client.send
    )
    assert refused is None
    await receive()
    with pytest.raises(BodyLimitError) as raised:
        await receive()
    assert raised.value.http_status == 408
    assert raised.value.message == (
        "the request body did not arrive within 0.01 seconds. Use --http-body-timeout-secs to "
        "increase the limit."
    )
    await answer(raised.value, send)
    assert client.sent[0]["status"] == 408
    assert (b"connection", b"close") in client.headers()
    assert client.reads == 2  # a late client is not waited for again


async def test_once_the_body_is_in_receiving_waits_without_a_deadline() -> None:
    """What is left to receive is the client leaving (a streamed answer waits for that)."""
    limits = BodyLimits(max_size=100, timeout=0.01)
    client = Client([chunk(b"{}", more=False)], then_wait=True)
    receive, _, _ = limits.bound(scope((b"content-length", b"2")), client.receive, client.send)
    bounded = receive.__self__  # type: ignore[attr-defined]  # the request's timer and state
    await receive()
    assert bounded.complete and bounded._timer is None  # the body is in: its timer is gone
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(receive)
        with anyio.fail_after(WAIT):
            await client.waiting.wait()
        # The client's wait is not one the body's timer may cancel, and were that timer to
        # fire now, it would change nothing: no 408 can come.
        assert bounded._waiting is None
        bounded._expire()
        assert not bounded.late and not bounded.failed
        tasks.cancel_scope.cancel()  # the client leaving ends the wait (cancelled, no error)
    assert client.reads == 2


async def test_a_response_before_the_body_has_arrived_closes_the_connection() -> None:
    client = Client([chunk(b"x" * 10), chunk(b"x" * 10), chunk(b"", more=False)])
    _, send, _ = LIMITS.bound(scope((b"content-length", b"20")), client.receive, client.send)
    await send({"type": "http.response.start", "status": 200, "headers": [(b"a", b"b")]})
    await send({"type": "http.response.body", "body": b"done"})
    assert client.headers() == [(b"a", b"b"), (b"connection", b"close")]
    assert client.sent[1] == {"type": "http.response.body", "body": b"done", "more_body": True}
    assert client.sent[2] == {"type": "http.response.body", "body": b""}
    assert client.reads == 3  # the rest was read and dropped before the response ended


@pytest.mark.parametrize(
    "tail",
    [
        b'\\"' * 2_000_000,  # every quote escaped: strings that never close
        b'"' + b"\\" * 1_000_001,  # one string, ending on a lone backslash
        b'"[' * 1_000_000,  # quotes opening strings full of brackets
    ],
)
def test_strings_that_never_close_cost_one_pass(tail: bytes) -> None:
    # Megabytes of unclosed strings after deep brackets: a pattern that backtracked would scan
    # to the end once per quote (hours here; the suite's timeout fails it); one pass takes ms.
    body = b'{"inputs":' + b"[" * 200 + tail
    with pytest.raises(TritonError, match=r"maximum allowed limit \(100\)"):
        check_json_depth(body, 100)


def test_brackets_inside_a_string_left_open_do_not_count() -> None:
    check_json_depth(b'{"a": [1], "b": "' + b"[" * 1000, 100)
