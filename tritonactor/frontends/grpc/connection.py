"""grpclib's HTTP/2 server connections, made cheaper: two changes for large messages, the
header blocks a connection decodes and encodes again taken from a cache (hpack_cache.py), and
calls read and answered beside h2 (lane.py: `_Protocol` gives a connection's bytes to its
lane; `_LaneConnection` shows grpclib's keepalive the lane's calls).

- Frames of up to FRAME bytes (`SETTINGS_MAX_FRAME_SIZE`; h2's default is 16 KiB): a client
  then sends a 1 MiB tensor in one DATA frame rather than in 64, each parsed by h2 in Python.
  (gRPC's own clients accept frames of 4 MiB: answers already go out that way.) The larger
  frames are accepted at once, before the client acknowledges the setting: a client may use
  a setting as soon as it has read it, and its acknowledgement and a large frame can arrive
  together.
- h2 formats every frame it receives for its trace log, on or off (`repr(frame)`: for a DATA
  frame, the hex of its whole payload, then cut to 20 characters): a received DATA frame gets a
  short form instead.
- A frame of a type HTTP/2 does not define (an extension's: PRIORITY_UPDATE, ORIGIN, a client's
  own) is ignored, as RFC 9113 (section 4.1) asks and Triton does: h2 reports it as an event
  grpclib has no handler for, and grpclib raised on it, which ended the connection.

These reach into grpclib's and h2's internals (a connection's h2 object, h2's frame dispatch,
its HPACK coders): where a release moves the first, the connection is left as grpclib makes
it; where it moves the others, DATA frames are formatted and blocks coded as before
(tests/unit/test_grpc_connection.py fails in either case).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import is_dataclass, replace
from typing import Any

from grpclib.protocol import Connection, H2Protocol
from grpclib.server import Handler, Server
from h2.connection import ConnectionState, H2Connection
from h2.events import UnknownFrameReceived
from h2.exceptions import ProtocolError
from h2.settings import SettingCodes
from hyperframe.frame import DataFrame, Frame

from tritonactor.core.cork import CorkedTransport
from tritonactor.frontends.grpc.hpack_cache import cache_header_blocks
from tritonactor.frontends.grpc.lane import DirectCalls, Lane

log = logging.getLogger(__name__)

FRAME = 4 * 1024 * 1024
# Calls open at once on one connection (`SETTINGS_MAX_CONCURRENT_STREAMS`; h2's default is
# 100): Triton's gRPC core sets no limit, and one client channel carries all its calls (a
# decoupled model's streams held open past 100 made every other call of it wait).
STREAMS = 8192
# The most a call's headers (its metadata) may take, decoded: h2's 64 KiB ended the whole
# connection, every call on it, for one call's large metadata (Triton refuses past 16 KiB,
# that call only).
HEADER_LIST = 1024 * 1024


class _ReceivedData(DataFrame):
    """A received DATA frame whose repr leaves its payload out."""

    def __repr__(self) -> str:
        return f"DataFrame(stream_id={self.stream_id}): {len(self.data)} bytes"


class _QuietConnection(H2Connection):
    """An h2 connection whose received DATA frames are `_ReceivedData`."""

    def _receive_frame(self, frame: Frame) -> Any:
        if frame.__class__ is DataFrame:
            frame.__class__ = _ReceivedData
        return super()._receive_frame(frame)


def quiet_data_frames(connection: H2Connection) -> bool:
    """Make `connection` a `_QuietConnection`; False (and nothing changed) where h2's internals
    are not what this expects."""
    table = getattr(connection, "_frame_dispatch_table", None)
    if type(connection) is not H2Connection or not isinstance(table, dict):
        return False
    if DataFrame not in table:
        return False
    table[_ReceivedData] = table[DataFrame]
    connection.__class__ = _QuietConnection
    return True


def _ignored(event: UnknownFrameReceived) -> None:
    """A frame of a type HTTP/2 does not define: nothing to do."""


class _Protocol(H2Protocol):
    lane: Lane | None = None
    corked: CorkedTransport  # the connection's transport, as its writes go (connection_made)
    lanes = True  # calls read and answered by a lane (False: by h2, as grpclib does)
    direct: DirectCalls | None = None  # ModelInfer calls a lane answers itself (direct.py)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Every write of the connection (grpclib's, h2's, the lane's) through one wrapper, so
        # that what a loop turn writes goes together and in order (core/cork.py).
        self.corked = CorkedTransport(transport)
        super().connection_made(self.corked)  # type: ignore[arg-type]
        handlers = getattr(self.processor, "processors", None)
        if isinstance(handlers, dict):
            handlers.setdefault(UnknownFrameReceived, _ignored)
        else:
            log.debug("grpclib's events processor is not what this expects: left as is")
        h2_connection = getattr(self.connection, "_connection", None)
        if not isinstance(h2_connection, H2Connection):
            log.debug("grpclib's connection holds no h2 connection where expected: left as is")
            return
        if not quiet_data_frames(h2_connection):
            log.debug("h2's frame dispatch is not what this expects: DATA frames formatted")
        cached = cache_header_blocks(h2_connection.decoder, h2_connection.encoder)
        if not cached:
            log.debug("h2's HPACK coders are not hpack's own: their blocks are not cached")
        h2_connection.update_settings(
            {
                SettingCodes.MAX_FRAME_SIZE: FRAME,
                SettingCodes.MAX_CONCURRENT_STREAMS: STREAMS,
                SettingCodes.MAX_HEADER_LIST_SIZE: HEADER_LIST,  # told: clients that heed it
            }
        )
        h2_connection.max_inbound_frame_size = FRAME
        h2_connection.decoder.max_header_list_size = HEADER_LIST
        self.connection.flush()
        if cached and self.lanes and isinstance(self.handler, Handler):
            # every method served, unary or streaming (a method no one serves is h2's)
            methods = frozenset(self.handler.mapping)
            self.lane = Lane(
                h2_connection, self.connection, self.processor, self.handler, methods, self.direct
            )
            if type(self.connection) is Connection and is_dataclass(self.connection._config):
                self.connection.__class__ = _LaneConnection
                self.connection.lane = self.lane  # type: ignore[attr-defined]

    def connection_lost(self, exc: BaseException | None) -> None:
        super().connection_lost(exc)
        lane, self.lane = self.lane, None
        if lane is not None:
            lane.close()
            if isinstance(self.connection, _LaneConnection):
                self.connection.lane = None

    def data_received(self, data: bytes) -> None:
        lane = self.lane
        if lane is None:
            super().data_received(data)
            return
        try:
            opened = lane.opened
            lane.feed(data)
            if lane.opened - opened > 1:
                # The calls this read began reach the engine in their tasks' first turn:
                # their requests go together (core/cork.py).
                self.corked.cork.hold()
        except ProtocolError as error:
            h2 = lane.h2
            if h2.state_machine.state is not ConnectionState.CLOSED:  # as h2 ends it
                h2._terminate_connection(error.error_code)
            log.debug("Protocol error", exc_info=True)
            self.processor.close("Protocol error")


class _LaneConnection(Connection):
    """grpclib's connection, its keepalive seeing the lane's calls (grpclib pings a client only
    while a call is open, unless told otherwise, and looks for them among h2's streams), and
    what a lane stream's call left unread given back through the stream."""

    lane: Lane | None

    def ack(self, stream_id: int, size: int) -> None:
        # grpclib gives back what a call left unread when it lets its stream go: a lane
        # stream's goes back as the stream gives back what it reads (its own window too)
        lane = self.lane
        stream = None if lane is None else lane.streams.get(stream_id)
        if stream is None:
            super().ack(stream_id, size)
        else:
            stream.acknowledge(size)

    def _is_need_send_ping(self) -> bool:
        config = self._config
        lane = self.lane
        if lane is not None and lane.streams and not config._keepalive_permit_without_calls:
            self._config = replace(config, _keepalive_permit_without_calls=True)
            try:
                return super()._is_need_send_ping()
            finally:
                self._config = config
        return super()._is_need_send_ping()


class _Handler(Handler):
    """grpclib's handler, keeping a call's request headers on its stream (`Stream.headers`,
    which only a client's streams use otherwise): a compressed message is read by the
    `grpc-encoding` they name (limits.py)."""

    def accept(self, stream: Any, headers: Any, release_stream: Callable[[], Any]) -> None:
        stream.headers = headers
        super().accept(stream, headers, release_stream)


class GrpcServer(Server):
    """grpclib's server, its connections made as above (with a lane each, unless not `lanes`)."""

    def __init__(
        self, *args: Any, lanes: bool = True, direct: DirectCalls | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.lanes = lanes
        self.direct = direct

    def _protocol_factory(self) -> H2Protocol:
        made = super()._protocol_factory()
        if type(made.handler) is Handler:
            made.handler.__class__ = _Handler
        protocol = _Protocol(made.handler, made.config, made.h2_config)
        protocol.lanes = self.lanes
        protocol.direct = self.direct
        return protocol
