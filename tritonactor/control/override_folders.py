"""How long the folder of a file override lives.

`overrides.materialize` writes `<root>/<model>-<digest>/` for a load with `file:` parameters.
The folder is held while anything needs it: the load on its way (from `materialize` until the
manager has finished that load) and each version loaded from it (from its start until it is
unloaded or replaced). When the last hold goes, the folder is removed. A hold and a removal
happen under one lock, and `materialize` puts a folder in place under it too, so a load that
reuses a folder the moment its last user leaves either keeps it or writes it again.

Holds live in this process only. What a server that stopped (or crashed) left behind is
removed at the next start (`remove_stale_folders`), except the folders its journal still
restores.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import tempfile
import threading
from collections.abc import Collection
from pathlib import Path

__all__ = [
    "PARTIAL_SUFFIX",
    "folder_lock",
    "hold",
    "holds",
    "is_override_repository",
    "release",
    "remove_entry",
    "remove_stale_folders",
]

PARTIAL_SUFFIX = ".partial"
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
