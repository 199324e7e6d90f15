"""A local copy of a model repository in object storage: what the rest of the server reads.

The mirror is an ordinary repository folder (`<cache>/<bucket>-<digest>/repository/`), so the
scan, the loads, poll mode's watcher and `repository inspect` work on it as on any local
repository. `sync` brings models up to date with a listing of the store, one model at a time
and whole: a model's new folder is built aside (objects unchanged since the last copy are
copied from the old folder, the rest downloaded), then exchanged with the old one in one step,
so a scan always finds the model's folder. A manifest beside the folder records each model's
objects (ETag, size, time) and each copied file's size and time, so a restart downloads only
what changed, and a file written in the copy since is downloaded again.

One server uses a mirror at a time (a lock on its folder): two servers filling one folder
would replace each other's files under the models they serve.

Blocking: the server calls it from worker threads, one call at a time.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import hashlib
import json
import logging
import os
import shutil
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from tritonactor.store.location import StoreLocation
from tritonactor.store.remote import (
    ObjectInfo,
    StoreError,
    download,
    list_objects,
    open_filesystem,
)

__all__ = ["Listing", "StoreMirror", "Synced", "model_listing", "open_mirrors"]

log = logging.getLogger(__name__)

# model name -> {key inside the model's folder -> the object}
Listing = dict[str, dict[str, ObjectInfo]]

_MANIFEST_VERSION = 1


def model_listing(objects: Mapping[str, ObjectInfo]) -> tuple[Listing, list[str]]:
    """The objects grouped by model folder, and the keys left out with why: objects at the
    top (a repository holds folders), in hidden folders, and keys that would leave their
    folder once made a path (empty, "." or ".." parts)."""
    listing: Listing = {}
    skipped: list[str] = []
    for key, info in sorted(objects.items()):
        parts = key.rstrip("/").split("/")
        if len(parts) < 2 and not key.endswith("/"):
            continue  # a file beside the model folders: not a model, as in a local repository
        if any(part in ("", ".", "..") for part in parts):
            skipped.append(f"'{key}' (an empty, '.' or '..' part)")
            continue
        name, rest = parts[0], "/".join(parts[1:])
        if name.startswith("."):
            continue  # hidden, as a local repository's hidden folders
        inside = rest + "/" if key.endswith("/") and rest else rest
        entry = listing.setdefault(name, {})
        if inside:
            entry[inside] = info
    return listing, skipped


class StoreMirror:
    """The local copy of one store location, kept in `cache_dir`. `open` before use (it
    takes the folder's lock and reads the manifest), `close` after."""

    def __init__(self, location: StoreLocation, cache_dir: Path, filesystem: Any = None) -> None:
        self.location = location
        digest = hashlib.sha256(str(location).encode()).hexdigest()[:12]
        self.folder = cache_dir / f"{location.bucket}-{digest}"
        self.root = self.folder / "repository"
        self._filesystem = filesystem
        self._lock: TextIO | None = None
        self._synced: Listing = {}
        # model -> {key -> `_stamp` of the file as copied}: what says a file was not written to.
        self._stamps: dict[str, dict[str, int]] = {}
        # model -> the objects its last copy failed on: not tried again until they change.
        self._failed: Listing = {}
        self._skipped_logged: set[str] = set()

    def __str__(self) -> str:
        return str(self.location)

    # -- lifetime ------------------------------------------------------------------------------

    def open(self) -> None:
        """Takes the folder for this server: StoreError when another server holds it."""
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.root.mkdir(exist_ok=True)
        lock = (self.folder / "lock").open("a")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            raise StoreError(
                f"{self.location}: its cache folder {self.folder} is in use by another "
                "server; give each server its own --repository-cache-dir"
            ) from None
        self._lock = lock
        for leftover in ("staging", "trash"):
            shutil.rmtree(self.folder / leftover, ignore_errors=True)
        self._synced = self._verified(*self._read_manifest())

    def close(self) -> None:
        if self._lock is not None:
            self._lock.close()  # closing the file releases the lock
            self._lock = None

    def __enter__(self) -> StoreMirror:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the store's side ----------------------------------------------------------------------

    def listing(self) -> Listing:
        """Every model folder in the store now, with its objects. StoreError when the store
        cannot be listed."""
        if self._filesystem is None:
            self._filesystem = open_filesystem(self.location)
        listing, skipped = model_listing(list_objects(self._filesystem, self.location))
        for key in skipped:
            if key not in self._skipped_logged:
                log.warning("%s: object %s is not copied", self.location, key)
                self._skipped_logged.add(key)
        return listing

    def changed(self, listing: Listing) -> set[str]:
        """The models whose objects differ from the mirror's: added, changed or removed; not
        those whose objects are the ones a copy already failed on (tried again once they
        change, or when `sync` names them)."""
        names = set(listing) | set(self._synced)
        return {
            name
            for name in names
            if listing.get(name) != self._synced.get(name)
            and (name not in self._failed or listing.get(name) != self._failed[name])
        }

    def new(self, listing: Listing) -> set[str]:
        """The models in the store that the mirror has no copy of (failed copies aside)."""
        return {name for name in self.changed(listing) if name not in self._synced}

    def gone(self, listing: Listing) -> set[str]:
        """The models the mirror has a copy of that the store no longer holds."""
        return set(self._synced) - set(listing)

    def synced(self, name: str) -> dict[str, ObjectInfo] | None:
        """The objects the mirror holds of a model (None: not in the mirror)."""
        return self._synced.get(name)

    # -- bringing the mirror up to date --------------------------------------------------------

    def sync(self, listing: Listing, names: Iterable[str] | None = None) -> Synced:
        """Makes the mirror's copy of `names` (default: every changed model) what `listing`
        says. Each model on its own: one that cannot be copied (an object that cannot be
        downloaded or written) is in `failed` with why, and keeps its previous copy."""
        wanted = self.changed(listing) if names is None else set(names)
        result = Synced()
        for name in sorted(wanted):
            objects = listing.get(name)
            if objects == self._synced.get(name) and (objects is None or self._intact(name)):
                continue
            try:
                if objects is None:
                    self._remove(name)
                else:
                    self._replace(name, objects)
            except (StoreError, OSError) as error:
                shutil.rmtree(self.folder / "staging" / name, ignore_errors=True)
                if objects is not None:
                    self._failed[name] = dict(objects)
                result.failed[name] = (
                    str(error)
                    if isinstance(error, StoreError)
                    else (f"{self.location}: cannot copy '{name}': {error}")
                )
                log.error("%s; its copy stays as it was", result.failed[name])
                continue
            self._failed.pop(name, None)
            result.done.append(name)
        if result.done:
            names_done = ", ".join(f"'{name}'" for name in result.done)
            log.info("%s: copied %s", self.location, names_done)
        return result

    def _replace(self, name: str, objects: dict[str, ObjectInfo]) -> None:
        staging = self.folder / "staging" / name
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        current = self.root / name
        have = self._synced.get(name, {})
        stamps = self._stamps.get(name, {})
        parts = [key.rstrip("/").split("/") for key in objects]
        folders = {"/".join(path[:end]) for path in parts for end in range(1, len(path))}
        folders |= {key.rstrip("/") for key in objects if key.endswith("/")}
        for key in objects:
            too_long = [part for part in key.split("/") if len(os.fsencode(part)) > 255]
            if too_long:
                raise StoreError(
                    f"{self.location}: cannot copy '{name}': '{name}/{key}' has a name longer "
                    "than a filesystem allows (255 bytes)"
                )
            if not key.endswith("/") and key in folders:
                raise StoreError(
                    f"{self.location}: cannot copy '{name}': '{name}/{key}' is both an object "
                    "and a folder"
                )
        keys: list[str] = []
        targets: list[str] = []
        for key, info in objects.items():
            target = staging / key
            if key.endswith("/"):
                target.mkdir(parents=True, exist_ok=True)  # a folder marker: an empty folder
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            if have.get(key) == info and _stamp(current / key) == stamps.get(key):
                # Unchanged since it was copied (and not written to since): copied again
                # locally, not downloaded. A copy, not a link: the old folder's files are the
                # old version's, whatever it writes to them.
                shutil.copy2(current / key, target)
            else:
                keys.append(f"{name}/{key}")
                targets.append(str(target))
        assert self._filesystem is not None
        download(self._filesystem, self.location, keys, targets)
        for key, target in zip(keys, targets, strict=True):
            if os.path.getsize(target) != objects[key.split("/", 1)[1]].size:
                raise StoreError(
                    f"{self.location}: '{key}' is not the size the listing gave (replaced "
                    "while it was copied?); tried again once its objects change"
                )
        new_stamps = {key: _stamp(staging / key) for key in objects if not key.endswith("/")}
        # Forgotten before the swap and recorded after it: a crash in between leaves a folder
        # the next start copies again, never one the manifest describes wrongly.
        self._forget(name)
        self._swap(name, staging)
        self._synced[name] = dict(objects)
        self._stamps[name] = {key: stamp for key, stamp in new_stamps.items() if stamp}
        self._write_manifest()

    def _remove(self, name: str) -> None:
        self._forget(name)
        self._swap(name, None)

    def _forget(self, name: str) -> None:
        if self._synced.pop(name, None) is not None:
            self._stamps.pop(name, None)
            self._write_manifest()

    def _swap(self, name: str, staging: Path | None) -> None:
        """The model's folder becomes `staging` (None: none) in one step: a scan sees the old
        folder or the new one, never no folder (a manager that saw none would unload it)."""
        current = self.root / name
        trash = self.folder / "trash" / name
        trash.parent.mkdir(exist_ok=True)
        shutil.rmtree(trash, ignore_errors=True)
        if staging is None:
            if current.exists():
                os.rename(current, trash)
        elif current.exists() and _exchange(staging, current):
            os.rename(staging, trash)  # what `staging` names now is the old folder
        else:
            if current.exists():
                os.rename(current, trash)  # no atomic exchange here: a moment without it
            os.rename(staging, current)
        shutil.rmtree(trash, ignore_errors=True)

    def _intact(self, name: str) -> bool:
        """The model's copy is there as it was written: every file at its size and time."""
        folder = self.root / name
        stamps = self._stamps.get(name, {})
        return folder.is_dir() and all(
            (folder / key).is_dir()
            if key.endswith("/")
            else _stamp(folder / key) == stamps.get(key)
            for key in self._synced.get(name, {})
        )

    # -- the manifest --------------------------------------------------------------------------

    def _read_manifest(self) -> tuple[Listing, dict[str, dict[str, int]]]:
        path = self.folder / "manifest.json"
        try:
            document = json.loads(path.read_text())
            if document.get("version") != _MANIFEST_VERSION or document.get("location") != str(
                self.location
            ):
                return {}, {}
            listing: Listing = {}
            stamps: dict[str, dict[str, int]] = {}
            for name, objects in document["models"].items():
                listing[name] = {key: ObjectInfo.from_json(v[:3]) for key, v in objects.items()}
                stamps[name] = {key: int(v[3]) for key, v in objects.items() if len(v) > 3}
            return listing, stamps
        except FileNotFoundError:
            return {}, {}
        except (ValueError, TypeError, KeyError, AttributeError, IndexError) as error:
            log.warning("%s: its cache's manifest is unreadable (%s); copying anew", self, error)
            return {}, {}

    def _write_manifest(self) -> None:
        models: dict[str, dict[str, list[Any]]] = {}
        for name, objects in sorted(self._synced.items()):
            stamps = self._stamps.get(name, {})
            models[name] = {
                key: info.as_json() + ([stamps[key]] if key in stamps else [])
                for key, info in objects.items()
            }
        document = {"version": _MANIFEST_VERSION, "location": str(self.location), "models": models}
        path = self.folder / "manifest.json"
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(document, sort_keys=True))
        os.replace(temporary, path)

    def _verified(self, listing: Listing, stamps: dict[str, dict[str, int]]) -> Listing:
        """The manifest's models whose files are all in the mirror as they were written
        (size and modification time); the rest is copied again. Folders no entry accounts
        for are removed."""
        self._synced, self._stamps = listing, stamps
        kept = {name: objects for name, objects in listing.items() if self._intact(name)}
        self._stamps = {name: stamps.get(name, {}) for name in kept}
        for folder in self.root.iterdir():
            if folder.name not in kept:
                if folder.is_dir() and not folder.is_symlink():
                    shutil.rmtree(folder, ignore_errors=True)
                else:
                    folder.unlink(missing_ok=True)
        return kept


