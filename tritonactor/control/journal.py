"""The durable control-plane journal: one JSON event per line, appended and fsync'd.

Every class in `events` that derives from `Event` is journaled by its dataclass fields, so a new
event needs no change here. A record's sequence number (`seq`) is its line number, from 1; see
docs/journal.md for the format and for what happens to torn and corrupt files.
"""

from __future__ import annotations

import dataclasses
import enum
import fcntl
import json
import logging
import os
import threading
import types
import typing
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tritonactor.control import events

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1

_NEWLINE = b"\n"
_READ_CHUNK = 1 << 16


class JournalError(ValueError):
    """A record that cannot be encoded or decoded: unknown type or version, a missing field, a
    value of the wrong kind."""


class JournalLocationError(OSError):
    """The journal's path cannot be opened for writing at all (the message names the path)."""


# --- records ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class _FieldSpec:
    name: str
    hint: Any
    required: bool


def _field_specs(cls: type[events.Event]) -> tuple[_FieldSpec, ...]:
    hints = typing.get_type_hints(cls)
    specs = []
    for field in dataclasses.fields(cls):
        hint = hints[field.name]
        _check_supported(hint, f"{cls.__name__}.{field.name}")
        has_default = (
            field.default is not dataclasses.MISSING
            or field.default_factory is not dataclasses.MISSING
        )
        specs.append(_FieldSpec(field.name, hint, required=not has_default))
    return tuple(specs)


def _find_event_types() -> dict[str, tuple[type[events.Event], tuple[_FieldSpec, ...]]]:
    found = {}
    for value in vars(events).values():
        # The base class is the shape every event shares, not a fact anyone records.
        if (
            isinstance(value, type)
            and issubclass(value, events.Event)
            and value is not events.Event
            and value.__module__ == events.__name__
        ):
            found[value.__name__] = (value, _field_specs(value))
    return found


_SCALARS = (str, int, float, bool, type(None))


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def _check_supported(hint: Any, where: str) -> None:
    # Refusing at import beats writing records that cannot be read back.
    if hint in _SCALARS or (isinstance(hint, type) and issubclass(hint, enum.Enum)):
        return
    if _is_union(hint) or typing.get_origin(hint) is tuple:
        for arg in typing.get_args(hint):
            if arg is not Ellipsis:
                _check_supported(arg, where)
        return
    raise TypeError(f"the journal cannot store {where} of type {hint!r}")


_FOUND = _find_event_types()
# Every event class of `events`, by the name its records carry.
EVENT_TYPES: Mapping[str, type[events.Event]] = types.MappingProxyType(
    {name: cls for name, (cls, _) in _FOUND.items()}
)
_SPECS: Mapping[type[events.Event], tuple[_FieldSpec, ...]] = dict(_FOUND.values())


def _kind_error(where: str, hint: Any, value: Any) -> JournalError:
    name = hint.__name__ if isinstance(hint, type) else repr(hint)
    return JournalError(f"{where}: expected {name}, got {value!r}")


def _convert(hint: Any, value: Any, where: str, *, to_json: bool) -> Any:
    """`value` as JSON (to_json) or back from JSON, checked against the field's type hint.

    The same walk serves both directions, so whatever is written can be read back.
    """
    if _is_union(hint):
        if value is None and type(None) in typing.get_args(hint):
            return None
        for arg in typing.get_args(hint):
            if arg is type(None):
                continue
            try:
                return _convert(arg, value, where, to_json=to_json)
            except JournalError:
                continue
        raise _kind_error(where, hint, value)
    if typing.get_origin(hint) is tuple:
        if not isinstance(value, list | tuple):
            raise _kind_error(where, hint, value)
        args = typing.get_args(hint)
        kinds = [args[0]] * len(value) if len(args) == 2 and args[1] is Ellipsis else list(args)
        if len(kinds) != len(value):
            raise _kind_error(where, hint, value)
        items = [
            _convert(kind, item, f"{where}[{index}]", to_json=to_json)
            for index, (kind, item) in enumerate(zip(kinds, value, strict=True))
        ]
        return items if to_json else tuple(items)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        try:
            member = hint(value)
        except (ValueError, TypeError):
            raise _kind_error(where, hint, value) from None
        return member.value if to_json else member
    if hint is float:
        # JSON has one number type: a float field may arrive as an integer.
        if type(value) in (int, float):
            return float(value)
        raise _kind_error(where, hint, value)
    if hint is str and isinstance(value, str):
        # A StrEnum member in a plain str field is written, and read back, as its text.
        return str.__str__(value)
    # Exact types: a bool is not an int here, nor a numpy integer.
    if type(value) is hint:
        return value
    raise _kind_error(where, hint, value)


