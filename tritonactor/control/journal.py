"""The durable control-plane journal: one JSON event per line, appended and fsync'd.

Every class in `events` that derives from `Event` is journaled by its dataclass fields, so a new
event needs no change here. A record's sequence number (`seq`) is its line number, from 1; see
docs/journal.md for the format and for what happens to torn and corrupt files: a torn last line
(bytes after the last newline) is dropped; a whole line that cannot be read, the last one
included, is skipped, replayed as `JournalLineSkipped` at its place, and copied to
`<journal>.rejected` for inspection.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tritonactor.control import events
from tritonactor.control.records import (
    EVENT_TYPES,
    SCHEMA_VERSION,
    JournalError,
    decode,
    encode,
    encode_line,
    read_line,
)

__all__ = [
    "EVENT_TYPES",
    "SCHEMA_VERSION",
    "Journal",
    "JournalEntry",
    "JournalError",
    "JournalLocationError",
    "check_location",
    "decode",
    "encode",
    "open_journal",
    "rejected_path",
]

log = logging.getLogger(__name__)

_NEWLINE = b"\n"
_READ_CHUNK = 1 << 16
# How many unreadable lines are logged one by one at a start (the rest are counted; every one
# is in the `.rejected` file).
_LOGGED_LINES = 20


class JournalLocationError(OSError):
    """The journal's path cannot be opened for writing at all (the message names the path)."""


# --- the file -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class JournalEntry:
    """An event with its sequence number: its line number in the journal, from 1."""

    seq: int
    event: events.Event

    def as_json(self) -> dict[str, Any]:
        """The shape the events API lists: seq, time, type, model and the other fields."""
        record = encode(self.event)
        fields = dict(record["fields"])
        return {
            "seq": self.seq,
            "time": fields.pop("time", None),
            "type": record["type"],
            "model": fields.pop("model", None),
            "fields": fields,
        }


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _make_parents(path: Path) -> None:
    missing = []
    directory = path.parent
    while not directory.exists():
        missing.append(directory)
        directory = directory.parent
    for directory in reversed(missing):
        # Per-user state: nobody else needs to list it.
        directory.mkdir(mode=0o700, exist_ok=True)
        _fsync_directory(directory.parent)


def _open_or_create(path: Path) -> int:
    """A read-write append descriptor; a file created here is 0o600 and its directory synced."""
    _make_parents(path)
    flags = os.O_RDWR | os.O_APPEND | os.O_CLOEXEC
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return os.open(path, flags)
    # The umask may have narrowed the mode, never widened it; make it exact.
    os.fchmod(fd, 0o600)
    _fsync_directory(path.parent)
    return fd


