"""uvicorn's httptools protocol, with a request's body handed to the app whole.

uvicorn hands the app a request's body as it arrives: each read adds to a `bytearray`, reading
pauses past 64 KiB until the app asks for more, and each `http.request` message is a `bytes`
copy of what gathered. The infer route reads the whole body before it decodes anything, so a 1
MiB tensor cost the front end two copies of itself beyond the read (the `bytearray`'s and its
`bytes`), then a third to join the messages, and a loop turn for every 64 KiB
(docs/benchmarks.md, "A body read whole"). `tritonactor serve` runs uvicorn with this protocol
(`--http tritonactor.frontends.http.uvicorn_protocol:HttpToolsWholeBody`): a body that declares
its length (`Content-Length`), no more than WHOLE_LIMIT, is kept as the pieces the parser gives
and joined once it has all come, and the app's one `receive` has it in one message (the join of
a single piece is that piece: a small body is not copied at all).

A pipelining client that goes away is told to every request of its connection still running:
uvicorn marks only the last request it parsed as disconnected, so an earlier one still being
answered wrote to the closed transport, which uvloop refuses with an exception (logged as an
error of the app's, with its traceback).

A pipelined request's body is gathered the same way, but while the request waits its turn
(its app has not started, so its body limits do not yet apply) reading pauses past 64 KiB of
it, as uvicorn pauses: its own `receive` resumes reading once it runs.

A request whose body has all come says so in its scope (the `tritonactor.body_complete`
extension): the app's body limits need not wait for it, nor time it (limits.py); most small
requests come whole in the read that brought their headers, before the app is called.

An infer request the app's infer lane takes (infer_lane.py: `POST .../infer`, its body of a
declared length, and what else the lane asks) is not given a task of uvicorn's when its
headers are parsed: if its body comes in the same read, the lane answers it, below ASGI;
otherwise, at the end of that read, uvicorn's task starts for it as before, and the app reads
the rest. Only a request started as its headers are parsed is the lane's: one that waited its
turn behind another (pipelined) is started by uvicorn and goes to the app.

What stays uvicorn's: a chunked body, a longer one, and any body once the app has started its
response (a refusal, a route that does not read its body) go uvicorn's way (paused past 64
KiB, in pieces); `Expect: 100-continue` is answered when the app asks for the body, as before;
a client that goes away ends the wait with `http.disconnect`; the app's body timeout
(limits.py) cancels a wait that lasts too long; a WebSocket handshake goes to uvicorn's
WebSocket protocol (no request of ours is made of it). hypercorn reads bodies its own way and
is not affected.

Two more things uvicorn's protocol does otherwise (a review against Triton 2.51 found them),
and one it does as before:
- An `Upgrade` offer other than WebSocket's (`h2c`, which Java's HTTP clients send with every
  request) is declined, as HTTP/1.1 lets a server decline it, and the request is served as
  the plain request it also is. The parser (llhttp) treats what follows the headers of such a
  request as another protocol's bytes: uvicorn gave the app an empty body, then read the body
  as a new, invalid request. A body of a declared length is read here, and the bytes after it
  go to the parser as the next request. (A chunked body with an upgrade offer is still refused
  400, as uvicorn refuses it: Java's HttpClient sends one for a body of unknown length.)
- A request's head (request line and headers) is bounded: past MAX_HEAD_BYTES before its
  headers end, the answer is 431 and the connection closes. Nothing bounded it, and httptools
  joins a header's pieces by concatenation: a 64 MiB header took the front end 5 s and 100 MB.
- A client's end of input is taken as the client leaving, as uvicorn (and nginx) take it: a
  request still running sees the disconnect, and no answer is written. (Triton answers a client
  that half-closed after sending, `nc -N`; send `Connection: close` instead.)
"""

from __future__ import annotations

import contextvars
from typing import Any

import httptools
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from tritonactor.frontends.http.infer_lane import InferLane
from tritonactor.frontends.http.limits import BODY_COMPLETE, DEFAULT_MAX_INPUT_SIZE, declared_body