@dataclass
class Synced:
    """What a `sync` did: the models whose copies changed, and those it could not copy."""

    done: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)


def _stamp(path: Path) -> int | None:
    """A file's size and modification time as one number: what says it was written since."""
    try:
        status = path.stat()
    except OSError:
        return None
    if not stat.S_ISREG(status.st_mode):
        return None
    return status.st_mtime_ns * 1_000_003 + status.st_size


_RENAME_EXCHANGE = 2
_libc = ctypes.CDLL(None, use_errno=True)
_renameat2 = getattr(_libc, "renameat2", None)


def _exchange(first: Path, second: Path) -> bool:
    """Swaps two paths in one step (Linux renameat2 RENAME_EXCHANGE); False where the system
    or the filesystem cannot."""
    if _renameat2 is None:
        return False
    at_cwd = -100
    done = _renameat2(
        at_cwd, os.fsencode(first), at_cwd, os.fsencode(second), ctypes.c_uint(_RENAME_EXCHANGE)
    )
    if done == 0:
        return True
    error = ctypes.get_errno()
    if error in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(error, os.strerror(error), str(second))


def open_mirrors(
    repositories: Sequence[Path | StoreLocation], cache_dir: Path
) -> tuple[tuple[Path, ...], list[StoreMirror]]:
    """The repositories as local folders, in their order (each store location replaced by its
    mirror's folder), and the mirrors, open and equal to their stores but for the models that
    could not be copied (logged; tried again once they change, or at their load). StoreError
    for a store that cannot be listed; the mirrors opened so far are closed again."""
    local: list[Path] = []
    mirrors: list[StoreMirror] = []
    try:
        for repository in repositories:
            if isinstance(repository, Path):
                local.append(repository)
                continue
            mirror = StoreMirror(repository, cache_dir)
            mirror.open()
            mirrors.append(mirror)
            listing = mirror.listing()
            if not listing:
                log.warning("%s: no model folder there yet: the repository is empty", mirror)
            mirror.sync(listing)
            local.append(mirror.root)
    except BaseException:
        for mirror in mirrors:
            mirror.close()
        raise
    return tuple(local), mirrors
