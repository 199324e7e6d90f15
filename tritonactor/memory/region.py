"""What every registered shared-memory region is to the rest of the server, system or CUDA:
a name, a size, the requests using it, and bytes to read and write at an offset."""

from __future__ import annotations

import abc
import enum
from typing import Any

import numpy as np

from tritonactor.core.errors import invalid_arg

# Offsets and sizes are unsigned 64-bit on the wire (Triton's size_t): a negative gRPC int64
# wraps around, as it does in Triton, and so lands out of bounds.
UINT64 = 2**64


class Kind(enum.Enum):
    SYSTEM = "system"
    CUDA = "cuda"


class Region(abc.ABC):
    """A registered region. `users` counts the requests holding it (reading an input from it
    or due to write an output into it): while any does, it cannot be unregistered."""

    kind: Kind

    def __init__(self, name: str, byte_size: int) -> None:
        self.name = name
        self.byte_size = byte_size
        self.users = 0
        # Out of the registry while requests still held it (`SharedMemoryRegistry.retire`):
        # closed when the last of them lets go.
        self.retired = False

    @abc.abstractmethod
    def read(self, offset: int, byte_size: int) -> memoryview:
        """The bytes at [offset, offset + byte_size) of the region, already bounds-checked:
        a read-only view of the mapping where the memory is the host's, else a host copy."""

    @abc.abstractmethod
    def write(self, offset: int, data: np.ndarray) -> None:
        """Copy `data` (contiguous uint8) into the region at `offset` (already bounds-checked)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Let go of the memory (unmap, close the IPC handle). Never raises: the region has
        already left the registry."""

    @abc.abstractmethod
    def status(self) -> dict[str, Any]:
        """The region's status entry, with Triton's keys in Triton's order."""

    @abc.abstractmethod
    def check_whole(self) -> None:
        """Raise when the memory behind the region is no longer all there (a request must
        not read or write it then)."""

    def check_bounds(self, offset: int, byte_size: int) -> None:
        """Triton's checks of a tensor's place in the region, with its messages: unsigned
        arithmetic, so a byte size of 0 is out of bounds as in Triton, and a negative gRPC
        offset or size is a huge one. Offsets count from the start of the region (not of the
        shared-memory object it was registered from)."""
        offset %= UINT64
        byte_size %= UINT64
        end = self.byte_size - 1 if self.byte_size > 0 else 0
        if offset > end:
            raise invalid_arg(f"Invalid offset for shared memory region: '{self.name}'")
        if (offset + byte_size - 1) % UINT64 > end:
            raise invalid_arg(f"Invalid offset + byte size for shared memory region: '{self.name}'")
