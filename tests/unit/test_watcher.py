"""The poll-mode repository watcher against real folders: settling, hidden folders, the rescan."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import time
import traceback
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest

from tritonactor.actors import Actor, ActorStopped, ActorSystem
from tritonactor.actors.reply import Reply
from tritonactor.control.watcher import (
    RepositoryChanged,
    RepositoryWatcher,
    take_snapshot,
    tell_changes,
)

pytestmark = pytest.mark.anyio

INTERVAL = 0.05
QUIET = 0.25
# Waits end on events; these only keep a broken watcher from hanging the suite.
HANG = 30.0


class Reports:
    """A `notify` that records each report with the time it came."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, frozenset[str]]] = []
        self._came = anyio.Event()

    async def __call__(self, names: frozenset[str]) -> None:
        self.calls.append((time.monotonic(), names))
        self._came.set()
        self._came = anyio.Event()

    @property
    def names(self) -> list[set[str]]:
        return [set(names) for _, names in self.calls]

    async def wait(self, count: int = 1) -> None:
        with anyio.fail_after(HANG):
            while len(self.calls) < count:
                await self._came.wait()


async def caught_up(watcher: RepositoryWatcher) -> None:
    """Until the watcher has dealt with everything done before now (so that, after it, a
    report that has not come never will)."""
    with anyio.fail_after(HANG):
        await watcher.caught_up()


@contextlib.asynccontextmanager
async def watching(
    repositories: Sequence[Path],
    notify: Any,
    snapshot: dict[str, str] | None = None,
    catch_up: bool = True,
    **options: Any,
) -> AsyncIterator[RepositoryWatcher]:
    options.setdefault("quiet", QUIET)
    options.setdefault("rescan_every", 30.0)  # out of the way unless a test is about it
    if snapshot is None:
        snapshot = take_snapshot(repositories)
    watcher = RepositoryWatcher(repositories, INTERVAL, notify, snapshot=snapshot, **options)
    async with ActorSystem() as system:
        await system.spawn(watcher)
        if catch_up:  # watchfiles has taken its first look, and what was there is dealt with
            await caught_up(watcher)
        yield watcher


def make_model(folder: Path, config: str = 'backend: "onnxruntime"\n') -> None:
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(config)
    (folder / "1" / "model.onnx").write_bytes(b"weights")
    # Dated in the past, as a model in place before the server started is: watchfiles' poller
    # compares mtimes to the second, and would not see an edit within the second they were made.
    past = time.time() - 60
    for path in (folder / "config.pbtxt", folder / "1" / "model.onnx"):
        os.utime(path, (past, past))


def copy_slowly(folder: Path, seconds: float = 0.8) -> float:
    """A model folder written file by file, its weights appended to for `seconds`; returns the
    time of the last write."""
    folder.mkdir()
    (folder / "config.pbtxt").write_text('backend: "onnxruntime"\n')
    (folder / "1").mkdir()
    deadline = time.monotonic() + seconds
    with open(folder / "1" / "model.onnx", "wb") as weights:
        while True:
            weights.write(b"w" * 4096)
            weights.flush()
            last_write = time.monotonic()
            if last_write >= deadline:
                return last_write
            time.sleep(0.03)


async def test_a_model_copied_in_slowly_is_reported_once_after_its_last_write(
    tmp_path: Path,
) -> None:
    reports = Reports()
    async with watching([tmp_path], reports) as watcher:
        # A real writer thread, so that a busy event loop cannot pause it along with the watcher.
        last_write = await anyio.to_thread.run_sync(copy_slowly, tmp_path / "slow")
        await reports.wait()
        await caught_up(watcher)  # and nothing more comes
    assert reports.names == [{"slow"}]
    reported_at = reports.calls[0][0]
    # Settled means two equal looks a quiet period apart, both after the last write.
    assert reported_at >= last_write + QUIET - 0.02


async def test_a_deleted_model_is_reported_to_the_manager_actor(tmp_path: Path) -> None:
    make_model(tmp_path / "gone")
    make_model(tmp_path / "kept")
    received: list[RepositoryChanged] = []
    first = anyio.Event()

    class Manager(Actor[Any]):
        async def receive(self, message: Any) -> None:
            if isinstance(message, Reply):  # asked: every earlier message has been received
                message.set(None)
            else:
                received.append(message)
                first.set()

    async with ActorSystem() as system:
        manager = await system.spawn(Manager("manager"))
        async with watching([tmp_path], tell_changes(manager)) as watcher:
            shutil.rmtree(tmp_path / "gone")
            with anyio.fail_after(HANG):
                await first.wait()
            await caught_up(watcher)  # and nothing more is told
            await manager.ask(lambda reply: reply)  # (the manager's mailbox is read in order)
    assert received == [RepositoryChanged(frozenset({"gone"}))]


async def test_an_edited_config_is_reported_once(tmp_path: Path) -> None:
    make_model(tmp_path / "edited")
    make_model(tmp_path / "untouched")
    reports = Reports()
    async with watching([tmp_path], reports) as watcher:
        (tmp_path / "edited" / "config.pbtxt").write_text(
            'backend: "onnxruntime"\nmax_batch_size: 8\n'
        )
        (tmp_path / "edited" / "1" / "model.onnx").write_bytes(b"new weights")
        await reports.wait()
        await caught_up(watcher)
    assert reports.names == [{"edited"}]


