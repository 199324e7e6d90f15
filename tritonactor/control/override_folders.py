"""The folder a file override is served from: how it is written, and how long it lives.

A load with `file:` parameters (checked by `load_parameters`) is served from a folder of its
own under the server's state directory, `<root>/<model>-<digest>/<model>/`, so
`<root>/<model>-<digest>` is a one-model repository that `scan_repositories` reads like any
other. The digest (`load_parameters.options_digest`) covers the config and every file, so the
same override always maps to the same folder and a restarted server finds it again from the
digest its journal recorded. `materialize` writes the folder.

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

import errno
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

from google.protobuf import message_factory, text_format

from tritonactor._proto.inference import ModelConfig
from tritonactor.control.load_parameters import (
    LoadOptions,
    _quote,
    check_file_override,
    options_digest,
)
from tritonactor.control.repository import CONFIG_FILENAME
from tritonactor.core.errors import internal

__all__ = [
    "LOCK_NAME",
    "PARTIAL_SUFFIX",
    "RootClaim",
    "claim_root",
    "folder_lock",
    "hold",
    "holds",
    "is_override_repository",
    "materialize",
    "override_model_folder",
    "override_root",
    "release",
    "remove_entry",
    "remove_stale_folders",
]

PARTIAL_SUFFIX = ".partial"
#: The file in an override root that each server using the root holds a shared `flock` on.
LOCK_NAME = ".lock"
_DIR_MODE = 0o700
_FILE_MODE = 0o600
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_CREATE_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC

_PROTOBUF_CONFIG = message_factory.GetMessageClass(ModelConfig.DESCRIPTOR)

log = logging.getLogger(__name__)
_NAME = re.compile(r"(?P<model>.+)-[0-9a-f]{32}")

_lock = threading.RLock()
_holds: dict[str, int] = {}


def folder_lock() -> threading.RLock:
    """The lock under which a folder is put in place, held or removed."""
    return _lock


# ---------------------------------------------------------------------------------------------
# Writing a folder


def override_model_folder(root: Path, model: str, digest: str) -> Path:
    """Where the override with `digest` of `model` lives; its parent is a one-model repository."""
    return root / f"{model}-{digest}" / model


def materialize(options: LoadOptions, model: str, root: Path) -> Path:
    """Write a file override as `<root>/<model>-<digest>/<model>/` and return that model folder.

    The folder appears whole or not at all (written in a hidden sibling, then renamed), holds
    config.pbtxt written from the config JSON beside the given files, and is reused when it
    already exists with the same content. No symlink is followed or created: a link found where
    the folder belongs is removed, never written through. Folders are 0700, files 0600.
    The folder returned is held for the load (`release` once it is done).
    """
    if not options.files:
        raise ValueError("only a load with file overrides needs a folder of its own")
    pbtxt = _config_pbtxt(check_file_override(options, model), model)

    digest = options_digest(options)
    folder = override_model_folder(root, model, digest)
    try:
        _write_override(root, folder.parent, digest, model, pbtxt, options.files)
    except OSError as exc:
        raise internal(f"cannot write the file override of model {_quote(model)}: {exc}") from None
    return folder


def _config_pbtxt(config: ModelConfig, model: str) -> bytes:
    if not config.name:
        config.name = model
    message = _PROTOBUF_CONFIG.FromString(bytes(config))
    return text_format.MessageToString(message).encode("utf-8")


def _write_override(
    root: Path,
    repository: Path,
    digest: str,
    model: str,
    pbtxt: bytes,
    files: tuple[tuple[str, bytes], ...],
) -> None:
    root.mkdir(mode=_DIR_MODE, parents=True, exist_ok=True)
    # Checked and held under the folders' lock: a removal cannot slip in between.
    with folder_lock():
        if _is_intact(repository, model, pbtxt, files):
            hold(repository, model)
            return
    staging = Path(tempfile.mkdtemp(prefix=f".{digest}.", suffix=PARTIAL_SUFFIX, dir=root))
    try:
        _write_tree(staging, model, pbtxt, files)
        with folder_lock():
            _move_into_place(staging, repository, model, pbtxt, files)
            hold(repository, model)
        _fsync_directory(root)
    finally:
        if os.path.lexists(staging):
            remove_entry(staging)


def _write_tree(
    staging: Path, model: str, pbtxt: bytes, files: tuple[tuple[str, bytes], ...]
) -> None:
    opened: dict[str, int] = {}
    try:
        opened[""] = os.open(staging, _OPEN_DIR)
        model_fd = _make_directory(opened[""], model)
        opened[model] = model_fd
        _write_file(model_fd, CONFIG_FILENAME, pbtxt)
        for path, content in files:
            parent_fd = model_fd
            parts = path.split("/")
            for end in range(1, len(parts)):
                key = f"{model}/{'/'.join(parts[:end])}"
                if key not in opened:
                    opened[key] = _make_directory(parent_fd, parts[end - 1])
                parent_fd = opened[key]
            _write_file(parent_fd, parts[-1], content)
        # Deepest folders first, so each folder's entries are durable before its parent's.
        for key in sorted(opened, key=lambda name: name.count("/"), reverse=True):
            os.fsync(opened[key])
    finally:
        for fd in opened.values():
            os.close(fd)


def _make_directory(parent_fd: int, name: str) -> int:
    os.mkdir(name, _DIR_MODE, dir_fd=parent_fd)
    fd = os.open(name, _OPEN_DIR, dir_fd=parent_fd)
    try:
        os.fchmod(fd, _DIR_MODE)  # exact, whatever the umask
    except OSError:
        os.close(fd)
        raise
    return fd


def _write_file(parent_fd: int, name: str, content: bytes) -> None:
    fd = os.open(name, _CREATE_FILE, _FILE_MODE, dir_fd=parent_fd)
    with open(fd, "wb", closefd=True) as stream:
        os.fchmod(fd, _FILE_MODE)
        stream.write(content)
        stream.flush()
        os.fsync(fd)


def _move_into_place(
    staging: Path,
    repository: Path,
    model: str,
    pbtxt: bytes,
    files: tuple[tuple[str, bytes], ...],
) -> None:
    try:
        os.rename(staging, repository)
        return
    except OSError as exc:
        if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR):
            raise
    # Something holds the name: the same override written meanwhile (keep it), or a stale or
    # foreign entry, a symlink included (remove the entry itself, never what it points to).
    if _is_intact(repository, model, pbtxt, files):
        return
    remove_entry(repository)
    os.rename(staging, repository)


def _is_intact(
    repository: Path, model: str, pbtxt: bytes, files: tuple[tuple[str, bytes], ...]
) -> bool:
    """Whether `repository` is a real folder holding exactly this override: the same entries
    (no link, nothing extra: an extra version folder would be served), files of the right
    sizes, the same config.pbtxt. Model files are not read again: the digest in the name
    vouches for what was renamed into place."""
    try:
        repository_fd = os.open(repository, _OPEN_DIR)
    except OSError:
        return False
    try:
        found: dict[str, int] = {}
        _list_entries(repository_fd, "", found)
        if found != _expected_entries(model, pbtxt, files):
            return False
        model_fd = os.open(model, _OPEN_DIR, dir_fd=repository_fd)
        try:
            return _read_regular_file(model_fd, CONFIG_FILENAME) == pbtxt
        finally:
            os.close(model_fd)
    except OSError:
        return False
    finally:
        os.close(repository_fd)


_FOLDER = -1
_NOT_OURS = -2  # a symlink, FIFO, socket or device: materialize never writes one


def _expected_entries(
    model: str, pbtxt: bytes, files: tuple[tuple[str, bytes], ...]
) -> dict[str, int]:
    expected = {f"{model}/": _FOLDER, f"{model}/{CONFIG_FILENAME}": len(pbtxt)}
    for path, content in files:
        parts = path.split("/")
        for end in range(1, len(parts)):
            expected[f"{model}/{'/'.join(parts[:end])}/"] = _FOLDER
        expected[f"{model}/{path}"] = len(content)
    return expected


def _list_entries(directory_fd: int, prefix: str, found: dict[str, int]) -> None:
    """Every entry below the folder: relative path -> size, `_FOLDER` or `_NOT_OURS`."""
    with os.scandir(directory_fd) as entries:
        for entry in entries:
            relative = prefix + entry.name
            if entry.is_dir(follow_symlinks=False):
                found[relative + "/"] = _FOLDER
                child_fd = os.open(entry.name, _OPEN_DIR, dir_fd=directory_fd)
                try:
                    _list_entries(child_fd, relative + "/", found)
                finally:
                    os.close(child_fd)
            elif entry.is_file(follow_symlinks=False):
                found[relative] = entry.stat(follow_symlinks=False).st_size
            else:
                found[relative] = _NOT_OURS


def _read_regular_file(parent_fd: int, name: str) -> bytes | None:
    # O_NONBLOCK: should a FIFO have replaced the file meanwhile, opening it must not hang.
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    fd = os.open(name, flags, dir_fd=parent_fd)
    with open(fd, "rb", closefd=True) as stream:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return stream.read()


def _fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------------------
# How long a folder lives


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
