"""The shared-memory registry, its regions and a request's lease, on real POSIX shared memory
(made with tritonclient's utilities, as a client makes it)."""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.utils.shared_memory as client_shm

from tritonactor.core.errors import ErrorCode, TritonError
from tritonactor.core.types import InferenceRequest, InferenceResponse, Tensor
from tritonactor.memory import lease as leases
from tritonactor.memory.cuda import CudaUnavailable
from tritonactor.memory.lease import Lease
from tritonactor.memory.region import Kind
from tritonactor.memory.registry import SharedMemoryRegistry
from tritonactor.memory.system import SystemRegion


def no_cuda() -> Any:
    raise CudaUnavailable("no CUDA device is visible to this server")


@pytest.fixture
def registry() -> Iterator[SharedMemoryRegistry]:
    registry = SharedMemoryRegistry(cuda_runtime=no_cuda)
    yield registry
    registry.close()


@pytest.fixture
def shm_object() -> Iterator[tuple[str, Any]]:
    """A 8 KiB shared-memory object: (key, tritonclient handle)."""
    key = f"/tritonactor_test_{uuid.uuid4().hex[:12]}"
    handle = client_shm.create_shared_memory_region("test", key, 8192)
    yield key, handle
    client_shm.destroy_shared_memory_region(handle)


def fail(call: Any, *args: Any) -> TritonError:
    with pytest.raises(TritonError) as caught:
        call(*args)
    return caught.value


# --- register / status / unregister --------------------------------------------------------------


def test_register_then_status_lists_regions_in_name_order(
    registry: SharedMemoryRegistry, shm_object: tuple[str, Any]
) -> None:
    key, _ = shm_object
    registry.register_system("b", key, 0, 64)
    registry.register_system("a", key, 4096, 16)

    statuses = [region.status() for region in registry.status(Kind.SYSTEM)]
    assert statuses == [
        {"name": "a", "key": key, "offset": 4096, "byte_size": 16},
        {"name": "b", "key": key, "offset": 0, "byte_size": 64},
    ]
    assert [r.status() for r in registry.status(Kind.SYSTEM, "b")] == [statuses[1]]
    assert registry.status(Kind.CUDA) == []


@pytest.mark.parametrize(
    ("key", "offset", "size", "code", "message"),
    [
        ("/tritonactor_no_such_object", 0, 64, ErrorCode.INTERNAL,
         "Unable to open shared memory region: '/tritonactor_no_such_object'"),
        ("/a/b", 0, 64, ErrorCode.INTERNAL, "Unable to open shared memory region: '/a/b'"),
        ("", 0, 64, ErrorCode.INTERNAL, "Unable to open shared memory region: ''"),
        # Triton's message is a C string: it ends at the NUL.
        ("/x\0y", 0, 64, ErrorCode.INTERNAL, "Unable to open shared memory region: '/x"),
        (None, 0, 8193, ErrorCode.INVALID_ARG,
         "failed to register shared memory region 'r': invalid args"),
        (None, 1, 8192, ErrorCode.INVALID_ARG,
         "failed to register shared memory region 'r': invalid args"),
        (None, 8193, 0, ErrorCode.INVALID_ARG,
         "failed to register shared memory region 'r': invalid args"),
        (None, 0, 0, ErrorCode.INVALID_ARG,
         "failed to register shared memory region 'r': unable to process address "
         "spaceInvalid argument"),
    ],
)  # fmt: skip
def test_register_refuses_with_tritons_errors_and_changes_nothing(
    registry: SharedMemoryRegistry,
    shm_object: tuple[str, Any],
    key: str | None,
    offset: int,
    size: int,
    code: ErrorCode,
    message: str,
) -> None:
    error = fail(registry.register_system, "r", shm_object[0] if key is None else key, offset, size)
    assert (error.code, error.message) == (code, message)
    assert registry.status(Kind.SYSTEM) == []


def test_a_name_is_registered_once_whatever_the_kind(
    registry: SharedMemoryRegistry, shm_object: tuple[str, Any]
) -> None:
    key, _ = shm_object
    registry.register_system("r", key, 0, 64)
    error = fail(registry.register_system, "r", key, 64, 64)
    assert error.code is ErrorCode.ALREADY_EXISTS
    assert error.message == "shared memory region 'r' already in manager"
    assert [r.status()["offset"] for r in registry.status(Kind.SYSTEM)] == [0]