# The longest body gathered whole: Triton's default input size. (A larger --http-max-input-size
# still works: those bodies come in pieces, as before.)
WHOLE_LIMIT = DEFAULT_MAX_INPUT_SIZE
# The longest request head (request line and headers) read: past it, 431 and the connection
# closed. (Triton's HTTP server closes past ~8 KiB; clients send ~1 KiB.) It is checked at each
# read's end, so a head may run one read (uvloop's, up to 256 KiB) past it before it is refused.
MAX_HEAD_BYTES = 64 * 1024


class HttpToolsWholeBody(HttpToolsProtocol):
    """uvicorn's httptools protocol; a body of a declared length within WHOLE_LIMIT reaches the
    app in one message once it has all arrived."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        # The body being gathered whole: its cycle and its pieces so far (None: no such body).
        self._whole: RequestResponseCycle | None = None
        self._pieces: list[bytes] = []
        self._gathered = 0  # bytes in `_pieces`
        # Earlier requests of the connection still being answered while a later one was parsed
        # (pipelining): told of a disconnect too.
        self._earlier: list[RequestResponseCycle] = []
        # uvicorn is starting the request whose headers were just parsed (not one that waited
        # its turn behind another)
        self._fresh = False
        # An infer request the lane takes once its body has come in this read (its cycle, the
        # app, the lane, its path's parameters); otherwise the app's, at the read's end.
        self._deferred: tuple[RequestResponseCycle, Any, InferLane, dict[str, Any]] | None = None
        self._lane_app: Any = None  # the app its requests were last started with, and its lane
        self._lane: InferLane | None = None
        # The body bytes still to come of a request that offered an upgrade (None: no such
        # request; -1: its body has come, its completion under way).
        self._offered: int | None = None
        self._head: int | None = None  # bytes of the head being read, over whole reads

    def data_received(self, data: bytes) -> None:
        try:
            self._unset_keepalive_if_required()
            self._feed(data)
        finally:
            deferred = self._deferred
            if deferred is not None:  # its body is still coming: the app reads it, as before
                self._deferred = None
                super()._start_asgi_task(deferred[0], deferred[1])

    def _feed(self, data: bytes) -> None:
        """uvicorn's `data_received`, but for an upgrade offer declined (the request's body
        read, the bytes after it fed as the next request) and a head too long."""
        if self._offered:
            data = self._offered_body(data)
            if not data:
                return
        head = self._head
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            msg = "Invalid HTTP request received."
            self.logger.warning(msg)
            self.send_400_response(msg)
            return
        except httptools.HttpParserUpgrade as upgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
                return
            rest = data[upgrade.args[0] :]  # declined: the parser goes on with what follows
            if self._offered:
                rest = self._offered_body(rest)
            if rest:
                self._feed(rest)
            return
        if self._head is not None and head is not None:
            # a head begun in an earlier read and not over yet: all of this read is head
            self._head = head + len(data)
            if self._head > MAX_HEAD_BYTES:
                self._refuse_head()

    def _refuse_head(self) -> None:
        self._head = None
        self.logger.warning("Request head too large.")
        content = b"Request Header Fields Too Large"
        self.transport.write(
            b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain; "
            b"charset=utf-8\r\nconnection: close\r\ncontent-length: "
            + str(len(content)).encode()
            + b"\r\n\r\n"
            + content
        )
        self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head = 0

    def _offered_body(self, data: bytes) -> bytes:
        """The part of `data` that is the body of a request that offered an upgrade, given to
        it (and, once it has all come, the request completed); returns what follows it."""
        assert self._offered is not None and self._offered > 0
        piece = data[: self._offered]
        self._offered -= len(piece)
        if piece:
            self.on_body(piece)
        if not self._offered:
            self._offered = -1
            try:
                self.on_message_complete()
            finally:
                self._offered = None
        return data[len(piece) :]

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        if self._fresh:
            if app is not self._lane_app:  # (the same app every time, but past uvicorn's limit)
                self._lane_app, self._lane = app, _lane_of(app)
            lane = self._lane
            if lane is not None:
                params = lane.takes(cycle, WHOLE_LIMIT)
                if params is not None:
                    self._deferred = (cycle, app, lane, params)
                    return
        super()._start_asgi_task(cycle, app)

    def on_headers_complete(self) -> None:
        self._head = None
        earlier = self.cycle
        self._fresh = True
        try:
            super().on_headers_complete()
        finally:
            self._fresh = False
        if self._earlier:
            self._earlier = [c for c in self._earlier if not c.response_complete]
        if earlier is not None and not earlier.response_complete and earlier is not self.cycle:
            self._earlier.append(earlier)
        self._whole = None
        self._pieces = []
        self._gathered = 0
        deferred = self._deferred
        if deferred is not None and deferred[0] is self.cycle:
            # the lane's: its body, of a declared length within WHOLE_LIMIT (`takes` read it)
            self._whole = self.cycle
            return
        if self.parser.should_upgrade():
            return
        length, chunked = declared_body(self.headers)
        if not chunked and 0 < length <= WHOLE_LIMIT:
            self._whole = self.cycle

    def on_body(self, body: bytes) -> None:
        cycle = self._whole  # (None, or the request being parsed: both set by on_headers_complete)
        if cycle is None or cycle.response_started:
            if cycle is not None:
                self._give_up()
            super().on_body(body)
            return
        if cycle.response_complete:
            return
        self._pieces.append(body)
        self._gathered += len(body)
        # Waiting its turn behind a request still running (whose `receive` resumes reading):
        # its own `receive` resumes reading once it starts.
        if (
            self._gathered > HIGH_WATER_LIMIT
            and self.pipeline
            and any(queued is cycle for queued, _ in self.pipeline)
        ):
            self.flow.pause_reading()

    def on_message_complete(self) -> None:
        if self._offered is None and self.parser.should_upgrade() and not self._should_upgrade():
            length, chunked = declared_body(self.headers)
            if length > 0 and not chunked:
                # an upgrade offered beside a body: declined, the body is still to be read
                # (`_feed`), and the request completes once it has come
                self._offered = length
                return
        if self._whole is not None:
            self._give_up()
        super().on_message_complete()
        if self.parser.should_upgrade() and self._should_upgrade():
            # A WebSocket handshake, the WebSocket protocol's (uvicorn's returned at once): no
            # request of ours is parsed, and `self.cycle` is none, or an earlier request's.
            return
        # The app has it all (it may not have been called yet: then it need not wait for the
        # body, nor time it: limits.py).
        scope = self.cycle.scope
        extensions = scope.get("extensions")
        if extensions is None:
            scope["extensions"] = {BODY_COMPLETE: {}}
        else:
            extensions[BODY_COMPLETE] = {}
        deferred = self._deferred
        if deferred is not None and deferred[0] is self.cycle:
            self._deferred = None
            cycle, _, lane, params = deferred
            # (as uvicorn starts a request's task, with a context of its own if configured so)
            context = contextvars.Context() if self.config.reset_contextvars else None
            task = self.loop.create_task(lane.answer(cycle, params), context=context)
            task.add_done_callback(self.tasks.discard)
            self.tasks.add(task)

    def _give_up(self) -> None:
        """What was gathered goes to the cycle as uvicorn would have it; the rest comes uvicorn's
        way."""
        cycle, pieces = self._whole, self._pieces
        self._whole = None
        self._pieces = []
        self._gathered = 0
        if cycle is None or not pieces:
            return
        # Nothing of this body came uvicorn's way before (its pieces come after, appended);
        # uvicorn's receive sends `bytes(body)`: a `bytes` body goes as it is, uncopied.
        cycle.body = b"".join(pieces)  # type: ignore[assignment]
        cycle.message_event.set()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._offered = self._head = None
        self._whole = None  # (a body that will never be complete)
        self._pieces = []
        self._gathered = 0
        for cycle in self._earlier:
            if not cycle.response_complete:
                cycle.disconnected = True
                cycle.message_event.set()
        self._earlier = []


def _lane_of(app: Any) -> InferLane | None:
    """The infer lane of the app uvicorn serves, under uvicorn's proxy-headers middleware (which
    infer requests do not need: it rewrites the client's address and scheme); None under any
    other wrapper (uvicorn's message logger at its trace level), for another app, or for
    uvicorn's answer past its concurrency limit."""
    if isinstance(app, ProxyHeadersMiddleware):
        app = app.app
    lane = getattr(app, "lane", None)
    return lane if isinstance(lane, InferLane) else None
