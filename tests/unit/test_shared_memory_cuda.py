"""CUDA shared memory through the registry, on a fake CUDA runtime: device memory is host
memory here, IPC handles are keys of the fake's allocations."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

from tritonactor.core.errors import ErrorCode, TritonError
from tritonactor.memory import cuda
from tritonactor.memory.cuda import CudaError, CudaUnavailable
from tritonactor.memory.lease import Lease
from tritonactor.memory.region import Kind
from tritonactor.memory.registry import SharedMemoryRegistry

BASE = 0x7F0000000000


def fail(call: Any, *args: Any) -> TritonError:
    with pytest.raises(TritonError) as caught:
        call(*args)
    return caught.value


class FakeRuntime:
    """Allocations by IPC handle; a pointer is BASE + the allocation's index * 2**20."""

    def __init__(self) -> None:
        self.allocations: dict[bytes, bytearray] = {}
        self.opened: dict[int, tuple[bytes, int]] = {}
        self.closed: list[int] = []

    def allocate(self, size: int) -> bytes:
        handle = len(self.allocations).to_bytes(64, "little")
        self.allocations[handle] = bytearray(size)
        return handle

    def _memory(self, pointer: int) -> tuple[bytearray, int]:
        base = pointer - (pointer - BASE) % 2**20
        handle, _ = self.opened[base]
        return self.allocations[handle], pointer - base

    def open(self, handle: bytes, device_id: int) -> int:
        if handle not in self.allocations:
            raise CudaError("cudaIpcOpenMemHandle: invalid argument")
        pointer = BASE + list(self.allocations).index(handle) * 2**20
        self.opened[pointer] = (handle, device_id)
        return pointer

    def allocation_size(self, pointer: int) -> int:
        memory, offset = self._memory(pointer)
        return len(memory) - offset

    def close(self, pointer: int) -> None:
        del self.opened[pointer]
        self.closed.append(pointer)

    def to_host(self, pointer: int, byte_size: int) -> np.ndarray:
        memory, offset = self._memory(pointer)
        return np.frombuffer(bytes(memory[offset : offset + byte_size]), np.uint8).copy()

    def from_host(self, pointer: int, data: np.ndarray) -> None:
        memory, offset = self._memory(pointer)
        memory[offset : offset + data.size] = data.tobytes()


@pytest.fixture
def runtime() -> FakeRuntime:
    return FakeRuntime()


@pytest.fixture
def registry(runtime: FakeRuntime) -> SharedMemoryRegistry:
    return SharedMemoryRegistry(cuda_runtime=lambda: runtime)


def test_register_read_write_unregister(
    runtime: FakeRuntime, registry: SharedMemoryRegistry
) -> None:
    handle = runtime.allocate(64)
    runtime.allocations[handle][:16] = np.arange(4, dtype=np.float32).tobytes()
    registry.register_cuda("c", handle, 1, 64)

    (region,) = registry.status(Kind.CUDA)
    assert region.status() == {"name": "c", "device_id": 1, "byte_size": 64}
    assert registry.status(Kind.SYSTEM) == []

    lease = Lease(registry)
    data = np.frombuffer(lease.read("c", 0, 16), np.float32)
    assert data.tolist() == [0, 1, 2, 3]
    lease.reserve("OUT", "c", 32, 16)
    region.write(32, np.arange(4, 8, dtype=np.float32).view(np.uint8))
    assert np.frombuffer(bytes(runtime.allocations[handle][32:48]), np.float32).tolist() == [
        4,
        5,
        6,
        7,
    ]
    error = fail(registry.unregister, Kind.CUDA, "c")
    assert error.message == "Cannot unregister shared memory region 'c', it is currently in use."
    lease.release()

    registry.unregister(Kind.CUDA, "c")
    assert runtime.closed == [BASE]
    assert registry.status(Kind.CUDA) == []


def test_a_size_past_the_region_reads_nothing_for_the_codec_to_refuse(
    runtime: FakeRuntime, registry: SharedMemoryRegistry
) -> None:
    """A byte size Triton's unsigned bounds check lets through (2^64 - 1, -1) is not copied
    to the host (a CUDA read would allocate that much): nothing is read, and the codec holds
    the size given against the tensor's. A system region's read is the same (the lease's)."""
    handle = runtime.allocate(64)
    registry.register_cuda("c", handle, 0, 64)
    lease = Lease(registry)
    for size in (2**64 - 1, -1):
        assert len(lease.read("c", 56, size)) == 0
    assert len(lease.read("c", 56, 8)) == 8
    lease.release()


def test_an_allocation_smaller_than_registered_is_refused_and_closed(
    runtime: FakeRuntime, registry: SharedMemoryRegistry
) -> None:
    handle = runtime.allocate(32)
    error = fail(registry.register_cuda, "c", handle, 0, 64)
    assert (error.code, error.message) == (
        ErrorCode.INVALID_ARG,
        "failed to register shared memory region 'c': invalid args",
    )
    assert runtime.closed == [BASE]
    assert registry.status(Kind.CUDA) == []


@pytest.mark.parametrize("handle", [b"\x07" * 64, b"short"])
def test_a_handle_that_does_not_open_is_refused(
    registry: SharedMemoryRegistry, handle: bytes
) -> None:
    error = fail(registry.register_cuda, "c", handle, 0, 64)
    assert error.code is ErrorCode.INVALID_ARG
    assert error.message.startswith("failed to register shared memory region: invalid args (")
    assert registry.status(Kind.CUDA) == []


def test_a_cuda_region_is_found_by_name_for_requests_and_status_kinds_differ(
    runtime: FakeRuntime, registry: SharedMemoryRegistry
) -> None:
    registry.register_cuda("c", runtime.allocate(64), 0, 64)
    error = fail(registry.status, Kind.SYSTEM, "c")
    assert error.message == (
        "The region named 'c' is registered as CUDA shared memory, not system shared memory"
    )
    error = fail(Lease(registry).read, "c", 60, 8)
    assert error.message == "Invalid offset + byte size for shared memory region: 'c'"
    registry.close()
    assert runtime.closed == [BASE]


def test_without_a_device_there_is_no_runtime_to_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda, "gpu_count", lambda: 0)
    with pytest.raises(CudaUnavailable, match="no CUDA device is visible to this server"):
        cuda.load_runtime()


def test_the_registry_serves_requests_while_the_cuda_runtime_loads() -> None:
    # Loading the runtime takes seconds (torch, CUDA's init): it must not hold the registry.
    loading, loaded = threading.Event(), threading.Event()
    runtime = FakeRuntime()
    handle = runtime.allocate(64)

    def load() -> FakeRuntime:
        loading.set()
        loaded.wait()
        return runtime

    registry = SharedMemoryRegistry(cuda_runtime=load)
    registering = threading.Thread(target=registry.register_cuda, args=("c", handle, 0, 64))
    registering.start()
    assert loading.wait(60)
    answered = threading.Event()
    status = threading.Thread(target=lambda: (registry.status(Kind.SYSTEM), answered.set()))
    status.start()
    try:
        assert answered.wait(60), "the registry was held while the CUDA runtime loaded"
    finally:
        loaded.set()
        registering.join()
        status.join()
    assert [region.name for region in registry.status(Kind.CUDA)] == ["c"]
    registry.close()
