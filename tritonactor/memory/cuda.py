"""A CUDA shared-memory region: device memory of another process, opened from its CUDA IPC
handle (`cudaIpcOpenMemHandle`), as tritonclient's `cuda_shared_memory` utilities make them.

The CUDA runtime is reached through ctypes on a libcudart this process can load — the one a
CUDA build of torch ships (the `gpu` extra), else cuda-python's, else the system's — and the
driver's `cuMemGetAddressRange` checks the handle's allocation is as large as registered. No
CUDA package is a dependency of the default install: without a device or a runtime, `register`
answers Triton's INVALID_ARG with the reason.

Tensors cross between device and host by copy: an input is copied to a host array once, an
output from the host once (the backends take numpy arrays).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from tritonactor.core.devices import gpu_count
from tritonactor.core.errors import TritonError, internal, invalid_arg
from tritonactor.memory.region import Kind, Region

log = logging.getLogger(__name__)

IPC_HANDLE_SIZE = 64  # sizeof(cudaIpcMemHandle_t)
_LAZY_ENABLE_PEER_ACCESS = 1  # cudaIpcMemLazyEnablePeerAccess, as Triton opens handles
_MEMCPY_DEFAULT = 4  # cudaMemcpyDefault: the direction follows from the pointers (UVA)


class CudaUnavailable(RuntimeError):
    """This server cannot open CUDA IPC handles (no device, or no CUDA runtime to load)."""


class CudaRuntime(Protocol):
    """The CUDA calls a region needs (a fake one serves the unit tests)."""

    def open(self, handle: bytes, device_id: int) -> int:
        """The device pointer of IPC `handle`, opened on `device_id`."""
        ...

    def allocation_size(self, pointer: int) -> int: ...

    def close(self, pointer: int) -> None: ...

    def to_host(self, pointer: int, byte_size: int) -> np.ndarray:
        """A host copy (uint8) of `byte_size` bytes at device `pointer`."""
        ...

    def from_host(self, pointer: int, data: np.ndarray) -> None: ...


RuntimeLoader = Callable[[], CudaRuntime]


class CudaRegion(Region):
    kind = Kind.CUDA

    def __init__(
        self, name: str, device_id: int, byte_size: int, runtime: CudaRuntime, pointer: int
    ) -> None:
        super().__init__(name, byte_size)
        self.device_id = device_id
        self._runtime = runtime
        self._pointer: int | None = pointer

    @classmethod
    def open(
        cls, runtime: CudaRuntime, name: str, handle: bytes, device_id: int, byte_size: int
    ) -> CudaRegion:
        """Open `handle` on `device_id`, with Triton's errors: a handle that does not open, or
        whose allocation is smaller than `byte_size`, is INVALID_ARG (the reason is logged and
        added in parentheses)."""
        if len(handle) != IPC_HANDLE_SIZE:
            raise register_failed(
                f"a CUDA IPC handle has {IPC_HANDLE_SIZE} bytes, not {len(handle)}"
            )
        try:
            pointer = runtime.open(handle, device_id)
        except CudaError as error:
            raise register_failed(str(error)) from None
        try:
            available = runtime.allocation_size(pointer)
        except CudaError as error:
            available, reason = 0, str(error)
        else:
            reason = f"the allocation holds {available} bytes, fewer than {byte_size}"
        if byte_size > available:
            runtime.close(pointer)
            log.warning("CUDA shared memory region '%s' not registered: %s", name, reason)
            raise invalid_arg(f"failed to register shared memory region '{name}': invalid args")
        return cls(name, device_id, byte_size, runtime, pointer)

    def read(self, offset: int, byte_size: int) -> memoryview:
        return memoryview(self._runtime.to_host(self._live() + offset, byte_size)).toreadonly()

    def write(self, offset: int, data: np.ndarray) -> None:
        self._runtime.from_host(self._live() + offset, data)

    def check_whole(self) -> None:
        """Nothing to check: the opened IPC handle keeps the whole allocation alive."""

    def close(self) -> None:
        pointer, self._pointer = self._pointer, None
        if pointer is None:
            return
        try:
            self._runtime.close(pointer)
        except CudaError as error:
            log.warning("closing CUDA shared memory region '%s': %s", self.name, error)

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "device_id": self.device_id, "byte_size": self.byte_size}

    def _live(self) -> int:
        if self._pointer is None:
            raise internal(f"shared memory region '{self.name}' is unregistered")
        return self._pointer


def register_failed(reason: str) -> TritonError:
    """Triton's answer when a CUDA IPC handle cannot be opened, with the reason (Triton only
    logs it)."""
    log.warning("CUDA shared memory register failed: %s", reason)
    return invalid_arg(f"failed to register shared memory region: invalid args ({reason})")


class CudaError(RuntimeError):
    pass


class _IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * IPC_HANDLE_SIZE)]


class CtypesRuntime:
    """`CudaRuntime` on libcudart (runtime API) and libcuda (driver API) through ctypes."""

    def __init__(self, cudart: ctypes.CDLL, driver: ctypes.CDLL) -> None:
        self._cudart = cudart
        self._driver = driver
        cudart.cudaGetErrorString.restype = ctypes.c_char_p
        cudart.cudaIpcOpenMemHandle.argtypes = [
            ctypes.POINTER(ctypes.c_void_p),
            _IpcHandle,
            ctypes.c_uint,
        ]
        cudart.cudaMemcpy.argtypes = [
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
        ]
        cudart.cudaIpcCloseMemHandle.argtypes = [ctypes.c_void_p]
        driver.cuMemGetAddressRange_v2.argtypes = [
            ctypes.POINTER(ctypes.c_uint64),
            ctypes.POINTER(ctypes.c_size_t),
            ctypes.c_uint64,
        ]

    def _check(self, call: str, status: int) -> None:
        if status != 0:
            text = self._cudart.cudaGetErrorString(status)
            raise CudaError(f"{call}: {text.decode() if text else status}")

    def open(self, handle: bytes, device_id: int) -> int:
        self._check("cudaSetDevice", self._cudart.cudaSetDevice(device_id))
        pointer = ctypes.c_void_p()
        ipc = _IpcHandle.from_buffer_copy(handle)
        status = self._cudart.cudaIpcOpenMemHandle(
            ctypes.byref(pointer), ipc, _LAZY_ENABLE_PEER_ACCESS
        )
        self._check("cudaIpcOpenMemHandle", status)
        assert pointer.value is not None
        return pointer.value

    def allocation_size(self, pointer: int) -> int:
        base, size = ctypes.c_uint64(), ctypes.c_size_t()
        status = self._driver.cuMemGetAddressRange_v2(
            ctypes.byref(base), ctypes.byref(size), pointer
        )
        if status != 0:
            raise CudaError(f"cuMemGetAddressRange: CUresult {status}")
        return base.value + size.value - pointer

    def close(self, pointer: int) -> None:
        self._check("cudaIpcCloseMemHandle", self._cudart.cudaIpcCloseMemHandle(pointer))

    def to_host(self, pointer: int, byte_size: int) -> np.ndarray:
        host = np.empty(byte_size, np.uint8)
        if byte_size:
            status = self._cudart.cudaMemcpy(host.ctypes.data, pointer, byte_size, _MEMCPY_DEFAULT)
            self._check("cudaMemcpy", status)
        return host

    def from_host(self, pointer: int, data: np.ndarray) -> None:
        if data.size:
            status = self._cudart.cudaMemcpy(pointer, data.ctypes.data, data.size, _MEMCPY_DEFAULT)
            self._check("cudaMemcpy", status)


def load_runtime() -> CudaRuntime:
    """The CUDA runtime of this process, or CudaUnavailable saying why there is none."""
    if gpu_count() == 0:
        raise CudaUnavailable("no CUDA device is visible to this server")
    path = _find_cudart()
    if path is None:
        raise CudaUnavailable(
            "no CUDA runtime found (a CUDA build of torch, the 'gpu' extra, or cuda-python)"
        )
    try:
        return CtypesRuntime(ctypes.CDLL(path), ctypes.CDLL("libcuda.so.1"))
    except (OSError, AttributeError) as error:
        raise CudaUnavailable(f"the CUDA libraries do not load: {error}") from None


def _find_cudart() -> str | None:
    """A libcudart: one this process has loaded already (torch's, once its CUDA started),
    else cuda-python's, else the system's."""
    loaded = _loaded_cudart()
    if loaded is not None:
        return loaded
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.init()
            loaded = _loaded_cudart()
            if loaded is not None:
                return loaded
    except Exception as error:  # a broken torch must not stop the other ways
        log.debug("torch's CUDA runtime: %s", error)
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib

        return load_nvidia_dynamic_lib("cudart").abs_path
    except Exception as error:
        log.debug("cuda-python's CUDA runtime: %s", error)
    return ctypes.util.find_library("cudart")


def _loaded_cudart() -> str | None:
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        path = line.split(maxsplit=5)[-1] if line.count(" ") >= 5 else ""
        if "/libcudart.so" in path:
            return path.strip()
    return None
