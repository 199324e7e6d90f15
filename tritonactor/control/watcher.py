"""Poll mode: file events in the model repositories become settled "these models changed" reports.

A file event is only a hint. A model is reported once its folder has settled: no event for it
during the quiet period, and two signatures of its folder taken a quiet period apart are equal,
so a model still being copied is never reported. A periodic rescan compares every model folder
with what was last reported, for the changes watchfiles' poller cannot see (it compares mtimes
at one-second granularity, and an edit that keeps the mtime is invisible to it).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import os
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from watchfiles import awatch

from tritonactor.actors import Actor, ActorRef, ActorStopped
from tritonactor.control.repository import RepositoryError, folder_signature, model_folders

__all__ = [
    "MIN_QUIET_SECS",
    "RESCAN_INTERVALS",
    "Notify",
    "RepositoryChanged",
    "RepositoryWatcher",
    "take_snapshot",
    "tell_changes",
]

log = logging.getLogger(__name__)

# watchfiles' poller compares mtimes to the second, so a write in the same second as its last
# look at a file raises no event. A settle's last look must come after that blind second; and a
# shorter quiet period would take a copy that stalls for a moment for a settled one.
MIN_QUIET_SECS = 1.0
# The default rescan period, in poll intervals.
RESCAN_INTERVALS = 10
# watchfiles' thread returns at least this often, so that a repository that was missing when
# the watch began is picked up once it exists, without waiting for a file event.
_MIN_WAKE_MS = 200

Notify = Callable[[frozenset[str]], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class RepositoryChanged:
    """For the model manager: these models' folders changed (added, edited or removed) and have
    settled. A name may be in several repositories; sorting that out is the manager's job."""

    names: frozenset[str]


def tell_changes(ref: ActorRef[Any]) -> Notify:
    """A `notify` that tells `ref` a `RepositoryChanged` for each report."""

    async def notify(names: frozenset[str]) -> None:
        await ref.tell(RepositoryChanged(names))

    return notify


def take_snapshot(repositories: Sequence[Path]) -> dict[str, str]:
    """Every model's signature as the watcher computes it: the initial snapshot to give the
    watcher, taken when the models it describes are scanned. Blocking (it walks every folder)."""
    survey = _survey(_absolute(repositories), (), everything=True)
    return {name: signature for name, signature in survey.signatures.items() if signature}


# -- messages the watcher sends itself ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _FilesChanged:
    names: frozenset[str]


@dataclass(frozen=True, slots=True)
class _Settle:
    name: str
    generation: int


@dataclass(frozen=True, slots=True)
class _Rescan:
    periodic: bool = True  # False: a rescan of its own, that schedules no next one
    done: anyio.Event | None = None  # set once it has run (`caught_up`)


@dataclass(frozen=True, slots=True)
class _Looked:
    """watchfiles has looked at the repositories once more (sent after what it found)."""


@dataclass(slots=True)
class _Pending:
    """A model with unsettled changes: `probe` is the signature last taken of its folders."""

    generation: int
    probe: str | None


