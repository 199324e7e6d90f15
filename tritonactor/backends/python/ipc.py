"""The wire between the server and a stub process.

Control messages are small dicts, pickled and length-prefixed on a socket. Tensor bytes
travel in /dev/shm: the sender writes a batch's tensors into one file there and sends
descriptors (name, datatype, shape, offset, size); the reader maps the file, unlinks it at once
(ownership has passed) and wraps numpy arrays around the mapping, so the mapping lives exactly as
long as the arrays do. Tensors of a few KiB at most a message (`INLINE_LIMIT`: an execute's
batch, its results, a response sender's response, a BLS call's request and answers) travel
inside their message, as one bytearray the reader's arrays are views of: writing and reading
shared memory costs more than the bytes themselves there.

This module is imported by the stub, which may run under another interpreter: it needs only the
standard library and numpy.
"""

from __future__ import annotations

import contextlib
import itertools
import mmap
import os
import pickle
import select
import socket
import struct
import tempfile
import threading
from typing import Any

import numpy as np

from tritonactor.core.datatypes import (
    deserialize_bytes,
    from_numpy_dtype,
    serialize_bytes,
    to_numpy_dtype,
)

__all__ = [
    "Arena",
    "ArenaReader",
    "Channel",
    "Counter",
    "TensorDescriptor",
    "read_tensors",
    "remove_file",
    "remove_files",
    "write_tensors",
]

SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
# An instance's shared-memory files are named `<instance prefix><side>-...`: what the server
# writes for its stub, and what the stub writes for the server.
SERVER_SIDE = "-p"
STUB_SIDE = "-s"

_HEADER = struct.Struct("<Q")
# What one read of a channel's socket takes at most.
_READ_SIZE = 256 << 10
_ALIGN = 64

# (name, wire datatype, shape, offset, size in bytes)
TensorDescriptor = tuple[str, str, tuple[int, ...], int, int]

# ---------------------------------------------------------------------------------------------
# Control messages


def _send_all(sock: socket.socket, data: bytes) -> None:
    """All of `data` on `sock`, waiting for room as a blocking socket would. The server's end
    of a stub's socket is polled by its event loop (`add_reader`), and uvloop's poll makes the
    descriptor non-blocking: a message larger than the socket's buffers (a long request id, a
    batch of many requests) is then written in parts as the stub reads, where `sendall` would
    raise after a part and leave the stub half a message."""
    try:
        sent = sock.send(data)
    except BlockingIOError:
        sent = 0
    if sent == len(data):  # (nearly always: a message is small)
        return
    view = memoryview(data)[sent:]
    while view:
        try:
            view = view[sock.send(view) :]
        except BlockingIOError:
            waiting = select.poll()  # (not select(): the descriptor may be past FD_SETSIZE)
            waiting.register(sock, select.POLLOUT)
            waiting.poll()