def encode(event: events.Event) -> dict[str, Any]:
    """The JSON record for `event`: `{"v": 1, "type": <class name>, "fields": {...}}`."""
    cls = type(event)
    specs = _SPECS.get(cls)
    if specs is None or EVENT_TYPES.get(cls.__name__) is not cls:
        raise JournalError(f"{cls.__qualname__} is not an event of tritonactor.control.events")
    values = {
        spec.name: _convert(
            spec.hint, getattr(event, spec.name), f"{cls.__name__}.{spec.name}", to_json=True
        )
        for spec in specs
    }
    return {"v": SCHEMA_VERSION, "type": cls.__name__, "fields": values}


def decode(record: Any) -> events.Event:
    """The event a record holds; fields it does not know are ignored, defaulted ones may be absent.

    Raises `JournalError` for anything else: not an object, an unknown schema version or type,
    a missing required field, a value of the wrong kind.
    """
    if not isinstance(record, dict):
        raise JournalError(f"a record is a JSON object, not {type(record).__name__}")
    version = record.get("v")
    # `True == 1` in Python; a schema version is an integer, nothing else.
    if type(version) is not int or version != SCHEMA_VERSION:
        raise JournalError(
            f"unknown schema version {version!r} (this server reads {SCHEMA_VERSION})"
        )
    name = record.get("type")
    cls = EVENT_TYPES.get(name) if isinstance(name, str) else None
    if cls is None:
        raise JournalError(f"unknown event type {name!r}")
    values = record.get("fields")
    if not isinstance(values, dict):
        raise JournalError(f"{name}: 'fields' is a JSON object, not {values!r}")
    arguments = {}
    for spec in _SPECS[cls]:
        if spec.name not in values:
            if spec.required:
                raise JournalError(f"{name}: missing field {spec.name!r}")
            continue
        arguments[spec.name] = _convert(
            spec.hint, values[spec.name], f"{name}.{spec.name}", to_json=False
        )
    return cls(**arguments)


def _encode_line(event: events.Event) -> bytes:
    # ASCII escapes keep any string (a lone surrogate from an undecodable path included)
    # representable; allow_nan=False keeps every line standard JSON.
    record = encode(event)
    try:
        text = json.dumps(record, separators=(",", ":"), allow_nan=False)
    except ValueError as exc:
        raise JournalError(f"{type(event).__name__}: {exc}") from None
    return text.encode("ascii") + _NEWLINE


def _parse_line(line: bytes) -> Any:
    """The JSON value of a line; ValueError (JSON or UTF-8) when it is not JSON."""
    return json.loads(line)


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


class _Corrupt(Exception):
    def __init__(self, line: int, reason: str) -> None:
        super().__init__(f"line {line}: {reason}")
        self.line = line
        self.reason = reason


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