class RepositoryWatcher(Actor[Any]):
    """Reports each model whose settled signature differs from the last one reported.

    `snapshot` (model name -> signature, see `take_snapshot`) is what was last reported: the
    state the manager loaded. `quiet` defaults to the poll interval, at least `MIN_QUIET_SECS`;
    `rescan_every` to `RESCAN_INTERVALS` poll intervals.
    """

    def __init__(
        self,
        repositories: Sequence[Path],
        interval: float,
        notify: Notify,
        snapshot: Mapping[str, str] | None = None,
        quiet: float | None = None,
        rescan_every: float | None = None,
    ) -> None:
        super().__init__("repository-watcher")
        self._repositories = _absolute(repositories)
        self._interval = _positive("interval", interval)
        self._quiet = _positive("quiet", max(interval, MIN_QUIET_SECS) if quiet is None else quiet)
        self._rescan_every = _positive(
            "rescan_every", RESCAN_INTERVALS * interval if rescan_every is None else rescan_every
        )
        self._notify = notify
        self._reported: dict[str, str] = dict(snapshot or {})
        self._pending: dict[str, _Pending] = {}
        self._generation = 0
        self._unreadable: set[Path] = set()
        # What `caught_up` waits on: looks done, and an event set at each step.
        self._looks = 0
        self._stepped = anyio.Event()

    async def started(self) -> None:
        self.start_soon(self._watch_files)
        # The first rescan comes early, once watchfiles' first look and its blind second are
        # past: it covers what changed from the snapshot until then.
        self.tell_later(_Rescan(periodic=False), self._interval + MIN_QUIET_SECS)
        self.tell_later(_Rescan(), self._rescan_every)

    async def receive(self, message: Any) -> None:
        match message:
            case _FilesChanged(names):
                survey = await self._look(names)
                for name in names:
                    self._wait_for_quiet(name, survey.signatures[name])
            case _Settle(name, generation):
                pending = self._pending.get(name)
                if pending is not None and pending.generation == generation:
                    await self._settle(name, pending)
            case _Rescan(periodic, done):
                await self._rescan()
                if done is not None:
                    done.set()
                self._step()
                if periodic:
                    self.tell_later(_Rescan(), self._rescan_every)
            case _Looked():
                self._looks += 1
                self._step()

    async def caught_up(self) -> None:
        """Returns once the watcher has dealt with everything done to the repositories before
        the call: a rescan of its own has run after the call (it sees what watchfiles cannot),
        watchfiles has looked at them twice more since (the first look may have begun before),
        and no change is left to settle, each one reported or found unchanged. So once this
        returns, every change made before the call has been reported, and none will be again.
        Raises ActorStopped when the watcher stops first (a `notify` that raised stops it).
        For whoever must know the watcher has nothing more to say (the tests); unused, it
        costs nothing."""
        rescanned = anyio.Event()
        await self.ref.tell(_Rescan(periodic=False, done=rescanned))
        async with anyio.create_task_group() as group:
            group.start_soon(self._step_once_finished)
            while not rescanned.is_set() and self.running:
                await self._stepped.wait()
            looks = self._looks + 2
            while (self._looks < looks or self._pending) and self.running:
                await self._stepped.wait()
            group.cancel_scope.cancel()
        if not self.running:
            raise ActorStopped(f"actor '{self.name}' stopped before it caught up")

    async def _step_once_finished(self) -> None:
        await self.ref.join()
        self._step()

    def _step(self) -> None:
        self._stepped.set()
        self._stepped = anyio.Event()

    # -- settling ------------------------------------------------------------------------------

    def _wait_for_quiet(self, name: str, probe: str | None) -> None:
        # A new generation makes every earlier _Settle for this name stale: an event restarts
        # the quiet period.
        self._generation += 1
        self._pending[name] = _Pending(self._generation, probe)
        self.tell_later(_Settle(name, self._generation), self._quiet)

    async def _settle(self, name: str, pending: _Pending) -> None:
        survey = await self._look((name,))
        signature = survey.signatures[name]
        if signature is None and survey.unreadable:
            # The folder may be in the repository that cannot be read: not known to be removed.
            # The rescan looks again once every repository can be read.
            del self._pending[name]
            self._step()
            return
        if signature != pending.probe:
            self._wait_for_quiet(name, signature)  # still changing
            return
        if signature != self._reported.get(name):
            await self._report(name, signature)
        # Settled once reported: until then `caught_up` waits for it.
        del self._pending[name]
        self._step()

    async def _report(self, name: str, signature: str | None) -> None:
        log.info("model repository: '%s' %s", name, "removed" if signature is None else "changed")
        await self._notify(frozenset((name,)))
        # Recorded once the manager has it: if notify fails, the change was not delivered.
        if signature is None:
            self._reported.pop(name, None)
        else:
            self._reported[name] = signature

    async def _rescan(self) -> None:
        survey = await self._look(self._reported.keys(), everything=True)
        for name, signature in survey.signatures.items():
            if name in self._pending or (signature is None and survey.unreadable):
                continue
            if signature != self._reported.get(name):
                # Found without an event, perhaps mid-copy: it settles like any other change.
                log.debug("model repository: rescan found '%s' changed", name)
                self._wait_for_quiet(name, signature)

    async def _look(self, names: Iterable[str], everything: bool = False) -> _Survey:
        names = tuple(names)
        survey = await anyio.to_thread.run_sync(_survey, self._repositories, names, everything)
        self._log_unreadable(survey.unreadable)
        return survey

    def _log_unreadable(self, unreadable: Mapping[Path, str]) -> None:
        # Logged when a repository's state changes, not on every scan.
        for repository, reason in unreadable.items():
            if repository not in self._unreadable:
                log.error("%s; until it can be read, no model is reported removed", reason)
        for repository in self._unreadable - unreadable.keys():
            log.warning("model repository '%s' can be read again", repository)
        self._unreadable = set(unreadable)

    # -- file events ---------------------------------------------------------------------------

    async def _watch_files(self) -> None:
        stop = anyio.Event()
        async with anyio.create_task_group() as group:
            # watchfiles waits in a thread that a cancellation cannot interrupt; only its stop
            # event ends the wait, so it must be set the moment this task is cancelled.
            group.start_soon(_set_when_cancelled, stop)
            try:
                await self._watch_present(stop)
            finally:
                group.cancel_scope.cancel()

    async def _watch_present(self, stop: anyio.Event) -> None:
        """Watches the repositories that exist, again each time that set changes: watchfiles
        refuses a missing root. Failures are logged and retried; the rescan covers the gaps."""
        last_failure = ""
        watched: tuple[Path, ...] | None = None
        while not stop.is_set():
            present = await anyio.to_thread.run_sync(self._present_repositories)
            if watched is not None and present != watched:
                # A new watch sees nothing of what appeared before its first look (a repository
                # that came back, with models in it): a rescan once that look is done does.
                self.tell_later(_Rescan(periodic=False), self._interval + MIN_QUIET_SECS)
            watched = present
            try:
                if present:
                    await self._forward_events(present, stop)
                    continue
            except ActorStopped:
                return  # the watcher is stopping: its mailbox is closed
            except Exception as error:
                failure = f"{type(error).__name__}: {error}"
                level = logging.DEBUG if failure == last_failure else logging.WARNING
                log.log(level, "watching the model repositories failed (%s); retrying", failure)
                last_failure = failure
            try:  # none to look at, or the look failed: a look all the same (`caught_up`)
                await self.ref.tell(_Looked())
            except ActorStopped:
                return
            await anyio.sleep(self._interval)

    async def _forward_events(self, present: tuple[Path, ...], stop: anyio.Event) -> None:
        """Tells the watcher which models file events touched, until `stop` is set or the set
        of present repositories changes."""
        poll_ms = max(1, round(self._interval * 1000))
        events = awatch(
            *present,
            force_polling=True,  # inotify misses changes on network and overlay filesystems
            poll_delay_ms=poll_ms,
            rust_timeout=max(poll_ms, _MIN_WAKE_MS),
            yield_on_timeout=True,
            recursive=True,
            ignore_permission_denied=True,
            stop_event=stop,
        )
        async with contextlib.aclosing(events):
            async for changes in events:
                names = self._model_names(path for _, path in changes)
                if names:
                    await self.ref.tell(_FilesChanged(names))
                await self.ref.tell(_Looked())
                if await anyio.to_thread.run_sync(self._present_repositories) != present:
                    return

    def _present_repositories(self) -> tuple[Path, ...]:
        return tuple(repository for repository in self._repositories if repository.is_dir())

    def _model_names(self, paths: Iterable[str]) -> frozenset[str]:
        names: set[str] = set()
        for path in paths:
            for repository in self._repositories:
                prefix = f"{repository}{os.sep}"
                if path.startswith(prefix):
                    name = path[len(prefix) :].split(os.sep, 1)[0]
                    # A hidden folder is a model being prepared (copied in, then renamed).
                    if name and not name.startswith("."):
                        names.add(name)
        return frozenset(names)


