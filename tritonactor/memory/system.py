"""A system shared-memory region: part of a POSIX shared-memory object (`/dev/shm/<key>`, what
`shm_open(key)` opens, as tritonclient's `create_shared_memory_region` makes them), mapped
read-write into this process once, at registration.

Inputs are read-only views of the mapping (`read`): numpy arrays over them are the client's
memory, no copy. A view keeps the mapping alive: `close` unmaps only when no view is left, and
otherwise leaves the unmapping to the last view's release (Python's buffer protocol refuses to
close an mmap with exported buffers), so no array ever points at unmapped memory.
"""

from __future__ import annotations

import logging
import mmap
import os
import pickle
from typing import Any

import numpy as np

from tritonactor.core.errors import internal, invalid_arg
from tritonactor.memory.region import Kind, Region

log = logging.getLogger(__name__)

SHM_ROOT = "/dev/shm"


class SystemRegion(Region):
    kind = Kind.SYSTEM

    def __init__(
        self, name: str, key: str, offset: int, byte_size: int, mapping: mmap.mmap, fd: int
    ) -> None:
        super().__init__(name, byte_size)
        self.key = key
        self.offset = offset
        self._mapping = mapping
        # Kept open to see whether the client shrank the object (`check_whole`).
        self._fd: int | None = fd
        # The object itself, whatever key spelling or link reached it: two regions with the
        # same `identity` share memory where their ranges of the object meet.
        status = os.fstat(fd)
        self.identity = (status.st_dev, status.st_ino)
        # The mapping starts at the page below `offset`: the region starts `delta` bytes in.
        delta = offset % mmap.ALLOCATIONGRANULARITY
        self._view: memoryview | None = memoryview(mapping)[delta : delta + byte_size]
        # Where the region starts in this process's memory: what `SharedMemoryRegistry.locate`
        # compares a buffer's address with.
        self.address = address_of(self._view)

    @classmethod
    def open(cls, name: str, key: str, offset: int, byte_size: int) -> SystemRegion:
        """Map [offset, offset + byte_size) of the shared-memory object `key`, with Triton's
        errors: a key that does not open is INTERNAL, a region past the object's end
        INVALID_ARG."""
        fd = _open_key(key)
        try:
            return cls(name, key, offset, byte_size, cls._map(fd, name, offset, byte_size), fd)
        except BaseException:
            os.close(fd)
            raise

    @staticmethod
    def _map(fd: int, name: str, offset: int, byte_size: int) -> mmap.mmap:
        size = os.fstat(fd).st_size
        if offset + byte_size > size:
            raise invalid_arg(f"failed to register shared memory region '{name}': invalid args")
        if byte_size == 0:
            # What mmap answers for an empty mapping, in Triton's words.
            raise invalid_arg(
                f"failed to register shared memory region '{name}': unable to process "
                "address spaceInvalid argument"
            )
        # Unlike Triton (mmap at `offset` itself), any offset works: the mapping starts at
        # the page boundary below it.
        start = offset - offset % mmap.ALLOCATIONGRANULARITY
        try:
            return mmap.mmap(
                fd,
                offset - start + byte_size,
                flags=mmap.MAP_SHARED,
                prot=mmap.PROT_READ | mmap.PROT_WRITE,
                offset=start,
            )
        except OSError as error:
            raise invalid_arg(
                f"failed to register shared memory region '{name}': unable to process "
                f"address space{error.strerror}"
            ) from None

    def read(self, offset: int, byte_size: int) -> memoryview:
        return self._live_view()[offset : offset + byte_size].toreadonly()

    def writable(self, offset: int, byte_size: int) -> memoryview:
        """The bytes at [offset, offset + byte_size), to write into (no copy)."""
        return self._live_view()[offset : offset + byte_size]

    def write(self, offset: int, data: np.ndarray) -> None:
        target = np.frombuffer(self._live_view(), np.uint8, count=data.size, offset=offset)
        target[...] = data

    def check_whole(self) -> None:
        """A client may shrink its object after registering it (ftruncate): touching the
        mapping past the object's end would kill the server (SIGBUS), so a request is refused
        then. (A shrink while a request runs is not caught: Triton does not catch either.)"""
        fd = self._fd
        size = os.fstat(fd).st_size if fd is not None else 0
        if size < self.offset + self.byte_size:
            raise invalid_arg(
                f"shared memory region '{self.name}' is no longer whole: its object "
                f"'{self.key}' holds {size} bytes, not the {self.offset + self.byte_size} it "
                "was registered with"
            )

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
        view, self._view = self._view, None
        if view is None:
            return
        try:
            view.release()
            self._mapping.close()
        except BufferError:
            # Arrays over the region outlive it (a backend kept an input): the mapping goes
            # when the last of them does.
            log.info(
                "shared memory region '%s' unregistered while arrays still view it; it is "
                "unmapped when they are released",
                self.name,
            )

    def status(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "key": self.key,
            "offset": self.offset,
            "byte_size": self.byte_size,
        }

    def _live_view(self) -> memoryview:
        if self._view is None:
            raise internal(f"shared memory region '{self.name}' is unregistered")
        return self._view


def address_of(buffer: memoryview | pickle.PickleBuffer) -> int:
    """The address of `buffer`'s first byte in this process (the array made to read it is
    gone at return, so the buffer keeps no export)."""
    return int(np.frombuffer(buffer, np.uint8).__array_interface__["data"][0])


def _open_key(key: str) -> int:
    """The file descriptor of shared-memory object `key`, opened as glibc's shm_open does it:
    leading slashes dropped, no other slash, no symbolic link followed (so that a key never
    reaches outside /dev/shm). Triton passes the key on as a C string: it ends at a NUL."""
    name = key.split("\0", 1)[0].lstrip("/")
    if not name or "/" in name or name in (".", ".."):
        raise _unable_to_open(key)
    try:
        return os.open(os.path.join(SHM_ROOT, name), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        raise _unable_to_open(key) from None


def _unable_to_open(key: str) -> Exception:
    # Triton's messages are C strings: one naming a key with a NUL ends there (over gRPC;
    # over HTTP its JSON parser has already cut the key there, see http/shared_memory.py).
    message = f"Unable to open shared memory region: '{key}'"
    return internal(message.split("\0", 1)[0])