def test_status_of_an_unknown_or_other_kind_region_is_not_found(
    registry: SharedMemoryRegistry, shm_object: tuple[str, Any]
) -> None:
    registry.register_system("r", shm_object[0], 0, 64)
    for kind, name, message in (
        (Kind.SYSTEM, "x", "Unable to find system shared memory region: 'x'"),
        (Kind.CUDA, "x", "Unable to find cuda shared memory region: 'x'"),
        (
            Kind.CUDA,
            "r",
            "The region named 'r' is registered as system shared memory, not CUDA shared memory",
        ),
    ):
        error = fail(registry.status, kind, name)
        assert (error.code, error.message) == (ErrorCode.NOT_FOUND, message)


def test_unregister_of_an_unknown_region_or_of_another_kind_does_nothing(
    registry: SharedMemoryRegistry, shm_object: tuple[str, Any]
) -> None:
    registry.register_system("r", shm_object[0], 0, 64)
    registry.unregister(Kind.SYSTEM, "x")
    registry.unregister(Kind.CUDA, "r")
    registry.unregister(Kind.CUDA)
    assert [r.name for r in registry.status(Kind.SYSTEM)] == ["r"]
    registry.unregister(Kind.SYSTEM, "r")
    assert registry.status(Kind.SYSTEM) == []


def test_cuda_without_a_gpu_is_a_clear_invalid_arg(registry: SharedMemoryRegistry) -> None:
    error = fail(registry.register_cuda, "c", b"\0" * 64, 0, 64)
    assert error.code is ErrorCode.INVALID_ARG
    assert error.message == (
        "failed to register CUDA shared memory region: 'c', GPUs not supported (no CUDA device "
        "is visible to this server)"
    )
    assert registry.status(Kind.CUDA) == []


# --- a request's lease ---------------------------------------------------------------------------


def test_an_input_is_a_view_of_the_clients_memory_not_a_copy(
    registry: SharedMemoryRegistry, shm_object: tuple[str, Any]
) -> None:
    key, handle = shm_object
    # An offset that is no page boundary: the mapping starts at the page below it.
    registry.register_system("r", key, 4100, 64)
    client_shm.set_shared_memory_region(handle, [np.arange(4, dtype=np.int32)], offset=4108)
    lease = Lease(registry)

    data = np.frombuffer(lease.read("r", 8, 16), dtype=np.int32)
    assert data.tolist() == [0, 1, 2, 3]
    assert not data.flags.writeable
    # The client writes again: the array sees it, so it is the client's memory.
    client_shm.set_shared_memory_region(handle, [np.array([7], dtype=np.int32)], offset=4108)
    assert data.tolist() == [7, 1, 2, 3]
    lease.release()


@pytest.mark.parametrize(
    ("name", "offset", "size", "code", "message"),
    [
        ("x", 0, 4, ErrorCode.NOT_FOUND, "Unable to find shared memory region: 'x'"),
        ("r", 64, 4, ErrorCode.INVALID_ARG, "Invalid offset for shared memory region: 'r'"),
        ("r", 60, 8, ErrorCode.INVALID_ARG,
         "Invalid offset + byte size for shared memory region: 'r'"),
        ("r", 0, 0, ErrorCode.INVALID_ARG,
         "Invalid offset + byte size for shared memory region: 'r'"),
        # A negative gRPC int64 is a huge size_t in Triton.
        ("r", -32, 4, ErrorCode.INVALID_ARG, "Invalid offset for shared memory region: 'r'"),
        ("r", 0, -1, ErrorCode.INVALID_ARG,
         "Invalid offset + byte size for shared memory region: 'r'"),
    ],
)  # fmt: skip
def test_a_place_outside_the_region_is_refused_and_holds_nothing(
    registry: SharedMemoryRegistry,
    shm_object: tuple[str, Any],
    name: str,
    offset: int,
    size: int,
    code: ErrorCode,
    message: str,
) -> None:
    registry.register_system("r", shm_object[0], 0, 64)
    lease = Lease(registry)
    error = fail(lease.read, name, offset, size)
    assert (error.code, error.message) == (code, message)
    error = fail(lease.reserve, "OUT", name, offset, size)
    assert (error.code, error.message) == (code, message)
    assert not lease
    registry.unregister(Kind.SYSTEM, "r")


