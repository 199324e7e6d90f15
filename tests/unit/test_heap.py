"""core/heap.py: large buffers freed by a request are reused by the next, not faulted in
again from the kernel (counted in page faults, in a process of its own)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = """
import resource, sys
from tritonactor.core.heap import keep_freed_memory
tuned = keep_freed_memory() if sys.argv[1] == "tune" else False
buffers = [bytearray(1 << 20) for _ in range(4)]  # the heap's high-water mark
del buffers
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):  # a request: a body, its tensors, an answer; all freed at its end
    body = b"x" * (1 << 20)
    tensors = bytes(body)
    answer = b"".join((b"{}", tensors))
    del body, tensors, answer
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(tuned, faults)
"""


def probe(mode: str, **env: str) -> tuple[bool, int]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_"))}
    environ.update(env)
    done = subprocess.run(
        [sys.executable, "-c", PROBE, mode], env=environ, capture_output=True, text=True, check=True
    )
    tuned, faults = done.stdout.split()
    return tuned == "True", int(faults)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_freed_large_buffers_are_reused_without_faulting_pages_in() -> None:
    tuned, faults = probe("tune")
    untuned, untuned_faults = probe("plain")
    assert tuned and not untuned
    # 50 requests of three 1 MiB buffers: 256 pages each when they come fresh from the kernel.
    assert untuned_faults > 50 * 256
    assert faults < 256


def test_the_operators_own_allocator_settings_are_left_alone() -> None:
    assert not probe("tune", MALLOC_TRIM_THRESHOLD_="1000000")[0]
    assert not probe("tune", GLIBC_TUNABLES="glibc.malloc.trim_threshold=1000000")[0]
