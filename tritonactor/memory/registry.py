"""The server's registered shared-memory regions, system and CUDA, by name: Triton's
shared-memory extension (register, status, unregister) with its messages and codes.

One name space for both kinds, as in Triton: a system region and a CUDA region cannot share a
name. A region that an in-flight request holds (see `lease.Lease`) cannot be unregistered.
Every method is safe to call from any thread.
"""

from __future__ import annotations

import logging
import mmap
import threading
from collections.abc import Callable, Iterable
from typing import Literal

import numpy as np

try:
    from numpy.lib.array_utils import byte_bounds
except ImportError:  # numpy < 2
    from numpy import byte_bounds  # type: ignore[attr-defined,no-redef]

from tritonactor.core.errors import (
    ErrorCode,
    TritonError,
    internal,
    invalid_arg,
    not_found,
    unavailable,
)
from tritonactor.core.tensors import owner_of
from tritonactor.core.types import Tensor
from tritonactor.memory.cuda import CudaRegion, CudaRuntime, CudaUnavailable, load_runtime
from tritonactor.memory.region import UINT64, Kind, Region
from tritonactor.memory.system import SystemRegion, address_of

log = logging.getLogger(__name__)

_KIND_WORDS = {Kind.SYSTEM: "system", Kind.CUDA: "cuda"}
_KIND_TITLES = {Kind.SYSTEM: "system shared memory", Kind.CUDA: "CUDA shared memory"}