def test_a_held_region_cannot_be_unregistered_until_released(
    registry: SharedMemoryRegistry, shm_object: tuple[str, Any]
) -> None:
    key, _ = shm_object
    for name in ("in", "out", "free"):
        registry.register_system(name, key, 0, 64)
    lease = Lease(registry)
    lease.read("in", 0, 16)
    lease.reserve("OUT", "out", 0, 16)

    error = fail(registry.unregister, Kind.SYSTEM, "in")
    assert (error.code, error.message) == (
        ErrorCode.INTERNAL,
        "Cannot unregister shared memory region 'in', it is currently in use.",
    )
    error = fail(registry.unregister, Kind.SYSTEM)
    assert (error.code, error.message) == (
        ErrorCode.INTERNAL,
        "Failed to unregister the following system shared memory regions: in ,out ,",
    )
    # The free one went; the held ones stay.
    assert [r.name for r in registry.status(Kind.SYSTEM)] == ["in", "out"]

    lease.release()
    lease.release()  # idempotent
    registry.unregister(Kind.SYSTEM)
    assert registry.status(Kind.SYSTEM) == []


def test_an_array_outlives_the_unregistration_of_its_region(
    registry: SharedMemoryRegistry, shm_object: tuple[str, Any]
) -> None:
    key, handle = shm_object
    client_shm.set_shared_memory_region(handle, [np.arange(4, dtype=np.int32)])
    registry.register_system("r", key, 0, 64)
    lease = Lease(registry)
    data = np.frombuffer(lease.read("r", 0, 16), dtype=np.int32)
    lease.release()
    registry.unregister(Kind.SYSTEM, "r")
    # The mapping goes with the last array, not before: still readable.
    assert data.tolist() == [0, 1, 2, 3]


def test_a_caller_that_gives_up_leaves_the_regions_held_until_the_request_is_over(
    registry: SharedMemoryRegistry, shm_object: tuple[str, Any]
) -> None:
    registry.register_system("r", shm_object[0], 0, 64)
    lease = Lease(registry)
    lease.read("r", 0, 16)
    request = InferenceRequest("m")

    async def main() -> None:
        answer: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        caller = asyncio.ensure_future(leases.answer_holding(lease, request, answer))
        await asyncio.sleep(0)  # the caller waits for the answer
        caller.cancel()  # the client went away
        with pytest.raises(asyncio.CancelledError):
            await caller
        lease.release()  # what the front end does when its handler ends
        assert request.cancelled
        # The request is still in a model: the region stays in use.
        error = fail(registry.unregister, Kind.SYSTEM, "r")
        assert (
            error.message == "Cannot unregister shared memory region 'r', it is currently in use."
        )
        answer.set_result("over")
        await asyncio.sleep(0)  # the answer's callbacks run
        registry.unregister(Kind.SYSTEM, "r")

    asyncio.run(main())
    assert registry.status(Kind.SYSTEM) == []


def test_a_region_the_client_shrank_is_refused_not_read(
    registry: SharedMemoryRegistry, shm_object: tuple[str, Any]
) -> None:
    # Reading past the end of a shrunk object would kill the server (SIGBUS).
    key, _ = shm_object
    registry.register_system("r", key, 4096, 64)
    os.truncate(f"/dev/shm{key}", 4100)
    lease = Lease(registry)

    for call, args in ((lease.read, ("r", 0, 16)), (lease.reserve, ("OUT", "r", 0, 16))):
        error = fail(call, *args)
        assert (error.code, error.message) == (
            ErrorCode.INVALID_ARG,
            f"shared memory region 'r' is no longer whole: its object '{key}' holds 4100 "
            "bytes, not the 4160 it was registered with",
        )
    assert not lease
    registry.unregister(Kind.SYSTEM, "r")
    assert registry.status(Kind.SYSTEM) == []


