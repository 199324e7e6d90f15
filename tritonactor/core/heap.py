"""How the C allocator treats large buffers in a server process.

A request with large tensors makes several buffers of their size (the body, the decoded
tensors, the answer) and frees them at its end. glibc hands each such buffer out as fresh
pages from the kernel and returns them when freed (above its mmap threshold, or off the top of
the heap beyond its trim threshold), so every request paid a page fault per 4 KiB it touched:
with 1 MiB in and out, about a third of a front end's CPU under `tritonactor serve`
(docs/benchmarks.md). Raising both thresholds keeps freed buffers in the heap for the next
request, at the price of keeping up to `TRIM_THRESHOLD` of free memory per malloc arena. Only
on glibc, and not when the operator set `MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_` or
any `GLIBC_TUNABLES`.
"""

from __future__ import annotations

import ctypes
import logging
import os

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "keep_freed_memory"]

log = logging.getLogger(__name__)

# Buffers below this come from the heap rather than fresh pages of their own.
MMAP_THRESHOLD = 4 << 20
# Free memory at the top of a heap kept for reuse, rather than given back to the kernel: per
# malloc arena (glibc makes one per thread that allocates, up to 8 per core), and below the
# 64 MiB of a thread's arena heap, which so still shrinks.
TRIM_THRESHOLD = 32 << 20
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_OPERATOR_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")


def keep_freed_memory() -> bool:
    """Set the thresholds in this process; whether they were set."""
    if any(name in os.environ for name in _OPERATOR_SETTINGS):
        return False
    try:
        # The process's own symbols, libc's among them (no search: find_library may run
        # ldconfig or a compiler at every start).
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS): its allocator, as it is
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    done = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
    if not done:
        log.debug("the allocator refused its thresholds")
    return done
