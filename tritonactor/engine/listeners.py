"""The gRPC socket a server's front ends share. The engine binds it once (frontends/listen.py:
without SO_REUSEPORT, so no other process can join it) and hands a copy of it to every front end
that asks, over a Unix socket beside its own (`<engine socket>.listeners`, SCM_RIGHTS), after
checking that the asker runs as this user; each front end accepts connections on that one
socket. It listens once the engine's models have loaded (before, a connection is refused, as by
tritonserver, whose endpoints open after its models load). A front end that restarts gets it
again; connections that arrive while none accepts wait in the socket's queue. (The HTTP socket
is the ASGI server's: bound once in its parent and inherited by its workers.)"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio

from tritonactor.engine.launch import EngineFailed, same_user
from tritonactor.engine.own_files import hold, remove_own
from tritonactor.frontends.listen import BACKLOG, ListenFailed, address_text, bound_socket
from tritonactor.settings import Settings

log = logging.getLogger(__name__)

SUFFIX = ".listeners"
# What the engine says with the descriptor (or without one: gRPC is not served).
GRPC = b"grpc"
NONE = b"none"
CLOSED = b"closed"  # served, but no longer: the engine is stopping


class SharedListeners:
    """The engine's side: the bound gRPC socket, until `close` (the engine stops, or starts
    to drain: from then on a connection attempt is refused rather than queued)."""

    def __init__(self, grpc: socket.socket | None) -> None:
        self.grpc = grpc
        self._serves_grpc = grpc is not None

    def listen(self) -> None:
        """Take connections from now on (queued until a front end accepts them): once the
        models have loaded, as tritonserver's endpoints (before, one was refused)."""
        if self.grpc is not None:
            self.grpc.listen(BACKLOG)

    def close(self) -> None:
        if self.grpc is not None:
            self.grpc.close()
            self.grpc = None

    def _hand_out(self, connection: socket.socket) -> None:
        with connection:
            if not same_user(connection):
                return
            if self.grpc is not None:
                socket.send_fds(connection, [GRPC], [self.grpc.fileno()])
            else:
                connection.sendall(CLOSED if self._serves_grpc else NONE)


@asynccontextmanager
async def handing_out(settings: Settings, path: str) -> AsyncIterator[SharedListeners]:
    """In the engine: bind the gRPC socket (raising ListenFailed when the address is taken)
    and hand it to the front ends of the engine at `path` while the block runs."""
    grpc = None
    if settings.grpc_enabled:
        try:
            grpc = bound_socket("gRPC", settings.grpc_host, settings.grpc_port)
        except ListenFailed as error:
            log.error("%s", error)
            raise
        port = grpc.getsockname()[1]
        log.info("gRPC bound on %s for the front ends", address_text(settings.grpc_host, port))
    shared = SharedListeners(grpc)
    where = path + SUFFIX
    with contextlib.suppress(FileNotFoundError):
        os.unlink(where)  # a dead engine's: the engine is started under the server's lock
    asker = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    bound, own = False, None
    try:
        asker.bind(where)
        bound, own = True, hold(where)
        asker.listen()
        asker.setblocking(False)
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(_answer, asker, shared)
            try:
                yield shared
            finally:
                tasks.cancel_scope.cancel()
    finally:
        asker.close()
        if bound:  # (not another engine's, that took the path since)
            remove_own(where, own)
        shared.close()


async def _answer(asker: socket.socket, shared: SharedListeners) -> None:
    while True:
        await anyio.wait_readable(asker)
        try:
            connection, _ = asker.accept()
        except BlockingIOError:
            continue
        connection.setblocking(True)
        try:
            shared._hand_out(connection)
        except OSError as error:  # the front end went away meanwhile
            log.debug("a front end left before it got the listeners: %s", error)


async def shared_grpc_socket(path: str) -> socket.socket | None:
    """In a front end: the gRPC socket of the engine at `path` (None: gRPC is not served).
    Raises EngineFailed when the engine cannot be asked."""
    return await anyio.to_thread.run_sync(_receive, path, abandon_on_cancel=True)


def _receive(path: str) -> socket.socket | None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        try:
            connection.connect(path + SUFFIX)
            if not same_user(connection):
                raise EngineFailed(f"{path + SUFFIX} is not this user's engine")
            message, fds, _, _ = socket.recv_fds(connection, 16, 1)
        except OSError as error:
            raise EngineFailed(f"cannot get the gRPC socket from the engine: {error}") from None
    if message == GRPC and len(fds) == 1:
        return socket.socket(fileno=fds[0])
    for fd in fds:
        os.close(fd)
    if message == NONE:
        return None
    if message == CLOSED:
        # Not "gRPC is off": this front end must not bind the port itself.
        raise EngineFailed("the engine is stopping: it no longer shares its gRPC socket")
    raise EngineFailed(f"the engine answered {message!r} when asked for its gRPC socket")