async def test_a_hidden_folder_is_ignored_until_renamed(tmp_path: Path) -> None:
    reports = Reports()
    async with watching([tmp_path], reports) as watcher:
        make_model(tmp_path / ".incoming")
        (tmp_path / ".incoming" / "1" / "model.onnx").write_bytes(b"more weights")
        await caught_up(watcher)
        assert reports.calls == []
        (tmp_path / ".incoming").rename(tmp_path / "fresh")
        await reports.wait()
        await caught_up(watcher)
    assert reports.names == [{"fresh"}]


async def test_the_rescan_catches_an_edit_that_keeps_size_and_mtime(tmp_path: Path) -> None:
    make_model(tmp_path / "sly", config='backend: "onnxruntime"\n')
    config = tmp_path / "sly" / "config.pbtxt"
    reports = Reports()
    async with watching([tmp_path], reports, rescan_every=0.5):
        before = config.stat()
        config.write_text('backend: "onnxruntime"\n'.upper())  # same size
        # watchfiles' poller compares mtimes only: restored, the edit is invisible to it.
        os.utime(config, ns=(before.st_atime_ns, before.st_mtime_ns))
        await reports.wait()
    assert reports.names == [{"sly"}]


async def test_a_change_before_the_watcher_started_is_caught_by_the_first_rescan(
    tmp_path: Path,
) -> None:
    make_model(tmp_path / "early")
    snapshot = take_snapshot([tmp_path])  # what the manager loaded
    (tmp_path / "early" / "config.pbtxt").write_text('backend: "onnxruntime"\nmax_batch_size: 4\n')
    make_model(tmp_path / "late")
    reports = Reports()
    # Not caught up at the start: only the watcher's own first rescan can find these (made
    # before watchfiles' first look, they raise no event).
    async with watching([tmp_path], reports, snapshot=snapshot, catch_up=False) as watcher:
        await reports.wait(count=2)
        await caught_up(watcher)
    assert sorted(map(sorted, reports.names)) == [["early"], ["late"]]


async def test_a_missing_repository_is_logged_and_its_models_not_reported_removed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    make_model(first / "here")
    make_model(second / "there")
    snapshot = take_snapshot([first, second])
    shutil.rmtree(second)
    reports = Reports()
    with caplog.at_level(logging.ERROR, logger="tritonactor.control.watcher"):
        watch = watching([first, second], reports, snapshot=snapshot, rescan_every=0.2)
        async with watch as watcher:
            (first / "here" / "config.pbtxt").write_text('backend: "pytorch"\n')
            await reports.wait()
            for _ in range(3):  # rescans, each with 'second' missing: 'there' stays unreported
                await caught_up(watcher)
    assert reports.names == [{"here"}]
    assert f"model repository '{second}' does not exist" in caplog.text


async def test_a_repository_that_comes_back_is_watched_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    repository, away = tmp_path / "models", tmp_path / "unmounted"
    make_model(repository / "old")
    reports = Reports()
    with caplog.at_level(logging.WARNING, logger="tritonactor.control.watcher"):
        async with watching([repository], reports) as watcher:
            repository.rename(away)
            # A rescan that finds it missing must not take 'old' for removed.
            await caught_up(watcher)
            assert reports.calls == []
            away.rename(repository)
            make_model(repository / "back")
            await reports.wait()
            await caught_up(watcher)
    assert reports.names == [{"back"}]
    assert f"model repository '{repository}' does not exist" in caplog.text
    assert f"model repository '{repository}' can be read again" in caplog.text


def watchfiles_waiting() -> bool:
    """Whether a thread of this process is in watchfiles' wait for file changes (a worker
    thread running `RustNotify.watch`)."""
    return any(
        type(getattr(frame.f_locals.get("func"), "__self__", None)).__name__ == "RustNotify"
        for top in sys._current_frames().values()
        for frame, _ in traceback.walk_stack(top)
    )


async def test_stopping_the_watcher_ends_its_tasks(tmp_path: Path) -> None:
    make_model(tmp_path / "model")
    # A minute's interval: watchfiles' thread sits in its wait for a minute unless the stop
    # reaches it (the waits below give up after half that).
    watcher = RepositoryWatcher([tmp_path], 60.0, Reports(), quiet=QUIET)
    async with ActorSystem() as system:
        await system.spawn(watcher)
        with anyio.fail_after(HANG):
            while not watchfiles_waiting():
                await anyio.sleep(0.01)
        watcher.ref.stop()
        with anyio.fail_after(HANG):
            await watcher.ref.join()
    assert not watcher.running
    assert not watchfiles_waiting()


async def test_caught_up_says_when_the_watcher_has_stopped(tmp_path: Path) -> None:
    """A `notify` that raises stops the watcher: waiting for it to catch up then raises
    rather than waiting for ever."""

    async def failing(names: frozenset[str]) -> None:
        raise RuntimeError("the manager is gone")

    make_model(tmp_path / "model")
    async with watching([tmp_path], failing) as watcher:
        (tmp_path / "model" / "config.pbtxt").write_text('backend: "pytorch"\n')
        with pytest.raises(ActorStopped), anyio.fail_after(HANG):
            await watcher.caught_up()