def _read_from(fd: int, offset: int) -> bytes:
    chunks = []
    while chunk := os.pread(fd, _READ_CHUNK, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def rejected_path(path: Path) -> Path:
    """Where the lines of the journal at `path` that cannot be read are copied."""
    return path.with_name(f"{path.name}.rejected")


def _write_rejected(path: Path, skipped: list[tuple[events.JournalLineSkipped, bytes]]) -> None:
    """Replace `<journal>.rejected` with the lines that cannot be read now (one JSON object
    each: line, reason, text), or remove it when there are none."""
    target = rejected_path(path)
    if not skipped:
        target.unlink(missing_ok=True)
        return
    lines = [
        json.dumps(
            {
                "line": event.line,
                "reason": event.reason,
                "text": raw.decode("utf-8", "backslashreplace"),
            }
        )
        for event, raw in skipped
    ]
    partial = target.with_name(f"{target.name}.partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        _write_all(fd, ("\n".join(lines) + "\n").encode("ascii"))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(partial, target)


class Journal:
    """An append-only event log shared by every server process that opens the same path.

    Writers take an exclusive `flock` around each append and readers a shared one, so lines never
    interleave and a reader never sees half a line. Each process keeps an index of line offsets
    that it extends from wherever it last read, so paging does not rescan the file.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._path = Path(path)
        # flock excludes other processes, not other threads sharing this descriptor.
        self._thread_lock = threading.Lock()
        self._line_ends: list[int] = []
        self._fd: int | None = None
        self._fd = self._open()

    @property
    def path(self) -> Path:
        return self._path

    @property
    def closed(self) -> bool:
        return self._fd is None

    def _open(self) -> int:
        try:
            return _open_or_create(self._path)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise JournalLocationError(
                f"cannot open the control-plane journal {self._path} for writing: {reason}"
            ) from exc

    def _descriptor(self) -> int:
        if self._fd is None:
            raise ValueError(f"the journal {self._path} is closed")
        return self._fd

    def _still_at_path(self, fd: int) -> bool:
        # Another process may have moved the file away and begun a new one.
        try:
            at_path = os.stat(self._path)
        except FileNotFoundError:
            return False
        held = os.fstat(fd)
        return (held.st_dev, held.st_ino) == (at_path.st_dev, at_path.st_ino)

    def _reopen(self) -> None:
        os.close(self._descriptor())
        self._fd = None
        self._fd = self._open()
        self._line_ends = []

    @contextmanager
    def _locked(self, operation: int) -> Iterator[int]:
        with self._thread_lock:
            while True:
                fd = self._descriptor()
                fcntl.flock(fd, operation)
                if self._still_at_path(fd):
                    break
                fcntl.flock(fd, fcntl.LOCK_UN)
                self._reopen()
            try:
                yield fd
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)

    def _index_to_end(self, fd: int) -> int:
        """Extend the line index to the file's end; returns the file's size.

        Bytes after the last newline are not indexed: a write that never finished.
        """
        size = os.fstat(fd).st_size
        indexed = self._line_ends[-1] if self._line_ends else 0
        if size < indexed:
            # Shrunk under us (edited by hand): the old offsets mean nothing now.
            self._line_ends, indexed = [], 0
        if size > indexed:
            tail = _read_from(fd, indexed)
            start = 0
            while (newline := tail.find(_NEWLINE, start)) != -1:
                start = newline + 1
                self._line_ends.append(indexed + start)
        return size

    def _line(self, fd: int, seq: int) -> bytes:
        """Line `seq`, without its newline (as `_read_all` splits them: a bad line's reason
        reads the same from both)."""
        start = self._line_ends[seq - 2] if seq > 1 else 0
        return os.pread(fd, self._line_ends[seq - 1] - start - 1, start)

    def append(self, event: events.Event) -> int:
        """Write `event` as one line and fsync it; returns its seq.

        Raises `JournalError` for an event that could not be read back, OSError when the write
        fails (the file is then left as it was).
        """
        line = encode_line(event)
        with self._locked(fcntl.LOCK_EX) as fd:
            size = self._index_to_end(fd)
            end = self._line_ends[-1] if self._line_ends else 0
            if size > end:
                # A writer died mid-line; that append never returned, so its event never counted.
                log.warning(
                    "control-plane journal %s: dropping %d bytes of an unfinished line",
                    self._path,
                    size - end,
                )
                os.ftruncate(fd, end)
            try:
                _write_all(fd, line)
                os.fsync(fd)
            except OSError:
                # A short write (disk full) would leave half a line; take it back if we can.
                try:
                    os.ftruncate(fd, end)
                except OSError:
                    log.exception(
                        "control-plane journal %s: cannot undo a failed write", self._path
                    )
                raise
            self._line_ends.append(end + len(line))
            return len(self._line_ends)

    def _read_all(
        self, fd: int
    ) -> tuple[list[events.Event], list[tuple[events.JournalLineSkipped, bytes]], int | None]:
        """Every event, a line that cannot be read as its `JournalLineSkipped`; those lines with
        their bytes; the offset where a torn last line begins, or None."""
        data = _read_from(fd, 0)
        lines = data.split(_NEWLINE)
        # After the last newline: empty when the file ends cleanly, else an unfinished write.
        unfinished = lines.pop()
        # A whole line (newline included) was written whole: one that cannot be read is skipped
        # like any other, even the last; only bytes after the last newline are torn.
        torn_at = len(data) - len(unfinished) if unfinished else None
        found: list[events.Event] = []
        skipped: list[tuple[events.JournalLineSkipped, bytes]] = []
        for number, line in enumerate(lines, start=1):
            event = read_line(number, line)
            if isinstance(event, events.JournalLineSkipped):
                skipped.append((event, line))
            found.append(event)
        return found, skipped, torn_at

    def read(self) -> list[events.Event]:
        """Every event in the file, oldest first; a torn last line is skipped with a warning,
        and a whole line that cannot be read reads as `JournalLineSkipped`."""
        with self._locked(fcntl.LOCK_SH) as fd:
            found, _, torn_at = self._read_all(fd)
        if torn_at is not None:
            log.warning("control-plane journal %s: skipping a torn last line", self._path)
        return found

    def page(self, after: int = 0, limit: int = 100) -> list[JournalEntry]:
        """Up to `limit` entries with seq greater than `after`, oldest first.

        Start with `after=0` and pass the last seq returned to get the next page; an empty list
        means there is nothing newer yet.
        """
        if after < 0:
            raise ValueError(f"'after' is a seq, 0 or more: {after}")
        if limit < 1:
            raise ValueError(f"'limit' is at least 1: {limit}")
        with self._locked(fcntl.LOCK_SH) as fd:
            self._index_to_end(fd)
            last = min(after + limit, len(self._line_ends))
            lines = [(seq, self._line(fd, seq)) for seq in range(after + 1, last + 1)]
        # A line that cannot be read is listed as what it replays as (`JournalLineSkipped`).
        return [JournalEntry(seq, read_line(seq, line)) for seq, line in lines]

    @property
    def last_seq(self) -> int:
        """The seq of the newest complete record (0 when empty), whoever appended it."""
        with self._locked(fcntl.LOCK_SH) as fd:
            self._index_to_end(fd)
            return len(self._line_ends)

    def _recover(self) -> list[events.Event]:
        """Replay the file for `open_journal`: drop a torn tail, skip (and keep aside) the lines
        that cannot be read."""
        with self._locked(fcntl.LOCK_EX) as fd:
            found, skipped, torn_at = self._read_all(fd)
            if torn_at is not None:
                log.warning(
                    "control-plane journal %s: dropping a torn last line (%d bytes) left by an "
                    "interrupted write",
                    self._path,
                    os.fstat(fd).st_size - torn_at,
                )
                os.ftruncate(fd, torn_at)
                os.fsync(fd)
            self._line_ends = []
            self._index_to_end(fd)
            self._report(skipped)
            return found

    def _report(self, skipped: list[tuple[events.JournalLineSkipped, bytes]]) -> None:
        """Log each line that cannot be read and copy it to `<journal>.rejected`."""
        kept = rejected_path(self._path)
        try:
            _write_rejected(self._path, skipped)
        except OSError as exc:
            log.error("control-plane journal %s: cannot write %s: %s", self._path, kept, exc)
        for event, _ in skipped[:_LOGGED_LINES]:
            about = (
                f" (about model(s) {', '.join(map(repr, event.models))})" if event.models else ""
            )
            log.warning(
                "control-plane journal %s: line %d cannot be read: %s%s; it is skipped, the "
                "events before and after it still count, and it is kept in %s",
                self._path,
                event.line,
                event.reason,
                about,
                kept,
            )
        if len(skipped) > _LOGGED_LINES:
            log.warning(
                "control-plane journal %s: %d more lines cannot be read (all are in %s)",
                self._path,
                len(skipped) - _LOGGED_LINES,
                kept,
            )

    def close(self) -> None:
        with self._thread_lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def check_location(path: str | os.PathLike[str]) -> None:
    """Raise `JournalLocationError` (naming the journal and why) when the journal at `path`
    cannot be opened for writing; it is created if it does not exist, as the server would."""
    Journal(path).close()


def open_journal(path: str | os.PathLike[str]) -> tuple[Journal, list[events.Event]]:
    """The journal at `path`, ready for appends, and the events it replays.

    A torn last line (no newline) is dropped (a warning); a whole line that cannot be read is
    skipped (a warning naming it), replayed as `JournalLineSkipped`, and copied to
    `<name>.rejected`.
    Raises `JournalLocationError` only when the path cannot be written at all.
    """
    journal = Journal(path)
    try:
        return journal, journal._recover()
    except BaseException:
        journal.close()
        raise
