"""Triton's `local` response cache: one store of `size` bytes for the whole server, entries by
key, the least recently used (stored or hit) evicted first when a new one needs room.

The accounting follows Triton's local cache (a Boost managed buffer of `size` bytes) closely
enough that what a given size holds can be worked out:

- the buffer keeps `SEGMENT_OVERHEAD` (128) bytes for itself, so a cache of `size` bytes has
  `size - 128` for entries, and `utilization` starts at 128 / size as Triton's does;
- an entry of `byte_size` bytes (`CachedResponse.byte_size`) takes `charge(byte_size)`: its size
  plus an 8-byte header, rounded up to 16 bytes, at least 48 (measured on Triton 2.51: entries
  of 160, 184 and 952 bytes took 176, 192 and 960);
- an entry larger than `size` is refused at once; one that fits in `size` but not in the room
  left once every other entry is gone evicts them all and is still refused (both as Triton);
- Triton's allocator may also fragment; this store never does, so it may keep an entry or two
  more than Triton would in the same size.

Every method may be called from any thread (one lock)."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from enum import Enum

from tritonactor.cache.entry import CachedResponse

SEGMENT_OVERHEAD = 128
MIN_BLOCK = 48
ALIGNMENT = 16
BLOCK_HEADER = 8
# The smallest size Triton 2.51's local cache starts with (191 fails, 192 starts).
MIN_SIZE = 192


def charge(byte_size: int) -> int:
    """The bytes an entry of `byte_size` takes out of the cache."""
    blocks = -(-(byte_size + BLOCK_HEADER) // ALIGNMENT)
    return max(MIN_BLOCK, blocks * ALIGNMENT)


class Inserted(Enum):
    """What `ResponseCache.insert` did."""

    STORED = "stored"
    # The key was there already (another request with the same key was answered first).
    EXISTS = "exists"
    # Too large for the cache (or not in host memory): not stored.
    REFUSED = "refused"


@dataclass(frozen=True, slots=True)
class CacheSample:
    """The cache's numbers at one moment, for the `nv_cache_*` metrics."""

    size: int
    used: int  # charged to entries, without the segment's own bytes
    entries: int
    hits: int
    misses: int
    evictions: int
    lookup_ns: int
    insertion_ns: int

    @property
    def lookups(self) -> int:
        return self.hits + self.misses

    @property
    def utilization(self) -> float:
        """Bytes in use over the size, 0.0 - 1.0, the segment's own bytes included."""
        return (SEGMENT_OVERHEAD + self.used) / self.size


@dataclass(slots=True)
class _Entry:
    owner: tuple[str, int]  # model, version
    response: CachedResponse
    charge: int


class ResponseCache:
    """The server's one response cache (see the module's docstring)."""

    def __init__(self, size: int) -> None:
        if size < MIN_SIZE:
            raise ValueError(f"a local response cache needs at least {MIN_SIZE} bytes, got {size}")
        self.size = size
        self._room = size - SEGMENT_OVERHEAD
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()  # least recently used first
        self._used = 0
        self._hits = self._misses = self._evictions = 0
        self._lookup_ns = self._insertion_ns = 0
        self._lock = threading.Lock()

    def lookup(self, key: bytes) -> CachedResponse | None:
        """The entry of `key` (now the most recently used), or None."""
        started = time.perf_counter_ns()
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self._misses += 1
            else:
                self._hits += 1
                self._entries.move_to_end(key)
            self._lookup_ns += time.perf_counter_ns() - started
        return entry.response if entry is not None else None

    def insert(self, key: bytes, owner: tuple[str, int], response: CachedResponse) -> Inserted:
        """Store `response` under `key` for `owner` (model, version), evicting the least
        recently used entries while it does not fit."""
        started = time.perf_counter_ns()
        with self._lock:
            try:
                return self._insert(key, owner, response)
            finally:
                self._insertion_ns += time.perf_counter_ns() - started

    def _insert(self, key: bytes, owner: tuple[str, int], response: CachedResponse) -> Inserted:
        if key in self._entries:
            return Inserted.EXISTS
        size = response.byte_size
        if size > self.size:
            return Inserted.REFUSED
        cost = charge(size)
        while self._entries and self._used + cost > self._room:
            _, evicted = self._entries.popitem(last=False)
            self._used -= evicted.charge
            self._evictions += 1
        if self._used + cost > self._room:
            return Inserted.REFUSED
        self._entries[key] = _Entry(owner, response, cost)
        self._used += cost
        return Inserted.STORED

    def drop(self, model: str, version: int) -> int:
        """Forget every entry of `version` of `model` (it left, or another copy serves it now);
        returns how many there were. Not evictions: the metrics do not count them."""
        owner = (model, version)
        with self._lock:
            keys = [key for key, entry in self._entries.items() if entry.owner == owner]
            for key in keys:
                self._used -= self._entries.pop(key).charge
        return len(keys)

    def __len__(self) -> int:
        return len(self._entries)

    def sample(self) -> CacheSample:
        with self._lock:
            return CacheSample(
                size=self.size,
                used=self._used,
                entries=len(self._entries),
                hits=self._hits,
                misses=self._misses,
                evictions=self._evictions,
                lookup_ns=self._lookup_ns,
                insertion_ns=self._insertion_ns,
            )
