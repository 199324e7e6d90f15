"""The one way work too large for the event loop leaves it: `off_loop(work, size)` runs
`work()` on a worker thread when its `size` reaches OFF_LOOP_BYTES, in place otherwise (a
thread hop costs more than small work).

`size` is in bytes copied or encoded. Work that steps through elements in Python (ranking a
score, encoding or decoding a BYTES element) counts ELEMENT_BYTES a step: such a step costs
about what copying that many bytes does not, but it is the scale that keeps a million steps
(most of a second) off the loop and a few thousand on it.

Used by shared-memory output writes (memory/lease.py), classification rankings
(frontends/classification.py) and the response cache's keys, copies and hits
(scheduling/caching.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import anyio.to_thread

T = TypeVar("T")

# Work of at least this many bytes runs on a worker thread (a copy of 1 MiB takes ~0.1 ms; of
# 1 GiB, most of a second).
OFF_LOOP_BYTES = 1 << 20
# What one Python-level step over an element counts for (see the module's docstring).
ELEMENT_BYTES = 64


def large(size: int) -> bool:
    """Whether work of `size` bytes leaves the event loop."""
    return size >= OFF_LOOP_BYTES


async def off_loop(work: Callable[[], T], size: int) -> T:
    """`work()`, on a worker thread when `size` is large, on the event loop otherwise."""
    if large(size):
        return await anyio.to_thread.run_sync(work)
    return work()