async def _set_when_cancelled(event: anyio.Event) -> None:
    try:
        await anyio.sleep_forever()
    finally:
        event.set()


# -- signatures --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Survey:
    """Each model's signature (None: no model folder of that name in a readable repository),
    and the repositories that could not be read, with why."""

    signatures: dict[str, str | None]
    unreadable: dict[Path, str] = field(default_factory=dict)


def _survey(repositories: Sequence[Path], names: Collection[str], everything: bool) -> _Survey:
    """Signatures of `names`, and of every model folder too when `everything`."""
    listed: dict[Path, set[str]] = {}
    unreadable: dict[Path, str] = {}
    for repository in repositories:
        try:
            listed[repository] = {folder.name for folder in model_folders(repository)}
        except RepositoryError as error:
            unreadable[repository] = str(error)
    wanted = set(names)
    if everything:
        wanted.update(*listed.values())
    signatures = {
        name: _model_signature(
            [repository / name for repository, found in listed.items() if name in found]
        )
        for name in sorted(wanted)
    }
    return _Survey(signatures, unreadable)


def _model_signature(folders: list[Path]) -> str | None:
    if not folders:
        return None
    if len(folders) == 1:
        return folder_signature(folders[0])
    # A name in several repositories: a change to any copy is a change to the name.
    digest = hashlib.sha256()
    for folder in folders:
        digest.update(f"{folder}\0{folder_signature(folder)}\n".encode("utf-8", "surrogateescape"))
    return digest.hexdigest()[:16]


def _absolute(repositories: Sequence[Path]) -> tuple[Path, ...]:
    # Not resolved: watchfiles reports paths under the root as given, symlinked or not.
    return tuple(Path(os.path.abspath(repository)) for repository in repositories)


def _positive(name: str, seconds: float) -> float:
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"{name} must be a number of seconds > 0, not {seconds!r}")
    return seconds
