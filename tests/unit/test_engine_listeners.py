"""The gRPC socket the engine shares with its front ends (engine/listeners.py): handed out while
it is open; once the engine has closed it (it is stopping) a front end is told so, rather than
"gRPC is off", which would have it bind the port itself."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from tritonactor.engine.launch import EngineFailed
from tritonactor.engine.listeners import SUFFIX, handing_out, shared_grpc_socket
from tritonactor.engine.own_files import hold, remove_own
from tritonactor.settings import Settings

pytestmark = pytest.mark.anyio


def settings(tmp_path: Path, **changes: object) -> Settings:
    (tmp_path / "models").mkdir(exist_ok=True)
    base: dict[str, object] = {
        "model_repositories": (tmp_path / "models",),
        "journal": tmp_path / "journal.jsonl",
        "grpc_host": "127.0.0.1",
        "grpc_port": 0,
    }
    base.update(changes)
    return Settings(**base)  # type: ignore[arg-type]


async def test_the_socket_is_shared_until_the_engine_closes_it(tmp_path: Path) -> None:
    path = str(tmp_path / "engine.sock")
    async with handing_out(settings(tmp_path), path) as listeners:
        assert listeners.grpc is not None
        port = listeners.grpc.getsockname()[1]
        shared = await shared_grpc_socket(path)
        assert shared is not None
        with shared:
            assert shared.getsockname()[1] == port
        listeners.close()
        with pytest.raises(EngineFailed, match="the engine is stopping"):
            await shared_grpc_socket(path)


async def test_with_grpc_off_there_is_no_socket(tmp_path: Path) -> None:
    path = str(tmp_path / "engine.sock")
    async with handing_out(settings(tmp_path, grpc_enabled=False), path) as listeners:
        assert listeners.grpc is None
        assert await shared_grpc_socket(path) is None
        listeners.close()
        assert await shared_grpc_socket(path) is None
    with pytest.raises(EngineFailed):  # the asker's socket is gone with the block
        await shared_grpc_socket(path)


async def test_an_engine_that_stops_late_leaves_its_successor_s_socket(tmp_path: Path) -> None:
    """An engine left running by a killed server, stopping after a new engine took the path,
    must not remove the new one's socket (no front end could join it then)."""
    path = str(tmp_path / "engine.sock")
    async with handing_out(settings(tmp_path, grpc_enabled=False), path):
        # the successor: the path unlinked and bound again, as a new engine does at its start
        async with handing_out(settings(tmp_path, grpc_enabled=False), path):
            pass  # (it stops first here; the point is the older one stopping after)
        successor = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        successor.bind(path + SUFFIX)  # (the inner one removed its own file as it stopped)
    try:
        assert os.path.exists(path + SUFFIX)  # the older engine left it alone
    finally:
        successor.close()


def test_remove_own_removes_only_the_file_it_made(tmp_path: Path) -> None:
    path = str(tmp_path / "f")
    Path(path).write_text("mine")
    own = hold(path)
    os.unlink(path)
    Path(path).write_text("another's")  # a new file at the same path
    remove_own(path, own)
    assert Path(path).read_text() == "another's"
    remove_own(path, hold(path))
    assert not os.path.exists(path)
