"""Where a server's engine is found, and who may answer there."""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import socket
import threading
import time
from pathlib import Path

import pytest

from tritonactor.engine import launch
from tritonactor.settings import Settings


@pytest.fixture
def tmp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(launch.tempfile, "gettempdir", lambda: str(tmp_path))
    return tmp_path


def settings(tmp_path: Path, **changes: object) -> Settings:
    (tmp_path / "models").mkdir(exist_ok=True)
    (tmp_path / "other").mkdir(exist_ok=True)
    base: dict[str, object] = {
        "model_repositories": (tmp_path / "models",),
        "journal": tmp_path / "journal.jsonl",
        "http_port": 8000,
    }
    base.update(changes)
    return Settings(**base)  # type: ignore[arg-type]


def test_each_server_has_its_own_socket_in_a_folder_only_its_user_enters(tmp_dir: Path) -> None:
    one = launch.engine_socket(settings(tmp_dir))
    assert launch.engine_socket(settings(tmp_dir)) == one
    assert launch.engine_socket(settings(tmp_dir, http_port=8100)) != one
    assert launch.engine_socket(settings(tmp_dir, grpc_port=9001)) != one
    other_repository = settings(tmp_dir, model_repositories=(tmp_dir / "other",))
    assert launch.engine_socket(other_repository) != one
    folder = Path(one).parent
    assert folder == tmp_dir / f"tritonactor-{os.getuid()}"
    assert oct(folder.stat().st_mode & 0o777) == oct(0o700)
    assert len(Path(one).name) <= 32  # short: a Unix socket path holds about 100 bytes


@pytest.mark.parametrize("kind", ["open folder", "link", "file"])
def test_anything_else_under_the_folders_name_stops_the_server(tmp_dir: Path, kind: str) -> None:
    folder = tmp_dir / f"tritonactor-{os.getuid()}"
    if kind == "open folder":
        folder.mkdir(mode=0o700)
        folder.chmod(0o777)
    elif kind == "link":
        (tmp_dir / "elsewhere").mkdir(mode=0o700)
        folder.symlink_to(tmp_dir / "elsewhere")
    else:
        folder.write_text("")
    with pytest.raises(launch.EngineFailed, match="only it can enter"):
        launch.engine_socket(settings(tmp_dir))


def test_a_socket_answered_by_this_user_is_trusted(tmp_dir: Path) -> None:
    path = launch.engine_socket(settings(tmp_dir))
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(path)
        listener.listen()
        found = launch._probe(path)
        assert found is not None
        with found:  # connected: the listener's backlog holds it
            accepted, _ = listener.accept()
            accepted.close()
    os.unlink(path)
    assert launch._probe(path) is None


def test_a_server_on_port_0_is_also_named_by_its_process(
    tmp_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Port 0 names no server: the same command started twice must not find one engine.
    fixed = settings(tmp_dir)
    chosen = settings(tmp_dir, http_port=0, grpc_port=0, metrics_port=0)
    one, zero = launch.engine_socket(fixed), launch.engine_socket(chosen)
    monkeypatch.setattr(launch, "server_process", lambda: "4242:99")
    assert launch.engine_socket(fixed) == one  # fixed ports: the ports name it
    assert launch.engine_socket(chosen) != zero  # another server process: another engine
    assert launch.engine_socket(settings(tmp_dir, grpc_port=0)) != zero


def test_the_server_process_is_the_parent_of_a_worker_and_else_this_one() -> None:
    pid, _, started = launch.server_process().partition(":")
    assert pid == str(os.getpid()) and started.isdigit()
    context = multiprocessing.get_context("spawn")
    with context.Pool(1) as pool:  # a worker started as hypercorn and uvicorn start theirs
        assert pool.apply(launch.server_process) == launch.server_process()


def test_stale_lock_files_are_swept_and_one_held_is_kept(tmp_path: Path) -> None:
    """A lock file no start holds (its holder was killed mid-start) goes at the next start;
    one a start holds stays, and so does everything else in the folder."""
    stale, held, other = (tmp_path / name for name in ("a.sock.lock", "b.sock.lock", "c.sock"))
    for path in (stale, held, other):
        path.touch()
    holder = os.open(held, os.O_RDWR)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        launch._sweep_stale_locks(str(tmp_path))
        assert sorted(p.name for p in tmp_path.iterdir()) == ["b.sock.lock", "c.sock"]
    finally:
        os.close(holder)


def test_starts_take_turns_and_leave_no_lock_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`_locked_start` lets one start run at a time (each removes the lock file before it lets
    go, and one that waited on a file removed meanwhile locks the path's new one), and none
    leaves a file behind."""
    inside = tmp_path / "inside"
    overlaps: list[int] = []

    def start(settings: object, path: str, tied: bool) -> None:
        try:
            marker = os.open(inside, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            overlaps.append(1)
            return
        os.close(marker)
        time.sleep(0)  # (lets another thread run while this one is inside)
        os.unlink(inside)

    monkeypatch.setattr(launch, "_start", start)
    path = str(tmp_path / "engine.sock")

    def starts() -> None:
        for _ in range(100):
            launch._locked_start(settings(tmp_path), path)

    threads = [threading.Thread(target=starts) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not overlaps
    assert not os.path.exists(path + ".lock")