@pytest.mark.parametrize(("size", "off_loop"), [(4096, False), (leases.OFF_LOOP_BYTES + 4, True)])
def test_a_large_output_is_written_on_a_worker_thread(
    registry: SharedMemoryRegistry, monkeypatch: pytest.MonkeyPatch, size: int, off_loop: bool
) -> None:
    # A copy of a GiB takes most of a second: never on the event loop.
    key = f"/tritonactor_test_{uuid.uuid4().hex[:12]}"
    handle = client_shm.create_shared_memory_region("large", key, size)
    try:
        registry.register_system("big", key, 0, size)
        writers: list[threading.Thread] = []
        write = SystemRegion.write

        def recording(region: SystemRegion, offset: int, data: np.ndarray) -> None:
            writers.append(threading.current_thread())
            write(region, offset, data)

        monkeypatch.setattr(SystemRegion, "write", recording)
        lease = Lease(registry)
        lease.reserve("OUT", "big", 0, size)
        data = np.arange(size // 4, dtype=np.int32)

        written = asyncio.run(
            lease.write_off_loop(response_of(Tensor("OUT", "INT32", data.shape, data)))
        )
        lease.release()

        assert written == {"OUT"}
        assert (writers[0] is not threading.main_thread()) is off_loop
        got = client_shm.get_contents_as_numpy(handle, np.int32, [size // 4])
        assert got[-1] == size // 4 - 1
    finally:
        registry.close()
        client_shm.destroy_shared_memory_region(handle)


def request_with(lease: Lease) -> InferenceRequest:
    request = InferenceRequest("m")
    leases.attach(request, lease)
    return request


def response_of(*tensors: Tensor) -> InferenceResponse:
    return InferenceResponse(model_name="m", model_version="1", outputs=list(tensors))


def test_outputs_are_written_into_their_regions(
    registry: SharedMemoryRegistry, shm_object: tuple[str, Any]
) -> None:
    key, handle = shm_object
    registry.register_system("r", key, 0, 128)
    lease = Lease(registry)
    lease.reserve("A", "r", 0, 16)
    lease.reserve("S", "r", 64, 64)
    request = request_with(lease)
    strings = np.array([b"hello", b"wo"], dtype=np.object_)
    response = response_of(
        Tensor("A", "INT32", (4,), np.arange(4, dtype=np.int32)),
        Tensor("S", "BYTES", (2,), strings),
        Tensor("B", "INT32", (1,), np.zeros(1, dtype=np.int32)),
    )

    assert leases.write_outputs(request, response) == {"A", "S"}
    assert client_shm.get_contents_as_numpy(handle, np.int32, [4]).tolist() == [0, 1, 2, 3]
    got = client_shm.get_contents_as_numpy(handle, np.object_, [2], offset=64)
    assert got.tolist() == [b"hello", b"wo"]

    leases.release(request)
    assert leases.LEASE not in request.context
    registry.unregister(Kind.SYSTEM, "r")


def test_an_output_larger_than_its_region_fails_and_writes_nothing(
    registry: SharedMemoryRegistry, shm_object: tuple[str, Any]
) -> None:
    key, handle = shm_object
    registry.register_system("r", key, 0, 64)
    lease = Lease(registry)
    lease.reserve("A", "r", 0, 8)
    request = request_with(lease)
    response = response_of(Tensor("A", "INT32", (4,), np.arange(1, 5, dtype=np.int32)))

    error = fail(leases.write_outputs, request, response)
    assert (error.code, error.message) == (
        ErrorCode.INTERNAL,
        "shared memory size specified with the request for output 'A' (8 bytes) should be at "
        "least 16 bytes to hold the results",
    )
    assert client_shm.get_contents_as_numpy(handle, np.int32, [4]).tolist() == [0, 0, 0, 0]
    leases.release(request)


def test_a_request_without_shared_memory_carries_no_lease(registry: SharedMemoryRegistry) -> None:
    request = request_with(Lease(registry))
    assert leases.LEASE not in request.context
    assert leases.write_outputs(request, response_of()) == frozenset()
    leases.release(request)


def test_close_lets_go_of_every_region_even_held_ones(
    registry: SharedMemoryRegistry, shm_object: tuple[str, Any]
) -> None:
    registry.register_system("r", shm_object[0], 0, 64)
    Lease(registry).read("r", 0, 4)
    registry.close()
    assert registry.status(Kind.SYSTEM) == []
