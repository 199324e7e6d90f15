"""The shared-memory regions one inference request holds: the inputs it reads from them, the
outputs it is due to write into them. A held region cannot be unregistered; the front end
releases the lease once the response is written (or the request failed), as Triton lets go of
a region when the request's last buffer is released.

The front end makes a lease per request (`SharedMemoryRegistry`, `Lease(registry)`), hands its
`read` and `reserve` to the wire codec, attaches it to the request when it holds anything, and
calls `write_outputs` before encoding the response and `release` after.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from tritonactor.core import offload
from tritonactor.core.datatypes import to_numpy_dtype
from tritonactor.core.errors import internal
from tritonactor.core.tensors import tensor_to_bytes
from tritonactor.core.types import OUTPUT_BUFFERS, InferenceRequest, InferenceResponse, Tensor
from tritonactor.memory.region import UINT64, Region
from tritonactor.memory.registry import Place, SharedMemoryRegistry
from tritonactor.memory.system import SystemRegion

T = TypeVar("T")

# Outputs of at least this many bytes are copied into their regions on a worker thread, not on
# the event loop (tritonactor.core.offload: a copy of 1 GiB takes most of a second).
OFF_LOOP_BYTES = offload.OFF_LOOP_BYTES

# request.context key of the request's lease.
LEASE = "shared_memory.lease"

# What the wire codecs are given (a lease's `read` and `reserve`):
# (region name, offset, byte size) -> the bytes of a registered region;
Reader = Callable[[str, int, int], bytes | memoryview]
# (output name, region name, offset, byte size): the output is to be written there.
Reserver = Callable[[str, str, int, int], None]


@dataclass(frozen=True, slots=True)
class OutputTarget:
    """Where an output goes: `byte_size` bytes at `offset` of `region`."""

    region: Region
    offset: int
    byte_size: int

    def holds(self, tensor: Tensor) -> bool:
        """Whether `tensor`'s data already is this target's memory (written there by the
        engine, which maps the same region): nothing to copy."""
        region = self.region
        data = tensor.data
        return (
            isinstance(region, SystemRegion)
            and type(data) is np.ndarray
            and data.dtype.kind != "O"
            and data.dtype == to_numpy_dtype(tensor.datatype)
            and data.flags.c_contiguous
            and data.nbytes <= self.byte_size
            and data.__array_interface__["data"][0] == region.address + self.offset
        )


def check_output_size(output: str, byte_size: int, needed: int) -> None:
    """Triton's INTERNAL for an output of `needed` bytes whose shared-memory place was given
    `byte_size` (a negative gRPC size read as unsigned, as Triton reads it)."""
    byte_size %= UINT64
    if needed > byte_size:
        raise internal(
            f"shared memory size specified with the request for output '{output}' "
            f"({byte_size} bytes) should be at least {needed} bytes to hold the results"
        )


class Lease:
    __slots__ = ("_held", "_registry", "outputs")

    def __init__(self, registry: SharedMemoryRegistry) -> None:
        self._registry = registry
        self._held: list[Region] = []
        # Output name -> where the client asked it to be written.
        self.outputs: dict[str, OutputTarget] = {}

    def __bool__(self) -> bool:
        return bool(self._held)

    def buffers(self, request: InferenceRequest) -> dict[str, memoryview]:
        """`OUTPUT_BUFFERS` for `request` in this process (`SharedMemoryRegistry.offer`)."""
        return self._registry.offer(request.inputs, self.places())

    def read(self, name: str, offset: int, byte_size: int) -> memoryview:
        """The input bytes at [offset, offset + byte_size) of region `name`: for system shared
        memory a read-only view of the mapping (no copy), for CUDA a host copy."""
        region = self._hold(name, offset, byte_size)
        if offset % UINT64 + byte_size % UINT64 > region.byte_size:
            # A size past the region that Triton's unsigned bounds check let through: nothing
            # is read, and the codec holds the size given against the tensor's (Triton's
            # "input byte size mismatch").
            return memoryview(b"")
        return region.read(offset, byte_size)

    def reserve(self, output: str, name: str, offset: int, byte_size: int) -> None:
        """Output `output` is to be written at [offset, offset + byte_size) of region `name`."""
        region = self._hold(name, offset, byte_size)
        self.outputs[output] = OutputTarget(region, offset, byte_size)

    def _hold(self, name: str, offset: int, byte_size: int) -> Region:
        region = self._registry.acquire(name, offset, byte_size)
        self._held.append(region)
        return region

    def write(self, response: InferenceResponse) -> frozenset[str]:
        """Write the response's outputs that have a target into their regions; the names
        written. An output larger than its target fails the request (Triton's INTERNAL)."""
        if not self.outputs:
            return frozenset()
        written = []
        for tensor in response.outputs:
            target = self.outputs.get(tensor.name)
            if target is None:
                continue
            if target.holds(tensor):  # the engine wrote it there (engine/host.py)
                written.append(tensor.name)
                continue
            data = tensor_to_bytes(tensor.datatype, np.asarray(tensor.data))
            chunk = np.frombuffer(data, np.uint8) if isinstance(data, bytes) else data
            check_output_size(tensor.name, target.byte_size, chunk.size)
            room = target.region.byte_size - target.offset % UINT64
            if chunk.size > room:
                # A byte size past the region that the unsigned bounds check let through:
                # refused, where Triton writes past the region.
                raise internal(
                    f"shared memory region '{target.region.name}' holds {room} bytes from "
                    f"offset {target.offset % UINT64}, too few for output '{tensor.name}' "
                    f"({chunk.size} bytes)"
                )
            target.region.write(target.offset, chunk)
            written.append(tensor.name)
        return frozenset(written)

    def copy_size(self, response: InferenceResponse) -> int:
        """The bytes writing `response`'s outputs into their regions copies."""
        if not self.outputs:
            return 0
        outputs = self.outputs
        return sum(
            np.asarray(tensor.data).nbytes
            for tensor in response.outputs
            if tensor.name in outputs and not outputs[tensor.name].holds(tensor)
        )

    def places(self) -> tuple[tuple[str, Place], ...]:
        """The outputs due in system regions, as another process of the server that maps the
        same regions finds them: the engine writes them there itself."""
        return tuple(
            (
                name,
                (
                    target.region.name,
                    target.region.key,
                    target.region.offset,
                    target.offset,
                    target.byte_size,
                ),
            )
            for name, target in self.outputs.items()
            if isinstance(target.region, SystemRegion)
        )

    def large(self, response: InferenceResponse) -> bool:
        """Whether writing `response`'s outputs leaves the event loop (`offload.large`)."""
        return offload.large(self.copy_size(response))

    async def write_off_loop(self, response: InferenceResponse) -> frozenset[str]:
        """`write`, on a worker thread when the copy is large (`offload.off_loop`); the
        regions stay held."""
        if not self.outputs:  # most requests: nothing to write
            return frozenset()
        return await offload.off_loop(lambda: self.write(response), self.copy_size(response))

    def release(self) -> None:
        held, self._held = self._held, []
        for region in held:
            self._registry.release(region)

    def hand_over(self) -> Lease:
        """A lease that holds what this one held; this one is left holding nothing."""
        other = Lease(self._registry)
        other._held, self._held = self._held, []
        other.outputs, self.outputs = self.outputs, {}
        return other


async def answer_holding(lease: Lease, request: InferenceRequest, answer: Awaitable[T]) -> T:
    """Await `answer` (the server's answer to `request`, which reads and writes the regions
    `lease` holds). When the caller is cancelled (the client gave up), the request is
    cancelled, but it may still be running in a model: its regions stay held until it is
    over, as in Triton, not only until the caller's `lease.release()`. A lease holding no
    region (most requests) has nothing to keep: the answer is awaited as it is. The lease goes
    with the request (`attach`) before `answer` starts: a front end in front of the engine
    tells the engine where the outputs go (engine/remote.py)."""
    if not lease:
        return await answer
    attach(request, lease)
    running = asyncio.ensure_future(answer)
    try:
        return await asyncio.shield(running)
    except asyncio.CancelledError:
        if not running.done():
            request.cancel()
            running.add_done_callback(_release_when_over(lease.hand_over()))
        raise


def _release_when_over(lease: Lease) -> Callable[[asyncio.Future[object]], None]:
    def over(running: asyncio.Future[object]) -> None:
        lease.release()
        if not running.cancelled():
            running.exception()  # nobody waits for it any more: its error is retrieved here

    return over


def attach(request: InferenceRequest, lease: Lease) -> None:
    """Keep `lease` with `request` when it holds a region (else there is nothing to release),
    and tell a backend where the outputs due in system regions go (`OUTPUT_BUFFERS`)."""
    if lease:
        request.context[LEASE] = lease
        if lease.outputs:
            request.context[OUTPUT_BUFFERS] = lease.buffers


def write_outputs(request: InferenceRequest, response: InferenceResponse) -> frozenset[str]:
    """Write `response`'s shared-memory outputs as `request` asked; the names written."""
    lease = request.context.get(LEASE)
    if lease is None:
        return frozenset()
    return lease.write(response)


def release(request: InferenceRequest) -> None:
    """Let go of the regions `request` holds (idempotent)."""
    lease = request.context.pop(LEASE, None)
    if lease is not None:
        request.context.pop(OUTPUT_BUFFERS, None)
        lease.release()
