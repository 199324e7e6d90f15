"""Large tensors between a front end and the engine cross in shared memory, not on the socket.

Each side of an engine connection owns a `Lane` for what it sends: files in /dev/shm (slots),
created as needed and reused. A tensor of `OUT_OF_BAND` bytes or more is copied into a free
slot, and its frame carries the slot's name and the size instead of the bytes; the receiver's
`LaneReader` maps the slot (once, then keeps it mapped) and reads the tensor where it lies: a
read-only view of the slot, which stays the receiver's for as long as any view of it lives
(an answer being written to its client, a request queued or computing). When the last one
goes (from whatever thread let go of it), the receiver says so in a `Released` message, after
which the sender reuses the slot. So a large tensor costs one copy, the sender's, and no
socket traffic: on the socket it cost a copy into and out of the kernel, and a wake-up for
every socket buffer's worth (~200 KiB) of it.

A `Released` rides with the next message its side sends (a request's answer, the next request),
in the same write: sent alone it cost both processes a write, a read and a wake-up a large
tensor. It goes alone only once the slots it names hold `RELEASE_ALONE` bytes (a stream of
large parts with nothing sent back, requests queued behind a slow model), so that a sender is
never left with all of its lane waiting to be released.

What a lane holds is bounded (`LANE_LIMIT` per direction and connection) and its space is
reserved when a slot is made (`posix_fallocate`: a full /dev/shm, as Docker's 64 MiB default
fills, is an error then, not a SIGBUS later); a tensor that finds no slot crosses on the socket
as before, so a view kept long (requests queued behind a slow model) costs the sender room,
never progress, and a receiver holds at most `VIEW_LIMIT` in views. A free slot the sender
drops to make room for a bigger one is named in a `Dropped` message, and the receiver unmaps
it (an unlinked file's memory lives as long as a mapping). Slot files are named by host, owner
pid and a random token; they are unlinked by their owner when the connection ends, by the
engine when a front end's connection ends (it may have died), and by an engine at start for
owners on this host that are no longer running.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import mmap
import os
import pickle
import re
import secrets
import socket
import weakref
from dataclasses import dataclass

import numpy as np

from tritonactor.backends.python.ipc import SHM_DIR, map_new, remove_files
from tritonactor.core.tensors import HeldView

__all__ = [
    "LANE_LIMIT",
    "RELEASE_ALONE",
    "VIEW_LIMIT",
    "Lane",
    "LaneReader",
    "owner_prefix",
    "remove_owned",
    "sweep_lanes",
]

log = logging.getLogger(__name__)

PREFIX = "tritonactor-lane-"
# This host's name as slot names carry it (processes of other hosts, containers that share
# /dev/shm, are not swept by pid).
HOST = re.sub(r"[^A-Za-z0-9]", "", socket.gethostname())[:32] or "host"
# What one direction of one connection may hold in slots.
LANE_LIMIT = 32 << 20
_SMALLEST = 64 << 10
# After /dev/shm refused a slot, tensors go on the socket for this many before a new try.
_RETRY_AFTER = 1000
# Slots let go of with this many bytes in them are released at once, without waiting for a
# message to ride with: their capacity is at most twice that.
RELEASE_ALONE = LANE_LIMIT // 8
# What a receiver holds in views of the sender's slots at most: a tensor past it (requests
# queued behind a slow model) is copied out and its slot released at once, as before views, so
# that the sender keeps at least half of its lane whatever the other side keeps (one tensor is
# always viewed, however large).
VIEW_LIMIT = LANE_LIMIT // 8

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
        self.prefix = f"{owner_prefix(os.getpid())}{secrets.token_hex(4)}-{next(_lanes)}"
        self.limit = limit
        self._slots: dict[str, _Slot] = {}
        self._held = 0  # bytes of all slots
        self._count = itertools.count()
        # Slots dropped since the last `Dropped` message (the receiver unmaps them).
        self.dropped: list[str] = []
        self._skip = 0  # tensors left to send on the socket after /dev/shm refused a slot
        self._warned = False

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

    def pop_dropped(self) -> tuple[str, ...]:
        """The slots dropped since last asked (for a `Dropped` message)."""
        dropped, self.dropped = tuple(self.dropped), []
        return dropped

    def release(self, names: tuple[str, ...]) -> None:
        for name in names:
            slot = self._slots.get(name)
            if slot is not None:
                slot.busy = False

    def _make(self, size: int) -> _Slot | None:
        capacity = max(_SMALLEST, 1 << (size - 1).bit_length())
        if self._skip:
            self._skip -= 1
            return None
        if capacity > self.limit:
            return None
        if self._held + capacity > self.limit:
            # Room for it by dropping free slots too small for it, smallest first, when that
            # makes enough.
            small = sorted(
                (s for s in self._slots.values() if not s.busy and s.capacity < size),
                key=lambda slot: slot.capacity,
            )
            needed = self._held + capacity - self.limit
            if sum(slot.capacity for slot in small) < needed:
                return None
            for slot in small:
                if self._held + capacity <= self.limit:
                    break
                self._drop(slot)
                self.dropped.append(slot.name)
        name = f"{self.prefix}-{next(self._count)}"
        try:
            mapping = map_new(name, capacity, reserve=True)
        except OSError as error:
            self._fail(error)
            return None
        slot = self._slots[name] = _Slot(name, mapping, capacity)
        self._held += capacity
        return slot

    def _fail(self, error: OSError) -> None:
        self._skip = _RETRY_AFTER
        if not self._warned:
            self._warned = True
            log.warning(
                "large tensors between front end and engine go over their socket for now: "
                "no room in %s (%s)",
                SHM_DIR,
                error,
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
    """The receiving side: the other side's slots, mapped once each, and read in place."""

    def __init__(self) -> None:
        self._mapped: dict[str, mmap.mmap] = {}
        # Slots whose last view has gone, (name, size), appended from any thread (a view may
        # go on a backend's thread); the loop's thread moves them to `taken`.
        self.returned: collections.deque[tuple[str, int]] = collections.deque()
        self.taken: list[str] = []  # slots to name in the next `Released`
        self._taken_bytes = 0
        self._viewed = 0  # bytes of the slots viewed, not yet returned

    @property
    def due(self) -> bool:
        """Whether the slots to release hold enough to be released now, alone
        (`RELEASE_ALONE`), rather than with the next message."""
        if self.returned:  # (asked after every read: no call when nothing came back)
            self._collect()
        return self._taken_bytes >= RELEASE_ALONE

    def pop_taken(self) -> tuple[str, ...]:
        """The slots whose views have all gone since last asked (for a `Released` message)."""
        self._collect()
        taken, self.taken = tuple(self.taken), []
        self._taken_bytes = 0
        return taken

    def _collect(self) -> None:
        returned = self.returned
        while returned:
            name, size = returned.popleft()  # (finalizers only append)
            self.taken.append(name)
            self._taken_bytes += size
            self._viewed -= size

    def forget(self, names: tuple[str, ...]) -> None:
        """The sender dropped these slots: unmap them (their memory goes with the mapping)."""
        for name in names:
            mapping = self._mapped.pop(name, None)
            if mapping is not None:
                with contextlib.suppress(BufferError):
                    mapping.close()

    def take(self, name: str, size: int) -> memoryview:
        """A read-only view of the first `size` bytes of the slot `name`: the slot is released
        once every view of it has gone (see the module's doc); past `VIEW_LIMIT`, a copy (of a
        `bytes` object), the slot released with the next message."""
        if not name.startswith(PREFIX) or "/" in name:
            raise ValueError(f"not a lane slot: {name!r}")
        mapping = self._mapped.get(name)
        if mapping is None:
            fd = os.open(os.path.join(SHM_DIR, name), os.O_RDONLY)
            try:
                mapping = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)  # read-only views
            finally:
                os.close(fd)
            self._mapped[name] = mapping
        if size > len(mapping):
            raise ValueError(f"lane slot {name!r} holds {len(mapping)} bytes, not {size}")
        self._collect()
        if self._viewed and self._viewed + size > VIEW_LIMIT:
            self.taken.append(name)
            self._taken_bytes += size
            return memoryview(mapping[:size])
        # Over a PickleBuffer of the mapping: it holds the mapping's export for as long as the
        # array lives (a closed mapping under a view would crash the process), and numpy does
        # not see through it, so an array numpy makes of the held view has the held view as
        # its base (numpy skips an array's views down to the first base that is not one).
        held = HeldView((size,), np.uint8, buffer=pickle.PickleBuffer(mapping))
        weakref.finalize(held, self.returned.append, (name, size)).atexit = False
        self._viewed += size
        return memoryview(held)

    def close(self) -> None:
        """The connection is over: unmap the other side's slots and unlink them (their owner
        does too when it can; one that died cannot). A slot still viewed stays mapped until
        its last view goes."""
        for name, mapping in self._mapped.items():
            with contextlib.suppress(BufferError):
                mapping.close()
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(SHM_DIR, name))
        self._mapped.clear()


def owner_prefix(pid: int) -> str:
    """How the names of the slots process `pid` of this host makes begin."""
    return f"{PREFIX}{HOST}-{pid}-"


def remove_owned(pid: int) -> None:
    """Unlink every slot process `pid` made (its connection is over)."""
    remove_files(owner_prefix(pid).removesuffix("-"))


def sweep_lanes() -> None:
    """Unlink the slots of this host's processes that are no longer running (a server killed
    outright)."""
    mine = f"{PREFIX}{HOST}-"
    with contextlib.suppress(OSError):
        names = (name for name in os.listdir(SHM_DIR) if name.startswith(mine))
        pids = {name[len(mine) :].split("-", 1)[0] for name in names}
        for pid in pids:
            if pid.isdigit() and not _alive(int(pid)):
                remove_owned(int(pid))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
