"""How long the folder of a file override lives.

`overrides.materialize` writes `<root>/<model>-<digest>/` for a load with `file:` parameters.
The folder is held while anything needs it: the load on its way (from `materialize` until the
manager has finished that load) and each version loaded from it (from its start until it is
unloaded or replaced). When the last hold goes, the folder is removed. A hold and a removal
happen under one lock, and `materialize` puts a folder in place under it too, so a load that
reuses a folder the moment its last user leaves either keeps it or writes it again.

Holds live in this process only. What a server that stopped (or crashed) left behind is
removed at the next start (`claim_root`, `remove_stale_folders`), except the folders its journal
still restores. Each journal has a root of its own (`override_root`), and a server holds a shared
lock on it while it runs: a start sweeps the root only when no other server holds it.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import shutil
import stat
import tempfile
import threading
from collections.abc import Collection
from pathlib import Path

__all__ = [
    "LOCK_NAME",
    "PARTIAL_SUFFIX",
    "RootClaim",
    "claim_root",
    "folder_lock",
    "hold",
    "holds",
    "is_override_repository",
    "override_root",
    "release",
    "remove_entry",
    "remove_stale_folders",
]

PARTIAL_SUFFIX = ".partial"
#: The file in an override root that each server using the root holds a shared `flock` on.
LOCK_NAME = ".lock"
_DIR_MODE = 0o700

log = logging.getLogger(__name__)
_NAME = re.compile(r"(?P<model>.+)-[0-9a-f]{32}")

_lock = threading.RLock()
_holds: dict[str, int] = {}


def folder_lock() -> threading.RLock:
    """The lock under which a folder is put in place, held or removed."""
    return _lock


def is_override_repository(repository: Path, model: str) -> bool:
    """Whether `repository` is named as `materialize` names the folder of an override of
    `model` (`<model>-<32 hex digits>`): only such a folder is ever removed here."""
    found = _NAME.fullmatch(repository.name)
    return found is not None and found["model"] == model


def hold(repository: Path, model: str) -> Path | None:
    """One hold more on an override folder; None (and nothing held) for a repository that is
    not one (a config-only override loads from the model repository itself)."""
    if not is_override_repository(repository, model):
        return None
    key = str(repository)
    with _lock:
        _holds[key] = _holds.get(key, 0) + 1
    return repository


def holds(repository: Path) -> int:
    """How many holds the folder has (for tests and logs)."""
    with _lock:
        return _holds.get(str(repository), 0)


def release(repository: Path | None, model: str) -> bool:
    """One hold less; once none is left the folder is removed. Returns whether it was."""
    if repository is None or not is_override_repository(repository, model):
        return False
    key = str(repository)
    with _lock:
        left = _holds.get(key, 0) - 1
        if left > 0:
            _holds[key] = left
            return False
        _holds.pop(key, None)
        doomed = _detach(repository)
    if doomed is not None:
        shutil.rmtree(doomed, ignore_errors=True)
    return doomed is not None


def override_root(journal: Path) -> Path:
    """Where the file overrides of the loads `journal` records are written: beside the journal
    and named after it (`state/s1.jsonl` -> `state/s1.jsonl.overrides/`), so that servers whose
    journals share a folder never share a root, and never sweep one another's folders."""
    return journal.with_name(journal.name + ".overrides")


class RootClaim:
    """A running server's share of its override root: a shared `flock` on `<root>/.lock`, held
    until `close` (or until the process ends). `swept` names what the start removed; it is
    empty when another server held the root then (`alone` is False)."""

    def __init__(self, root: Path, fd: int | None, swept: list[str], alone: bool) -> None:
        self.root = root
        self.swept = swept
        self.alone = alone
        self._fd: int | None = fd

    def close(self) -> None:
        """Let the root go (closing the descriptor releases the lock)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def claim_root(root: Path, keep: Collection[Path] = ()) -> RootClaim:
    """At start, before any load: take a share of `root`, and sweep it
    (`remove_stale_folders(root, keep)`) only if no other running server holds a share (two
    servers given one journal share its root: one's start must not remove the other's folders,
    nor the half-written folder of a load it is writing). The share is held while the server
    runs, so a later start sees it. A root that cannot be made or locked (a read-only state
    folder) is not swept: a warning says so, and loads with file overrides will fail there."""
    try:
        root.mkdir(mode=_DIR_MODE, parents=True, exist_ok=True)
        fd = os.open(root / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as error:
        log.warning("cannot use the override folder %s: %s", root, error.strerror or error)
        return RootClaim(root, None, [], alone=False)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            alone = True
        except BlockingIOError:
            alone = False
        swept = remove_stale_folders(root, keep) if alone else []
        # From now on a share: other servers may start (and will not sweep) while this one runs.
        fcntl.flock(fd, fcntl.LOCK_SH)
    except BaseException:
        os.close(fd)
        raise
    if swept:
        log.info("removed %d override folder(s) no load in force uses from %s", len(swept), root)
    if not alone:
        log.info(
            "another server uses the override folder %s (the same journal): "
            "its stale folders are left for a start that is alone",
            root,
        )
    return RootClaim(root, fd, swept, alone)


def remove_stale_folders(root: Path, keep: Collection[Path] = ()) -> list[str]:
    """At start, before any load: remove what an interrupted write left (hidden `.partial`
    entries) and every override folder the journal does not restore (`keep`). Returns the
    names removed."""
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return []
    kept = {os.path.normpath(path) for path in keep}
    removed = []
    for entry in entries:
        partial = entry.name.startswith(".") and entry.name.endswith(PARTIAL_SUFFIX)
        stale = _NAME.fullmatch(entry.name) is not None and os.path.normpath(entry.path) not in kept
        if partial or stale:
            remove_entry(Path(entry.path))
            removed.append(entry.name)
    return removed


def remove_entry(path: Path) -> None:
    """Remove a file, link or folder (a link itself, never what it points to)."""
    doomed = _detach(path)
    if doomed is not None:
        shutil.rmtree(doomed)  # fd-based on Linux: does not follow symlinks inside


def _detach(path: Path) -> Path | None:
    """Take `path` out of its name at once: a folder is renamed into a hidden `.partial`
    folder (returned, for the caller to delete), anything else is unlinked."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISDIR(info.st_mode):
        os.unlink(path)
        return None
    # A unique hidden name first, so the folder's name is free at once and a half-removed
    # folder is never mistaken for a whole one.
    doomed = Path(tempfile.mkdtemp(prefix=".removing.", suffix=PARTIAL_SUFFIX, dir=path.parent))
    os.rename(path, doomed / "folder")
    return doomed
