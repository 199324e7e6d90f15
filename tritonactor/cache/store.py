"""Triton's `local` response cache: one store of `size` bytes for the whole server, entries by
key, the least recently used (stored or hit) evicted first when a new one needs room.

The size bounds the memory the cache takes in this process. An entry of `byte_size` bytes (its
blob, `entry.pack`: Triton's packed form, plus its parameters) is charged `cost(byte_size)`:

- what it takes in Triton's local cache (a Boost managed buffer of `size` bytes), `charge`: its
  size plus an 8-byte header, rounded up to 16 bytes, at least 48 (measured on Triton 2.51:
  entries of 160, 184 and 952 bytes took 176, 192 and 960);
- plus ENTRY_OVERHEAD, what the Python objects that hold it here take besides its bytes.

So small entries fill the cache sooner than in Triton (a deviation, docs/response-cache.md);
`nv_cache_util` reports the bytes charged. Further:

- the buffer keeps `SEGMENT_OVERHEAD` (128) bytes for itself, so a cache of `size` bytes has
  `size - 128` for entries, and `utilization` starts at 128 / size as Triton's does;
- an entry larger than `size` is refused at once (`refuses`: the router asks before copying a
  response); one that fits in `size` but not in the room left once every other entry is gone
  evicts them all and is still refused (both as Triton);
- Triton's allocator may also fragment; this store never does.

Every method may be called from any thread (one lock)."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from enum import Enum

SEGMENT_OVERHEAD = 128
MIN_BLOCK = 48
ALIGNMENT = 16
BLOCK_HEADER = 8
# The smallest size Triton 2.51's local cache starts with (191 fails, 192 starts).
MIN_SIZE = 192
# The memory an entry takes here besides its blob's bytes: the blob's `bytes` header (33), its
# 16-byte key (a 49-byte `bytes`), the ordered dict's slot and link for it, the (owner, blob)
# tuple, and its key's place in the by-version index. Measured with tracemalloc on CPython 3.11:
# 200,000 entries of one INT64 element (56-byte blobs) took 296 bytes each besides their blobs;
# rounded up for dict growth. tests/unit/test_response_cache.py::
# test_an_entry_takes_no_more_memory_than_it_is_charged checks the charge covers it.
ENTRY_OVERHEAD = 320


def charge(byte_size: int) -> int:
    """The bytes an entry of `byte_size` takes out of Triton's local cache."""
    blocks = -(-(byte_size + BLOCK_HEADER) // ALIGNMENT)
    return max(MIN_BLOCK, blocks * ALIGNMENT)


def cost(byte_size: int) -> int:
    """The bytes an entry of `byte_size` takes out of this cache: Triton's charge and the
    memory of its Python objects."""
    return charge(byte_size) + ENTRY_OVERHEAD


class Inserted(Enum):
    """What `ResponseCache.insert` did."""

    STORED = "stored"
    # The key was there already (another request with the same key was answered first).
    EXISTS = "exists"
    # Too large for the cache (or not in host memory): not stored.
    REFUSED = "refused"
    # The owner's entries were dropped since the answer's lookup (its model, or a step of its
    # ensemble, changed meanwhile): not stored, it may be the old copy's answer.
    STALE = "stale"


@dataclass(frozen=True, slots=True)
class CacheSample:
    """The cache's numbers at one moment, for the `nv_cache_*` metrics."""

    size: int
    used: int  # charged to entries, without the segment's own bytes
    entries: int
    lookups: int
    hits: int
    misses: int
    evictions: int
    lookup_ns: int
    insertion_ns: int

    @property
    def utilization(self) -> float:
        """Bytes in use over the size, 0.0 - 1.0, the segment's own bytes included."""
        return (SEGMENT_OVERHEAD + self.used) / self.size


Owner = tuple[str, int]  # model, version


class ResponseCache:
    """The server's one response cache (see the module's docstring)."""

    def __init__(self, size: int) -> None:
        if size < MIN_SIZE:
            raise ValueError(f"a local response cache needs at least {MIN_SIZE} bytes, got {size}")
        self.size = size
        self._room = size - SEGMENT_OVERHEAD
        # key -> (owner, blob), least recently used first.
        self._entries: OrderedDict[bytes, tuple[Owner, bytes]] = OrderedDict()
        self._by_owner: dict[Owner, dict[bytes, None]] = {}
        # How many times each owner's entries were dropped: an answer looked up before a drop
        # is not stored after it (`generation`, `insert`).
        self._generations: dict[Owner, int] = {}
        self._used = 0
        self._lookups = self._hits = self._misses = self._evictions = 0
        self._lookup_ns = self._insertion_ns = 0
        self._lock = threading.Lock()

    def refuses(self, byte_size: int) -> bool:
        """Whether an entry of `byte_size` bytes is refused whatever the cache holds."""
        return byte_size > self.size

    def lookup(self, key: bytes) -> bytes | None:
        """The blob of `key` (now the most recently used), or None."""
        started = time.perf_counter_ns()
        with self._lock:
            self._lookups += 1
            entry = self._entries.get(key)
            if entry is None:
                self._misses += 1
            else:
                self._hits += 1
                self._entries.move_to_end(key)
            self._lookup_ns += time.perf_counter_ns() - started
        return entry[1] if entry is not None else None

    def generation(self, owner: Owner) -> int:
        """How many times `owner`'s entries were dropped so far (see `insert`)."""
        return self._generations.get(owner, 0)

    def insert(
        self, key: bytes, owner: Owner, blob: bytes, generation: int | None = None
    ) -> Inserted:
        """Store `blob` under `key` for `owner` (model, version), evicting the least recently
        used entries while it does not fit; not when `owner`'s entries were dropped since
        `generation` (what `generation(owner)` said when the request was looked up)."""
        started = time.perf_counter_ns()
        with self._lock:
            try:
                if generation is not None and self.generation(owner) != generation:
                    return Inserted.STALE
                return self._insert(key, owner, blob)
            finally:
                self._insertion_ns += time.perf_counter_ns() - started

    def _insert(self, key: bytes, owner: Owner, blob: bytes) -> Inserted:
        if key in self._entries:
            return Inserted.EXISTS
        size = len(blob)
        if self.refuses(size):
            return Inserted.REFUSED
        taken = cost(size)
        while self._entries and self._used + taken > self._room:
            self._forget(*self._entries.popitem(last=False))
            self._evictions += 1
        if self._used + taken > self._room:
            return Inserted.REFUSED
        self._entries[key] = (owner, blob)
        self._by_owner.setdefault(owner, {})[key] = None
        self._used += taken
        return Inserted.STORED

    def _forget(self, key: bytes, entry: tuple[Owner, bytes]) -> None:
        """Take back what an entry no longer in `_entries` was charged, and unindex it."""
        owner, blob = entry
        self._used -= cost(len(blob))
        keys = self._by_owner[owner]
        del keys[key]
        if not keys:
            del self._by_owner[owner]

    def drop(self, model: str, version: int) -> int:
        """Forget every entry of `version` of `model` (it left, or another copy serves it now);
        returns how many there were. Not evictions: the metrics do not count them."""
        with self._lock:
            owner = (model, version)
            self._generations[owner] = self._generations.get(owner, 0) + 1
            keys = self._by_owner.pop(owner, {})
            for key in keys:
                _, blob = self._entries.pop(key)
                self._used -= cost(len(blob))
        return len(keys)

    def __len__(self) -> int:
        return len(self._entries)

    def sample(self) -> CacheSample:
        with self._lock:
            return CacheSample(
                size=self.size,
                used=self._used,
                entries=len(self._entries),
                lookups=self._lookups,
                hits=self._hits,
                misses=self._misses,
                evictions=self._evictions,
                lookup_ns=self._lookup_ns,
                insertion_ns=self._insertion_ns,
            )