class Channel:
    """Length-prefixed pickles on a connected stream socket. `send` may be called from any
    thread; `recv` and `received` from one reader at a time (what one read brought beyond a
    message waits in the channel's buffer for the next)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buffer = bytearray()
        # What each read lands in: a `recv` of `_READ_SIZE` would allocate (and, that large,
        # map and unmap) a new buffer every time, three system calls and a page fault a message.
        self._scratch = memoryview(bytearray(_READ_SIZE))
        self._lock = threading.Lock()

    def send(self, message: dict[str, Any]) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        with self._lock:
            _send_all(self.sock, _HEADER.pack(len(data)) + data)

    def recv(self) -> dict[str, Any] | None:
        """The next message, waiting for it; None when the other side is gone."""
        while True:
            # (`_next` only when the buffer holds something: one call fewer a message.)
            if self._buffer and (message := self._next()) is not None:
                return message
            try:
                size = self.sock.recv_into(self._scratch)
            except OSError:
                return None
            if not size:
                return None
            self._buffer += self._scratch[:size]

    def received(self) -> list[dict[str, Any]] | None:
        """Without waiting: the messages that have arrived (reading what the socket holds); None
        when the other side is gone. For a reader the event loop wakes."""
        try:
            size: int | None = self.sock.recv_into(self._scratch, 0, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            size = None
        except OSError:
            size = 0
        if size:
            self._buffer += self._scratch[:size]
        messages = []
        while self._buffer and (message := self._next()) is not None:
            messages.append(message)
        if size == 0 and not messages:
            return None  # the end, once every whole message before it was taken
        return messages

    def _next(self) -> dict[str, Any] | None:
        """The first whole message in the buffer, taken out of it (None: none is whole yet)."""
        buffer = self._buffer
        if len(buffer) < _HEADER.size:
            return None
        end = _HEADER.size + _HEADER.unpack_from(buffer)[0]
        if len(buffer) < end:
            return None
        message = pickle.loads(buffer[_HEADER.size : end])
        del buffer[:end]
        return message

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


# ---------------------------------------------------------------------------------------------
# Tensors in shared memory

_counter = itertools.count()

# Batches up to this size go through an instance's reusable arena (and are copied out by the
# reader); bigger ones get a file of their own that the reader maps without copying.
ARENA_LIMIT = 1 << 20
# Tensors up to this size a message travel inside it where the writer allows it (every writer
# but a test's, which sets 0): a bytearray of their own, which the reader's arrays view.
INLINE_LIMIT = 4 << 10
# An arena's first size, and how much it grows by when a batch needs more (python backend
# settings `shm-default-byte-size` and `shm-growth-byte-size`; 0 for the growth step: to the
# next power of two).
ARENA_DEFAULT_SIZE = 64 << 10
ARENA_GROWTH = 0


class Arena:
    """A shared-memory file reused for one message at a time: creating, mapping and unlinking a
    file costs ~25 us on each side, more than a small request's whole payload. The writer may
    reuse it once the reader has answered the message it carried. It starts at `default_size`
    and grows by `growth` (to the next power of two when 0); batches bigger than `limit` go to
    files of their own."""

    def __init__(self, prefix: str, default_size: int = 0, growth: int = 0, limit: int = 0) -> None:
        self.prefix = prefix
        self.name = ""
        self.size = 0
        self.default_size = default_size or ARENA_DEFAULT_SIZE
        self.growth = growth or ARENA_GROWTH
        self.limit = max(limit or ARENA_LIMIT, self.default_size)
        self._mapping: mmap.mmap | None = None

    def _grown(self, size: int) -> int:
        if size <= self.default_size:
            return self.default_size
        if self.growth > 0:
            steps = -(-(size - self.default_size) // self.growth)
            return self.default_size + steps * self.growth
        return 1 << (size - 1).bit_length()

    def reserve(self, size: int) -> mmap.mmap:
        if self._mapping is None or size > self.size:
            self.close()
            self.size = self._grown(size)
            self.name = f"{self.prefix}-{next(_counter)}"
            self._mapping = map_new(self.name, self.size)
        return self._mapping

    def close(self) -> None:
        if self._mapping is not None:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(SHM_DIR, self.name))
            with contextlib.suppress(BufferError):
                self._mapping.close()
            self._mapping = None


class ArenaReader:
    """The reader's side of an `Arena`: keeps the latest file mapped (until `close`)."""

    def __init__(self) -> None:
        self._name = ""
        self._mapping: mmap.mmap | None = None

    def close(self) -> None:
        """Unmap the file (a later `open` maps it again)."""
        if self._mapping is not None:
            with contextlib.suppress(BufferError):
                self._mapping.close()
            self._mapping = None
            self._name = ""

    def open(self, name: str) -> mmap.mmap:
        if name != self._name or self._mapping is None:
            if self._mapping is not None:
                with contextlib.suppress(BufferError):
                    self._mapping.close()
            fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR)
            try:
                self._mapping = mmap.mmap(fd, os.fstat(fd).st_size)
            finally:
                os.close(fd)
            self._name = name
        return self._mapping


