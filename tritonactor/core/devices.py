"""Which CUDA devices this process can see, without importing a CUDA library."""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path


@functools.cache
def gpu_count() -> int:
    """Visible CUDA devices: the /dev/nvidiaN nodes, narrowed by CUDA_VISIBLE_DEVICES."""
    nodes = [p for p in Path("/dev").glob("nvidia*") if re.fullmatch(r"nvidia\d+", p.name)]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return len(nodes)
    entries = [entry for entry in visible.split(",") if entry.strip() not in ("", "-1")]
    return min(len(entries), len(nodes))
