"""What /proc says about the processes a test started: their children, command lines and
environments (Linux only, as the server's process topology is)."""

from __future__ import annotations

from pathlib import Path


def children(pid: int) -> list[int]:
    """The children of every thread of `pid` (a process started from a worker thread is that
    thread's child)."""
    children: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return []
    for task in tasks:
        try:
            children.extend(int(child) for child in (task / "children").read_text().split())
        except OSError:
            continue
    return children


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {key.decode(): value.decode(errors="replace") for key, value in pairs}


def all_pids() -> list[int]:
    return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]


def _stat_fields(pid: int) -> list[str]:
    """The fields of /proc/<pid>/stat after the command name (field 3, the state, first)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def start_time(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot): with the pid, names one process for good."""
    fields = _stat_fields(pid)
    return int(fields[19]) if len(fields) > 19 else None


def has_ended(pid: int, started: int | None) -> bool:
    """Whether the process `pid` that started at `started` has let go of what it held: gone,
    a zombie or dead (its files, listening sockets included, closed), or the pid now names a
    later process. Its command line is no sign: it reads empty while the exiting process still
    holds its files."""
    fields = _stat_fields(pid)
    if not fields or fields[0] in ("Z", "X"):
        return True
    return started is not None and int(fields[19]) != started
