"""Large tensors between a front end and the engine cross in shared memory, not on the socket.

Each side of an engine connection owns a `Lane` for what it sends: files in /dev/shm (slots),
created as needed and reused. A tensor of `OUT_OF_BAND` bytes or more is copied into a free
slot, and its frame carries the slot's name and the size instead of the bytes; the receiver's
`LaneReader` maps the slot (once, then keeps it mapped), copies the tensor out and says so in a
`Released` message, after which the sender reuses the slot. So a large tensor costs one copy on
each side and no socket traffic: on the socket it cost a copy into and out of the kernel, and a
wake-up for every socket buffer's worth (~200 KiB) of it.

What a lane holds is bounded (`LANE_LIMIT` per direction and connection) and its space is
reserved when a slot is made (`posix_fallocate`: a full /dev/shm, as Docker's 64 MiB default
fills, is an error then, not a SIGBUS later); a tensor that finds no slot crosses on the socket
as before. Slot files are unlinked by their owner when the connection ends, by the other side
if the owner died first, and by the engine at start for owners that are no longer running.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import mmap
import os
from dataclasses import dataclass

import numpy as np

from tritonactor.backends.python.ipc import SHM_DIR

__all__ = ["LANE_LIMIT", "Lane", "LaneReader", "sweep_lanes"]

log = logging.getLogger(__name__)

PREFIX = "tritonactor-lane-"
# What one direction of one connection may hold in slots.
LANE_LIMIT = 128 << 20
_SMALLEST = 64 << 10

_lanes = itertools.count()


@dataclass(eq=False, slots=True)
class _Slot:
    name: str
    mapping: mmap.mmap
    capacity: int
    busy: bool = False


class Lane:
    """The sending side: slots this process made, for one connection. Loop thread only."""

    def __init__(self, limit: int = LANE_LIMIT) -> None:
        self.prefix = f"{PREFIX}{os.getpid()}-{next(_lanes)}"
        self.limit = limit
        self._slots: dict[str, _Slot] = {}
        self._held = 0  # bytes of all slots
        self._count = itertools.count()
        self._failed = False  # /dev/shm refused a slot once: the socket from then on

    def put(self, data: memoryview) -> str | None:
        """The name of a slot now holding `data` (until `release`), or None: it goes on the
        socket."""
        size = data.nbytes
        free = [s for s in self._slots.values() if not s.busy and s.capacity >= size]
        best = min(free, key=lambda slot: slot.capacity) if free else None
        if best is None:
            best = self._make(size)
            if best is None:
                return None
        best.mapping[:size] = data.cast("B") if data.format != "B" else data
        best.busy = True
        return best.name

    def release(self, names: tuple[str, ...]) -> None:
        for name in names:
            slot = self._slots.get(name)
            if slot is not None:
                slot.busy = False

    def _make(self, size: int) -> _Slot | None:
        capacity = max(_SMALLEST, 1 << (size - 1).bit_length())
        if self._failed:
            return None
        if self._held + capacity > self.limit:
            # Room for it by dropping free slots that are too small.
            for slot in [s for s in self._slots.values() if not s.busy and s.capacity < size]:
                self._drop(slot)
            if self._held + capacity > self.limit:
                return None
        name = f"{self.prefix}-{next(self._count)}"
        path = os.path.join(SHM_DIR, name)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as error:
            self._fail(error)
            return None
        try:
            if hasattr(os, "posix_fallocate"):
                os.posix_fallocate(fd, 0, capacity)
            else:  # no way to reserve the space here (macOS): made to its size
                os.ftruncate(fd, capacity)
            mapping = mmap.mmap(fd, capacity)
        except OSError as error:
            with contextlib.suppress(OSError):
                os.unlink(path)
            self._fail(error)
            return None
        finally:
            os.close(fd)
        slot = self._slots[name] = _Slot(name, mapping, capacity)
        self._held += capacity
        return slot

    def _fail(self, error: OSError) -> None:
        self._failed = True
        log.warning(
            "large tensors go to the engine over its socket: no room in %s (%s)", SHM_DIR, error
        )

    def _drop(self, slot: _Slot) -> None:
        del self._slots[slot.name]
        self._held -= slot.capacity
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(SHM_DIR, slot.name))
        with contextlib.suppress(BufferError):
            slot.mapping.close()

    def close(self) -> None:
        for slot in list(self._slots.values()):
            self._drop(slot)


class LaneReader:
    """The receiving side: the other side's slots, mapped once each."""

    def __init__(self) -> None:
        self._mapped: dict[str, mmap.mmap] = {}
        self.taken: list[str] = []  # slots copied out since the last `Released`

    def take(self, name: str, size: int) -> memoryview:
        """A read-only copy of the first `size` bytes of the slot `name`."""
        if not name.startswith(PREFIX) or "/" in name:
            raise ValueError(f"not a lane slot: {name!r}")
        mapping = self._mapped.get(name)
        if mapping is None:
            fd = os.open(os.path.join(SHM_DIR, name), os.O_RDONLY)
            try:
                mapping = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
            finally:
                os.close(fd)
            self._mapped[name] = mapping
        if size > len(mapping):
            raise ValueError(f"lane slot {name!r} holds {len(mapping)} bytes, not {size}")
        copy = np.empty(size, np.uint8)  # not zeroed first, as a bytearray would be
        copy[:] = np.frombuffer(mapping, np.uint8, size)
        self.taken.append(name)
        view = memoryview(copy)
        return view.toreadonly()

    def close(self) -> None:
        """The connection is over: unmap the other side's slots and unlink them (their owner
        does too when it can; one that died cannot)."""
        for name, mapping in self._mapped.items():
            with contextlib.suppress(BufferError):
                mapping.close()
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(SHM_DIR, name))
        self._mapped.clear()


def sweep_lanes() -> None:
    """Unlink the slots of processes that are no longer running (a server killed outright)."""
    with contextlib.suppress(OSError):
        for filename in os.listdir(SHM_DIR):
            if not filename.startswith(PREFIX):
                continue
            pid = filename[len(PREFIX) :].split("-", 1)[0]
            if pid.isdigit() and not _alive(int(pid)):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(SHM_DIR, filename))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