class SharedMemoryRegistry:
    """Names -> registered regions. `cuda_runtime` loads the CUDA runtime on the first CUDA
    registration (a fake one in the unit tests); without a GPU it raises `CudaUnavailable`."""

    def __init__(self, cuda_runtime: Callable[[], CudaRuntime] = load_runtime) -> None:
        self._regions: dict[str, Region] = {}
        self._lock = threading.Lock()
        self._load_cuda = cuda_runtime
        self._cuda: CudaRuntime | CudaUnavailable | None = None
        # Held while the CUDA runtime loads (seconds: call `register_cuda` off the event
        # loop), apart from `_lock` so that requests and the other calls go on meanwhile.
        self._cuda_lock = threading.Lock()
        # The system regions by where they lie in this process's memory (start, end,
        # region): replaced whole under `_lock`, read without it (`locate`).
        self._spans: tuple[tuple[int, int, SystemRegion], ...] = ()

    # --- register ------------------------------------------------------------------------------

    def register_system(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """Map [offset, offset + byte_size) of the shared-memory object `key` as `name`."""
        with self._lock:
            self._check_free(name)
            region = SystemRegion.open(name, key, offset, byte_size)
            self._regions[name] = region
            self._spans += ((region.address, region.address + byte_size, region),)
        log.info("registered system shared memory region '%s' (key '%s')", name, key)

    def register_cuda(self, name: str, handle: bytes, device_id: int, byte_size: int) -> None:
        """Open the CUDA IPC `handle` of `byte_size` bytes on `device_id` as `name`."""
        with self._lock:  # (a name taken is ALREADY_EXISTS, a GPU or none, as in Triton)
            self._check_free(name)
        runtime = self._cuda_runtime(name)
        with self._lock:
            self._check_free(name)
            self._regions[name] = CudaRegion.open(runtime, name, handle, device_id, byte_size)
        log.info("registered CUDA shared memory region '%s' (device %d)", name, device_id)

    def _check_free(self, name: str) -> None:
        if name in self._regions:
            raise TritonError(
                ErrorCode.ALREADY_EXISTS, f"shared memory region '{name}' already in manager"
            )

    def _cuda_runtime(self, name: str) -> CudaRuntime:
        with self._cuda_lock:
            if self._cuda is None:
                try:
                    self._cuda = self._load_cuda()
                except CudaUnavailable as error:
                    log.warning("CUDA shared memory is unavailable: %s", error)
                    self._cuda = error
            runtime = self._cuda
        if isinstance(runtime, CudaUnavailable):
            raise invalid_arg(
                f"failed to register CUDA shared memory region: '{name}', GPUs not supported "
                f"({runtime})"
            )
        return runtime

    # --- status --------------------------------------------------------------------------------

    def status(self, kind: Kind, name: str = "") -> list[Region]:
        """Every region of `kind` (name ""), or the one called `name`."""
        with self._lock:
            if not name:
                # In name order, as Triton lists them.
                return [
                    self._regions[n] for n in sorted(self._regions) if self._regions[n].kind is kind
                ]
            region = self._regions.get(name)
        if region is None:
            raise not_found(f"Unable to find {_KIND_WORDS[kind]} shared memory region: '{name}'")
        if region.kind is not kind:
            raise not_found(
                f"The region named '{name}' is registered as {_KIND_TITLES[region.kind]}, not "
                f"{_KIND_TITLES[kind]}"
            )
        return [region]

    # --- unregister ----------------------------------------------------------------------------

    def unregister(self, kind: Kind, name: str = "", busy: frozenset[str] = frozenset()) -> None:
        """Unregister the region `name` of `kind` (nothing when there is none, as in Triton),
        or every region of `kind` (name ""): those in use stay, and the error names them.
        `busy`: regions in use elsewhere (by the requests of other processes)."""
        if name:
            with self._lock:
                region = self._take(kind, name, busy)
            if region is not None:
                region.close()
            return
        closed: list[Region] = []
        held: list[str] = []
        with self._lock:
            for region_name in sorted(n for n, r in self._regions.items() if r.kind is kind):
                try:
                    region = self._take(kind, region_name, busy)
                except TritonError as error:
                    log.info("%s", error.message)
                    held.append(region_name)
                else:
                    assert region is not None
                    closed.append(region)
        for region in closed:
            region.close()
        if held:
            listed = "".join(f"{region_name} ," for region_name in held)
            message = f"Failed to unregister the following {_KIND_WORDS[kind]} shared memory "
            raise internal(f"{message}regions: {listed}")

    def _take(self, kind: Kind, name: str, busy: frozenset[str]) -> Region | None:
        """Remove `name` from the registry, under the lock; None when it is not a `kind`."""
        region = self._regions.get(name)
        if region is None or region.kind is not kind:
            return None
        if region.users > 0 or name in busy:
            raise internal(
                f"Cannot unregister shared memory region '{name}', it is currently in use."
            )
        del self._regions[name]
        self._spans = tuple(span for span in self._spans if span[2] is not region)
        log.info("unregistered %s region '%s'", _KIND_TITLES[kind], name)
        return region

    def retire(self, kind: Kind, name: str) -> None:
        """Take the region `name` of `kind` out of the registry even while requests hold it:
        its name is free at once, and it is closed when the last of them lets go. What a
        front end does when the engine unregistered a region (the engine asked every front
        end first; one that took a lease since is not refused the engine's decision)."""
        with self._lock:
            region = self._regions.get(name)
            if region is None or region.kind is not kind:
                return
            del self._regions[name]
            self._spans = tuple(span for span in self._spans if span[2] is not region)
            region.retired = True
            close = region.users == 0
        if close:
            region.close()

    def in_use(self, kind: Kind) -> frozenset[str]:
        """The regions of `kind` that requests hold now."""
        with self._lock:
            return frozenset(
                name for name, r in self._regions.items() if r.kind is kind and r.users > 0
            )

    def close(self) -> None:
        """Unregister every region, in use or not: the server is stopping."""
        with self._lock:
            regions = list(self._regions.values())
            self._regions.clear()
            self._spans = ()
        for region in regions:
            region.close()

    # --- requests ------------------------------------------------------------------------------

    def acquire(self, name: str, offset: int, byte_size: int) -> Region:
        """The region `name`, after checking that [offset, offset + byte_size) lies in it, held
        for a request (`release` lets go): Triton's errors for an unknown region (NOT_FOUND)
        and a place out of bounds (INVALID_ARG)."""
        with self._lock:
            region = self._regions.get(name)
            if region is None:
                raise not_found(f"Unable to find shared memory region: '{name}'")
            region.check_bounds(offset, byte_size)
            region.check_whole()
            region.users += 1
            return region

    def release(self, region: Region) -> None:
        with self._lock:
            region.users -= 1
            close = region.retired and region.users == 0
        if close:
            region.close()

    # --- between the processes of one server ---------------------------------------------------

    def locate(self, buffer: memoryview) -> Place | None:
        """Where `buffer` lies when it is the memory of a registered system region (an input
        read from it, an output written into it), else None: another process of the server
        that maps the same region then reads it there (`view`) instead of a copy."""
        spans = self._spans
        if not spans:
            return None
        start = address_of(buffer)
        end = start + buffer.nbytes
        for first, last, region in spans:
            if first <= start and end <= last:
                return (region.name, region.key, region.offset, start - first, buffer.nbytes)
        return None

    def view(self, place: Place) -> memoryview:
        """A read-only view of `place` (what `locate` said in another process of the server) in
        this process's mapping of the same region. UNAVAILABLE when this process has no such
        region (it was unregistered, or registered anew, while the tensor crossed)."""
        return self._placed(place).read(place[3], place[4])

    def write_at(self, place: Place, data: np.ndarray) -> memoryview:
        """Copy `data` (contiguous uint8, at most `place`'s size) to `place` in this process's
        mapping of its region; a read-only view of what was written. UNAVAILABLE as `view`."""
        region = self._placed(place)
        region.write(place[3], data)
        return region.read(place[3], data.size)

    def offer(
        self, inputs: Iterable[Tensor], targets: Iterable[tuple[str, Place]]
    ) -> dict[str, memoryview]:
        """The places outputs are due in (`targets`), as the bytes a backend may write each
        into itself, less those that overlap an input's memory or another output's place (so
        that a run never overwrites what it reads, whatever the registrations of one object
        and their addresses: compared where they lie in the object), and those whose region
        this process no longer has or the client has shrunk (`_placed`)."""
        read: list[_Extent] = []
        for tensor in inputs:
            extent = self._extent_of(tensor.data)
            if extent is False:
                return {}  # an input in shared memory this process no longer knows: no telling
            if extent is not None:
                read.append(extent)
        due: list[tuple[str, Place, SystemRegion, _Extent]] = []
        for name, place in targets:
            try:
                region = self._placed(place)
            except TritonError:
                continue
            due.append((name, place, region, (region.identity, region.offset + place[3], place[4])))
        buffers: dict[str, memoryview] = {}
        for name, place, region, extent in due:
            if any(_overlap(extent, other) for other in read) or any(
                _overlap(extent, other) for _, _, _, other in due if other is not extent
            ):
                continue
            try:
                buffers[name] = region.writable(place[3], place[4])
            except TritonError:  # unregistered since
                continue
        return buffers

    def _extent_of(self, data: object) -> _Extent | Literal[False] | None:
        """Where an input's array lies in a registered system region's object; None when it
        lies in no shared memory, False when it lies in a mapping no region here holds (one
        unregistered while its request ran)."""
        if not isinstance(data, np.ndarray) or data.dtype.kind == "O":
            return None
        low, high = byte_bounds(data)
        for first, last, region in self._spans:
            if first <= low and high <= last:
                return (region.identity, region.offset + low - first, high - low)
        return False if _over_mapping(data) else None

    def lies_at(self, data: np.ndarray, place: Place) -> bool:
        """Whether `data` is already the memory at `place` (written there in place)."""
        if not data.flags.c_contiguous or data.nbytes > place[4]:
            return False
        located = self.locate(memoryview(data))
        return located is not None and located[:4] == place[:4]

    def _placed(self, place: Place) -> SystemRegion:
        name, key, region_offset, offset, byte_size = place
        with self._lock:
            region = self._regions.get(name)
        if (
            not isinstance(region, SystemRegion)
            or region.key != key
            or region.offset != region_offset
            or offset + byte_size % UINT64 > region.byte_size  # (a negative gRPC size: huge)
        ):
            raise unavailable(
                f"shared memory region '{name}' was unregistered while a request using it "
                "was in flight"
            )
        # The client may have shrunk its object since the front end took its lease: touching
        # the mapping past the object's end would kill this process (SIGBUS).
        region.check_whole()
        return region


# Where a buffer lies in a registered system region, as another process of the server can find
# it: (region name, the region's key and offset as registered, offset in the region, bytes).
Place = tuple[str, str, int, int, int]


# Bytes of a shared-memory object: (its identity, where they start in it, how many).
_Extent = tuple[tuple[int, int], int, int]


def _overlap(a: _Extent, b: _Extent) -> bool:
    """Whether two extents share bytes of one object (two registrations of an object, by any
    spelling of its key, are two regions mapped at two addresses)."""
    return a[0] == b[0] and a[1] < b[1] + b[2] and b[1] < a[1] + a[2]


def _over_mapping(data: np.ndarray) -> bool:
    """Whether `data`'s memory belongs to a memory-mapped file (through the views it is of; a
    lane slot's `HeldView` is not a client's region)."""
    return isinstance(owner_of(data), mmap.mmap)
