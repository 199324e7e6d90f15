"""A local copy of a model repository in object storage: what the rest of the server reads.

The mirror is an ordinary repository folder (`<cache>/<bucket>-<digest>/repository/`), so the
scan, the loads, poll mode's watcher and `repository inspect` work on it as on any local
repository. `sync` brings models up to date with a listing of the store, one model at a time
and whole: a model's new folder is built aside (objects unchanged since the last sync are
hard links to the old files, the rest downloaded), then put in place by rename, so a reader
sees the old model or the new one, never a mix. A manifest beside the folder records each
model's objects (ETag, size, time), so a restart downloads only what changed.

One server uses a mirror at a time (a lock on its folder): two servers filling one folder
would replace each other's files under the models they serve.

Blocking: the server calls it from worker threads, one call at a time.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Iterable, Mapping, Sequence
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

__all__ = ["Listing", "StoreMirror", "model_listing", "open_mirrors"]

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
        self._synced = self._verified(self._read_manifest())

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
        """The models whose objects differ from the mirror's: added, changed or removed."""
        names = set(listing) | set(self._synced)
        return {name for name in names if listing.get(name) != self._synced.get(name)}

    def synced(self, name: str) -> dict[str, ObjectInfo] | None:
        """The objects the mirror holds of a model (None: not in the mirror)."""
        return self._synced.get(name)

    # -- bringing the mirror up to date --------------------------------------------------------

    def sync(self, listing: Listing, names: Iterable[str] | None = None) -> list[str]:
        """Makes the mirror's copy of `names` (default: every changed model) what `listing`
        says, and returns those that changed. StoreError when an object cannot be
        downloaded; the models synced before it stay synced."""
        wanted = self.changed(listing) if names is None else set(names)
        done: list[str] = []
        for name in sorted(wanted):
            objects = listing.get(name)
            if objects == self._synced.get(name) and (objects is None or self._present(name)):
                continue
            if objects is None:
                self._remove(name)
            else:
                self._replace(name, objects)
            done.append(name)
            self._write_manifest()
        if done:
            log.info("%s: copied %s", self.location, ", ".join(f"'{name}'" for name in done))
        return done

    def _replace(self, name: str, objects: dict[str, ObjectInfo]) -> None:
        staging = self.folder / "staging" / name
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        current = self.root / name
        have = self._synced.get(name, {})
        keys: list[str] = []
        targets: list[str] = []
        for key, info in objects.items():
            target = staging / key
            if key.endswith("/"):
                target.mkdir(parents=True, exist_ok=True)  # a folder marker: an empty folder
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            if have.get(key) == info and _same_size(current / key, info):
                _link_or_copy(current / key, target)
            else:
                keys.append(f"{name}/{key}")
                targets.append(str(target))
        assert self._filesystem is not None
        download(self._filesystem, self.location, keys, targets)
        for key, target in zip(keys, targets, strict=True):
            info = objects[key.split("/", 1)[1]]
            if os.path.getsize(target) != info.size:
                # Replaced between the listing and the download: the next listing says what
                # it is now.
                shutil.rmtree(staging, ignore_errors=True)
                raise StoreError(f"{self.location}: '{key}' changed while it was downloaded")
        self._swap(name, staging)
        self._synced[name] = dict(objects)

    def _remove(self, name: str) -> None:
        self._swap(name, None)
        self._synced.pop(name, None)

    def _swap(self, name: str, staging: Path | None) -> None:
        current = self.root / name
        trash = self.folder / "trash" / name
        if current.exists():
            trash.parent.mkdir(exist_ok=True)
            shutil.rmtree(trash, ignore_errors=True)
            os.rename(current, trash)
        if staging is not None:
            os.rename(staging, current)
        shutil.rmtree(trash, ignore_errors=True)

    def _present(self, name: str) -> bool:
        return (self.root / name).is_dir()

    # -- the manifest --------------------------------------------------------------------------

    def _read_manifest(self) -> Listing:
        path = self.folder / "manifest.json"
        try:
            document = json.loads(path.read_text())
            if document.get("version") != _MANIFEST_VERSION or document.get("location") != str(
                self.location
            ):
                return {}
            return {
                name: {key: ObjectInfo.from_json(info) for key, info in objects.items()}
                for name, objects in document["models"].items()
            }
        except FileNotFoundError:
            return {}
        except (ValueError, TypeError, KeyError, AttributeError) as error:
            log.warning("%s: its cache's manifest is unreadable (%s); copying anew", self, error)
            return {}

    def _write_manifest(self) -> None:
        document = {
            "version": _MANIFEST_VERSION,
            "location": str(self.location),
            "models": {
                name: {key: info.as_json() for key, info in objects.items()}
                for name, objects in sorted(self._synced.items())
            },
        }
        path = self.folder / "manifest.json"
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(document, sort_keys=True))
        os.replace(temporary, path)

    def _verified(self, manifest: Listing) -> Listing:
        """The manifest's models whose files are all in the mirror at their sizes; the rest
        is copied again. Folders no entry accounts for are removed."""
        kept: Listing = {}
        for name, objects in manifest.items():
            folder = self.root / name
            if folder.is_dir() and all(
                (folder / key).is_dir() if key.endswith("/") else _same_size(folder / key, info)
                for key, info in objects.items()
            ):
                kept[name] = objects
        for folder in self.root.iterdir():
            if folder.name not in kept:
                if folder.is_dir() and not folder.is_symlink():
                    shutil.rmtree(folder, ignore_errors=True)
                else:
                    folder.unlink(missing_ok=True)
        return kept


def _same_size(path: Path, info: ObjectInfo) -> bool:
    with contextlib.suppress(OSError):
        return path.is_file() and path.stat().st_size == info.size
    return False


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def open_mirrors(
    repositories: Sequence[Path | StoreLocation], cache_dir: Path
) -> tuple[tuple[Path, ...], list[StoreMirror]]:
    """The repositories as local folders, in their order (each store location replaced by its
    mirror's folder), and the mirrors, open and equal to their stores. On a StoreError the
    mirrors opened so far are closed again."""
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
