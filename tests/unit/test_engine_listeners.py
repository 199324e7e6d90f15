"""The gRPC socket the engine shares with its front ends (engine/listeners.py): handed out while
it is open; once the engine has closed it (it is stopping) a front end is told so, rather than
"gRPC is off", which would have it bind the port itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from tritonactor.engine.launch import EngineFailed
from tritonactor.engine.listeners import handing_out, shared_grpc_socket
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
