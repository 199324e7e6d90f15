"""What the memory budget measures: the bytes of a model's files before it loads (the estimate)
and the resident memory of this process and its children (python-backend model processes)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

_PAGE = os.sysconf("SC_PAGE_SIZE")


def files_size(folders: Iterable[Path]) -> int:
    """Bytes of every file under `folders`, each real file counted once (links followed)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for folder in folders:
        for root, _, names in os.walk(folder, followlinks=True):
            for name in names:
                try:
                    stat = os.stat(os.path.join(root, name))
                except OSError:
                    continue
                key = (stat.st_dev, stat.st_ino)
                if key not in seen:
                    seen.add(key)
                    total += stat.st_size
    return total


def process_tree_rss(pid: int | None = None) -> int:
    """Resident bytes of `pid` (default: this process) and all its descendants; 0 where /proc
    cannot tell (not Linux)."""
    root = os.getpid() if pid is None else pid
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return 0
    for entry in entries:
        if entry.isdigit():
            parent = _parent(int(entry))
            if parent is not None:
                children.setdefault(parent, []).append(int(entry))
    total, stack = 0, [root]
    while stack:
        current = stack.pop()
        total += _rss(current)
        stack.extend(children.get(current, ()))
    return total


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            text = stat.read()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: fields start after the last ")".
    fields = text[text.rfind(b")") + 2 :].split()
    return int(fields[1]) if len(fields) > 1 else None


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0