def _aside_name(path: Path) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    candidate = path.with_name(f"{path.name}.corrupt-{stamp}")
    counter = 1
    while candidate.exists():
        candidate = path.with_name(f"{path.name}.corrupt-{stamp}-{counter}")
        counter += 1
    return candidate


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
        # Another process may have set the file aside (corrupt) and begun a new one.
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
                if fd != self._fd:
                    # Replaced while held (`_set_aside`): this one is done with.
                    os.close(fd)

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
        start = self._line_ends[seq - 2] if seq > 1 else 0
        return os.pread(fd, self._line_ends[seq - 1] - start, start)

    def append(self, event: events.Event) -> int:
        """Write `event` as one line and fsync it; returns its seq.

        Raises `JournalError` for an event that could not be read back, OSError when the write
        fails (the file is then left as it was).
        """
        line = _encode_line(event)
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

    def _read_all(self, fd: int) -> tuple[list[events.Event], int | None]:
        """Every event; the offset where a torn last line begins, or None.

        Raises `_Corrupt` for a line before the last that is not JSON, or any bad record.
        """
        data = _read_from(fd, 0)
        lines = data.split(_NEWLINE)
        # After the last newline: empty when the file ends cleanly, else an unfinished write.
        unfinished = lines.pop()
        torn_at = len(data) - len(unfinished) if unfinished else None
        parsed: list[tuple[int, Any]] = []
        offset = 0
        for number, line in enumerate(lines, start=1):
            try:
                parsed.append((number, _parse_line(line)))
            except ValueError as exc:
                if number == len(lines) and torn_at is None:
                    torn_at = offset
                    break
                raise _Corrupt(number, f"not JSON ({exc})") from None
            offset += len(line) + 1
        found = []
        for number, record in parsed:
            try:
                found.append(decode(record))
            except JournalError as exc:
                raise _Corrupt(number, str(exc)) from None
        return found, torn_at

    def read(self) -> list[events.Event]:
        """Every event in the file, oldest first; a torn last line is skipped with a warning.

        Raises `JournalError` (naming the line) when a record before the last one is bad.
        """
        with self._locked(fcntl.LOCK_SH) as fd:
            try:
                found, torn_at = self._read_all(fd)
            except _Corrupt as exc:
                raise JournalError(f"{self._path}: {exc}") from None
        if torn_at is not None:
            log.warning("control-plane journal %s: skipping a torn last line", self._path)
        return found

    def page(self, after: int = 0, limit: int = 100) -> list[JournalEntry]:
        """Up to `limit` entries with seq greater than `after`, oldest first.

        Start with `after=0` and pass the last seq returned to get the next page; an empty list
        means there is nothing newer yet. Raises `JournalError` for a bad record in the page.
        """
        if after < 0:
            raise ValueError(f"'after' is a seq, 0 or more: {after}")
        if limit < 1:
            raise ValueError(f"'limit' is at least 1: {limit}")
        with self._locked(fcntl.LOCK_SH) as fd:
            self._index_to_end(fd)
            last = min(after + limit, len(self._line_ends))
            lines = [(seq, self._line(fd, seq)) for seq in range(after + 1, last + 1)]
        entries = []
        for seq, line in lines:
            try:
                entries.append(JournalEntry(seq, decode(_parse_line(line))))
            except ValueError as exc:
                raise JournalError(f"{self._path}: line {seq}: {exc}") from None
        return entries

    @property
    def last_seq(self) -> int:
        """The seq of the newest complete record (0 when empty), whoever appended it."""
        with self._locked(fcntl.LOCK_SH) as fd:
            self._index_to_end(fd)
            return len(self._line_ends)

    def _recover(self) -> list[events.Event]:
        """Replay the file for `open_journal`: drop a torn tail, set a corrupt file aside."""
        with self._locked(fcntl.LOCK_EX) as fd:
            try:
                found, torn_at = self._read_all(fd)
            except _Corrupt as exc:
                self._set_aside(fd, exc)
                return []
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
            return found

    def _set_aside(self, fd: int, corruption: _Corrupt) -> None:
        # Called holding the lock on the old file: other processes waiting for it find the
        # path now names a new file, and reopen it (see `_locked`).
        aside = _aside_name(self._path)
        try:
            os.rename(self._path, aside)
            new_fd = _open_or_create(self._path)
        except OSError as exc:
            raise JournalLocationError(
                f"the control-plane journal {self._path} is corrupt ({corruption}) and cannot be "
                f"set aside: {exc.strerror or exc}"
            ) from exc
        log.error(
            "control-plane journal %s is corrupt at %s; moved it to %s and began a new, empty "
            "journal (the models' history before this start is not replayed)",
            self._path,
            corruption,
            aside,
        )
        self._fd = new_fd
        self._line_ends = []

    def close(self) -> None:
        with self._thread_lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def open_journal(path: str | os.PathLike[str]) -> tuple[Journal, list[events.Event]]:
    """The journal at `path`, ready for appends, and the events it replays.

    A torn last line is dropped (a warning); a corrupt file is moved to
    `<name>.corrupt-<UTC timestamp>` and a new one begun (an error naming where it went). Raises
    `JournalLocationError` only when the path cannot be written at all.
    """
    journal = Journal(path)
    try:
        return journal, journal._recover()
    except BaseException:
        journal.close()
        raise