class Counter:
    """One unsigned 64-bit number in shared memory, which one side writes and the other reads:
    a store into a mapping, with no system call (the stub tells the server how far it got, to
    be read once it died). The server makes it (`Counter()`) in memory that has no name
    (memfd), so nothing is left behind whatever happens to either process, and hands its `fd`
    to the stub, which maps it (`Counter(fd)`)."""

    def __init__(self, fd: int | None = None) -> None:
        made = fd is None
        if fd is None:
            fd = os.memfd_create("tritonactor-taken", os.MFD_CLOEXEC)
            try:
                os.ftruncate(fd, _HEADER.size)
            except OSError:
                os.close(fd)
                raise
        try:
            self._mapping: mmap.mmap | None = mmap.mmap(fd, _HEADER.size)
        except OSError:
            os.close(fd)
            raise
        if not made:
            os.close(fd)  # mapped: the descriptor is no longer needed
        # The descriptor to hand to the other process, until `handed_over`.
        self.fd: int | None = fd if made else None
        self._view = memoryview(self._mapping).cast("Q")

    def handed_over(self) -> None:
        """The other process has its copy of `fd` (or will never get one): close ours."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    @property
    def value(self) -> int:
        try:
            return 0 if self._mapping is None else self._view[0]
        except ValueError:  # closed meanwhile by another thread (an unload during a death)
            return 0

    @value.setter
    def value(self, number: int) -> None:
        self._view[0] = number

    def close(self) -> None:
        """Unmap it (its value reads 0 from then on)."""
        self.handed_over()
        if self._mapping is not None:
            mapping, self._mapping = self._mapping, None
            self._view.release()
            mapping.close()


# Where a batch's tensor bytes are: a shared-memory file's name (an arena's starts with "@"),
# the bytes themselves (inline), or None when there are none.
Place = str | bytearray | None


def write_tensors(
    prefix: str,
    tensors: list[tuple[str, np.ndarray]],
    arena: Arena | None = None,
    inline: int = 0,
) -> tuple[Place, list[TensorDescriptor]]:
    """Write `tensors` into a bytearray when they take `inline` bytes or fewer, else into
    `arena` when they fit, else into a new shared-memory file named `<prefix>-<n>`; returns
    where (see `Place`) and one descriptor per tensor."""
    plans: list[tuple[np.ndarray | bytes, int, int]] = []
    descriptors: list[TensorDescriptor] = []
    total = 0
    for name, array in tensors:
        array = np.asarray(array)
        datatype = from_numpy_dtype(array.dtype)
        data: np.ndarray | bytes = serialize_bytes(array) if datatype == "BYTES" else array
        size = len(data) if isinstance(data, bytes) else array.nbytes
        plans.append((data, total, size))
        descriptors.append((name, datatype, tuple(array.shape), total, size))
        total += -(-size // _ALIGN) * _ALIGN
    if total == 0:
        return None, descriptors
    if total <= inline:
        buffer = bytearray(total)
        _fill(buffer, plans)
        return buffer, descriptors
    if arena is not None and total <= arena.limit:
        _fill(arena.reserve(total), plans)
        return "@" + arena.name, descriptors
    filename = f"{prefix}-{next(_counter)}"
    path = os.path.join(SHM_DIR, filename)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, total)
        mapping = mmap.mmap(fd, total)
    except BaseException:
        os.close(fd)
        os.unlink(path)
        raise
    os.close(fd)
    try:
        _fill(mapping, plans)
    finally:
        mapping.close()
    return filename, descriptors


def _fill(mapping: mmap.mmap | bytearray, plans: list[tuple[np.ndarray | bytes, int, int]]) -> None:
    for data, offset, size in plans:
        if size == 0:
            continue
        if isinstance(data, bytes):
            mapping[offset : offset + size] = data
        else:
            target = np.ndarray(data.shape, data.dtype, buffer=mapping, offset=offset)
            target[...] = data
            del target


def read_tensors(
    filename: Place, descriptors: list[TensorDescriptor], arenas: ArenaReader | None = None
) -> list[tuple[str, str, np.ndarray]]:
    """Read what `write_tensors` wrote: (name, datatype, array) for each descriptor. Data in an
    arena is copied out (the arena is reused); a file of its own is unlinked at once and the
    arrays are views of its mapping; bytes that came inline are viewed where they are."""
    mapping: mmap.mmap | bytearray | None = None
    copy = False
    if isinstance(filename, bytearray):
        mapping = filename
    elif filename is not None and filename.startswith("@"):
        if arenas is None:
            raise ValueError("tensors in an arena need an ArenaReader")
        mapping = arenas.open(filename[1:])
        copy = True
    elif filename is not None:
        path = os.path.join(SHM_DIR, filename)
        fd = os.open(path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            mapping = mmap.mmap(fd, size)
        finally:
            os.close(fd)
            os.unlink(path)
    out: list[tuple[str, str, np.ndarray]] = []
    for name, datatype, shape, offset, size in descriptors:
        count = 1
        for dim in shape:
            count *= dim
        if datatype == "BYTES":
            if count == 0 or mapping is None:
                array = np.empty(shape, dtype=np.object_)
            else:
                view = memoryview(mapping)[offset : offset + size]
                array = deserialize_bytes(view, count).reshape(shape)
                view.release()
        elif size == 0 or mapping is None:
            array = np.empty(shape, dtype=to_numpy_dtype(datatype))
        else:
            array = np.ndarray(shape, to_numpy_dtype(datatype), buffer=mapping, offset=offset)
            if copy:
                array = array.copy()
        out.append((name, datatype, array))
    return out


def remove_file(filename: Place) -> None:
    """Unlink one file `write_tensors` wrote (not an arena's) that will never be read."""
    if isinstance(filename, str) and not filename.startswith("@"):
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(SHM_DIR, filename))


def map_new(name: str, size: int, reserve: bool = False) -> mmap.mmap:
    """A new file `name` of `size` bytes in SHM_DIR (only this user may open it), mapped
    read-write. With `reserve` its space is allocated now (`posix_fallocate`, where there is
    one): a full folder is an OSError here rather than a SIGBUS at a later write. A file that
    could not be made whole is removed."""
    path = os.path.join(SHM_DIR, name)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        if reserve and hasattr(os, "posix_fallocate"):
            os.posix_fallocate(fd, 0, size)
        else:
            os.ftruncate(fd, size)
        return mmap.mmap(fd, size)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    finally:
        os.close(fd)


def remove_files(prefix: str) -> None:
    """Unlink what a dead peer left behind: files with `prefix` nobody will read."""
    with contextlib.suppress(OSError):
        for filename in os.listdir(SHM_DIR):
            if filename.startswith(prefix + "-"):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(SHM_DIR, filename))
