"""A front end holds the connection that found the engine running until it has joined the
engine (app.py's lifespan; engine/launch.py): the engine, whose starter may have ended, waits
for a connection open rather than stopping under a front end about to join."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from tritonactor import app as app_module
from tritonactor.engine.remote import RemoteServer
from tritonactor.settings import Settings

pytestmark = pytest.mark.anyio


class Boom(Exception):
    pass


@pytest.fixture
def found() -> Iterator[tuple[socket.socket, socket.socket]]:
    """The connection that found the engine, and the engine's end of it."""
    ours, engines = socket.socketpair()
    yield ours, engines
    ours.close()
    engines.close()


def _open(sock: socket.socket) -> bool:
    return sock.fileno() != -1


def _holds(error: BaseException, kind: type[BaseException]) -> bool:
    if isinstance(error, BaseExceptionGroup):
        return error.subgroup(kind) is not None
    return isinstance(error, kind)


def _front_end(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    held: socket.socket,
    seen: dict[str, bool],
    fail_in: str = "",
) -> Any:
    """The front-end app, the engine's side replaced: `seen` records whether `held` was open
    when the gRPC socket was asked for and when the front end joined; `fail_in` fails one."""

    async def ensure_engine(settings: Settings) -> tuple[str, socket.socket]:
        return str(tmp_path / "engine.sock"), held

    async def shared_grpc_socket(path: str) -> None:
        seen["asking for the gRPC socket"] = _open(held)
        if fail_in == "grpc":
            raise Boom

    @asynccontextmanager
    async def running(self: RemoteServer) -> AsyncIterator[RemoteServer]:
        seen["joining"] = _open(held)
        if fail_in == "join":
            raise Boom
        yield self

    @asynccontextmanager
    async def grpc_listener(*args: Any, **kwargs: Any) -> AsyncIterator[None]:
        yield None

    # (The logging set up at start is the process's: left as the other tests expect it.)
    monkeypatch.setattr(app_module, "configure_logging", lambda settings: None)
    monkeypatch.setattr(app_module, "ensure_engine", ensure_engine)
    monkeypatch.setattr(app_module, "shared_grpc_socket", shared_grpc_socket)
    monkeypatch.setattr(app_module, "grpc_listener", grpc_listener)
    monkeypatch.setattr(RemoteServer, "running", running)
    settings = Settings.from_env(
        {"TRITONACTOR_MODEL_REPOSITORY": str(tmp_path), "TRITONACTOR_GRPC_PORT": "0"}
    )
    return app_module.create_app(settings, workers=1)


async def test_held_until_the_front_end_has_joined(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, found: tuple[socket.socket, socket.socket]
) -> None:
    held, _ = found
    seen: dict[str, bool] = {}
    app = _front_end(tmp_path, monkeypatch, held, seen)
    async with app.router.lifespan_context(app):
        assert seen == {"asking for the gRPC socket": True, "joining": True}
        assert not _open(held)  # joined: let go while the front end serves


@pytest.mark.parametrize("fail_in", ["grpc", "join"])
async def test_let_go_when_the_front_end_fails_to_join(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    found: tuple[socket.socket, socket.socket],
    fail_in: str,
) -> None:
    held, engines = found
    seen: dict[str, bool] = {}
    app = _front_end(tmp_path, monkeypatch, held, seen, fail_in)
    with pytest.raises(BaseException) as raised:
        async with app.router.lifespan_context(app):
            pass
    assert _holds(raised.value, Boom)
    assert not _open(held)
    assert engines.recv(1) == b""  # the engine sees it close
