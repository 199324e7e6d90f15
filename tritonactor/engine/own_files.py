"""Files an engine makes at a known path (its sockets, a start's lock) and removes when it is
done: removed only while the path still names the file it made. An engine that a killed server
left running, stopping later, must not remove the files of the engine that has taken its place
since (docs/operations.md, "Starting and stopping").

A file is told by its device and inode number, which stay its own only while it is held open:
once removed, the next file made may get the same number. So the maker holds the file (an
`O_PATH` descriptor, which a socket file takes too) until it removes it."""

from __future__ import annotations

import contextlib
import os

__all__ = ["hold", "remove_own", "same_file"]


def hold(path: str) -> int | None:
    """A descriptor holding the file at `path` (not following a link), for `remove_own`; None
    where the system has no `O_PATH` (not Linux: the file is then removed unchecked)."""
    o_path = getattr(os, "O_PATH", 0)
    if not o_path:
        return None
    return os.open(path, o_path | os.O_NOFOLLOW | os.O_CLOEXEC)


def remove_own(path: str, held: int | None) -> None:
    """Remove `path` if it still names the file `held` holds (else leave it), and let go of
    the file."""
    if held is None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    try:
        if same_file(held, path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    finally:
        os.close(held)


def same_file(descriptor: int, path: str) -> bool:
    """Whether `path` still names the file open as `descriptor`."""
    try:
        named = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    opened = os.fstat(descriptor)
    return (named.st_dev, named.st_ino) == (opened.st_dev, opened.st_ino)
