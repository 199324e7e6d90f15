"""The machine's CPU and memory, read from /proc as Triton reads them (system-wide, not this
process: prometheus_client's process collector covers the process)."""

from __future__ import annotations

from pathlib import Path

PROC = Path("/proc")


class CpuUsage:
    """CPU utilization between one reading and the next, all cores together, 0.0 - 1.0."""

    def __init__(self, proc: Path = PROC) -> None:
        self._stat = proc / "stat"
        self._last = self._read()

    def utilization(self) -> float | None:
        """The busy share of CPU time since the previous call (the first: since this object
        was made); None where /proc/stat cannot be read."""
        now = self._read()
        last, self._last = self._last, now
        if now is None or last is None:
            return None
        total = now[0] - last[0]
        idle = now[1] - last[1]
        if total <= 0:
            return 0.0
        return min(1.0, max(0.0, 1.0 - idle / total))

    def _read(self) -> tuple[int, int] | None:
        """(all ticks, idle ticks) of the aggregate `cpu` line."""
        try:
            with self._stat.open() as stat:
                fields = stat.readline().split()
        except OSError:
            return None
        if not fields or fields[0] != "cpu":
            return None
        # user nice system idle iowait irq softirq steal; guest time is already in user.
        ticks = [int(value) for value in fields[1:9]]
        return sum(ticks), ticks[3] + (ticks[4] if len(ticks) > 4 else 0)


def read_memory(proc: Path = PROC) -> tuple[int, int] | None:
    """(total, used) bytes of RAM, used being what is not available; None where /proc/meminfo
    cannot be read."""
    values: dict[str, int] = {}
    try:
        with (proc / "meminfo").open() as meminfo:
            for line in meminfo:
                name, _, rest = line.partition(":")
                if name in ("MemTotal", "MemAvailable"):
                    values[name] = int(rest.split()[0]) * 1024  # the file counts kB
    except (OSError, ValueError, IndexError):
        return None
    if len(values) != 2:
        return None
    total = values["MemTotal"]
    return total, max(0, total - values["MemAvailable"])
