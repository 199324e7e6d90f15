"""Finding the engine of a server, or starting it: the first front-end process to arrive starts
it; every other one (and one that restarts) connects to the one already running.

The engine's socket and its lock file are named after what makes a server one server (its
addresses and its journal; with a port 0, also its process), so that two servers on one machine
never share an engine. The
lock is held while an engine is being started, so two front ends never start two engines; the
engine tells the one that started it, on a pipe, when its models are loaded (or that they
failed to load and it stopped)."""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import multiprocessing
import os
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import anyio

from tritonactor.engine.own_files import same_file
from tritonactor.settings import Settings


class EngineFailed(RuntimeError):
    """The engine stopped before it served: its models failed to load (--exit-on-error), or it
    could not start. The message is the engine's."""


# The engine reads the write end of its readiness pipe from this variable.
READY_FD = "TA_ENGINE_READY_FD"
# The pidfd of the process that started the engine.
STARTER_FD = "TA_ENGINE_STARTER_FD"
SOCKET = "TA_ENGINE_SOCKET"
# The lock file beside an engine's socket (`<socket>.lock`) while a process starts the engine.
LOCK_SUFFIX = ".lock"
# How many front-end processes the ASGI server runs: set by `tritonactor serve` (app.py reads
# it; a plain hypercorn command line says it with --workers). Not a TRITONACTOR_* setting: it
# describes the processes, and `tritonactor serve --workers` is how to choose it.
WORKERS = "TA_FRONTEND_WORKERS"


def engine_socket(settings: Settings) -> str:
    """The engine's Unix socket for the server `settings` describe: named after what makes it
    that server (its addresses, repositories and journal), in this user's private folder. A
    port 0 (one the OS chooses at each start) names no server: the same command run twice
    would name one engine, so the server's process (`server_process`) names it too."""
    ports = (settings.http_port, settings.grpc_port, settings.metrics_port)
    identity = "\0".join(
        [
            settings.http_host,
            str(settings.http_port),
            settings.grpc_host,
            str(settings.grpc_port),
            str(settings.metrics_port),
            str(settings.journal),
            *map(str, settings.model_repositories),
            *([server_process()] if 0 in ports else []),
        ]
    )
    digest = hashlib.sha256(identity.encode()).hexdigest()[:24]
    return str(private_folder() / f"{digest}.sock")


def server_process() -> str:
    """The process that is this server, as "pid:start time": the ASGI server's parent, which
    `tritonactor serve` becomes (by exec) and whose worker processes the front ends are
    (multiprocessing's spawn, as hypercorn and uvicorn start them). The same in every front end,
    and in one that restarts; never again the same in another server (a pid is reused only
    with another start time)."""
    parent = multiprocessing.parent_process()
    pid = parent.pid if parent is not None and parent.pid is not None else os.getpid()
    try:
        # /proc/PID/stat: the start time is field 22, counted after the ")" that ends the name.
        started = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19]
    except (OSError, IndexError):
        started = ""
    return f"{pid}:{started}"


def private_folder() -> Path:
    """A folder only this user can enter, for engine sockets and locks (Unix socket paths are
    limited to about 100 bytes: a short one in the temp folder). Anything else found under its
    name (another owner, a link, a mode that lets others in) stops the server: another user
    could otherwise answer in place of the engine."""
    folder = Path(tempfile.gettempdir()) / f"tritonactor-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        folder.mkdir(mode=0o700)
    found = os.lstat(folder)
    if (
        not stat.S_ISDIR(found.st_mode)
        or found.st_uid != os.getuid()
        or stat.S_IMODE(found.st_mode) & 0o077
    ):
        raise EngineFailed(
            f"{folder} is not a folder of this user's that only it can enter; remove it"
        )
    return folder


def same_user(sock: socket.socket) -> bool:
    """Whether the process at the other end of the Unix socket `sock` runs as this user."""
    credentials = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _, uid, _ = struct.unpack("3i", credentials)
    return uid == os.getuid()


def peer_pid(sock: socket.socket) -> int:
    """The process at the other end of the Unix socket `sock`."""
    credentials = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, _, _ = struct.unpack("3i", credentials)
    return int(pid)


def _probe(path: str) -> socket.socket | None:
    """A connection to the engine that answers on `path` (this user's), or None."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
        if same_user(probe):
            return probe
    except OSError:
        pass
    probe.close()
    return None


def die_with_parent() -> None:
    """Linux: this process gets SIGTERM when its parent ends, killed outright included (the
    engine, of the process that started it: `start_engine`; a front-end worker, of its ASGI
    server's supervisor)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


_PR_SET_PDEATHSIG = 1


def _start(settings: Settings, path: str, tied: bool = False) -> socket.socket | None:
    """Under the lock: start the engine unless one answers on `path`; return once it serves
    (raising EngineFailed when it stopped instead). `tied`: the engine
    also stops when this process ends. Returns the connection that found an engine already
    running, None when this call started it: held open until this front end has joined, it
    keeps an engine whose starter has ended from stopping meanwhile (engine/__main__.py)."""
    found = _probe(path)
    if found is not None:
        return found
    read_end, write_end = os.pipe()
    env = {**os.environ, **settings.to_env(), READY_FD: str(write_end), SOCKET: path}
    # A pidfd of this process, which the engine watches (engine/__main__.py): unlike a pid
    # read later, it cannot name another process once this one has ended.
    starter = _own_pidfd()
    if starter is not None:
        env[STARTER_FD] = str(starter)
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "tritonactor.engine"],
            env=env,
            pass_fds=(write_end,) if starter is None else (write_end, starter),
            stdin=subprocess.DEVNULL,
            # In the front ends' process group, so that whoever stops the server by its group
            # stops the engine too (it waits for the front ends to leave: engine/__main__.py).
            preexec_fn=die_with_parent if tied and sys.platform == "linux" else None,
        )
    finally:
        os.close(write_end)
        if starter is not None:
            os.close(starter)
    with os.fdopen(read_end, "rb") as ready:
        said = ready.readline().decode(errors="replace").strip()
    if said == "ready":
        return None
    process.wait()
    if said.startswith("failed:"):
        raise EngineFailed(said.removeprefix("failed:").strip())
    raise EngineFailed(f"the engine stopped before serving (exit status {process.returncode})")


def _own_pidfd() -> int | None:
    try:
        return os.pidfd_open(os.getpid())
    except (AttributeError, OSError):
        return None  # no pidfd here (not Linux 5.3 or later, a seccomp filter)


def _locked_start(settings: Settings, path: str, tied: bool = False) -> socket.socket | None:
    """`_start` under the lock file beside the socket, which its holder removes before it lets
    go (each server's name would otherwise leave a file behind for good): a process that waited
    on a file removed meanwhile locks the one at the path now, made anew if need be."""
    lock_path = path + LOCK_SUFFIX
    _sweep_stale_locks(os.path.dirname(path))
    while True:
        lock = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if same_file(lock, lock_path):
                break
        except BaseException:
            os.close(lock)
            raise
        os.close(lock)  # removed while this process waited: the lock is the path's file now
    try:
        return _start(settings, path, tied)
    finally:
        with contextlib.suppress(OSError):  # (gone, or a folder that refuses: left, harmless)
            os.unlink(lock_path)
        os.close(lock)  # (its lock goes with it)


def _sweep_stale_locks(folder: str) -> None:
    """Remove the lock files no start holds: left by a start that was killed (a holder removes
    its own when it lets go), each under its lock as its holder would have, so that a start
    under way keeps its file."""
    try:
        names = [name for name in os.listdir(folder) if name.endswith(".sock" + LOCK_SUFFIX)]
    except OSError:
        return
    for name in names:
        lock_path = os.path.join(folder, name)
        try:
            lock = os.open(lock_path, os.O_RDWR | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if same_file(lock, lock_path):
                os.unlink(lock_path)
        except OSError:
            pass  # held by a start under way, or gone meanwhile
        finally:
            os.close(lock)


def start_engine(settings: Settings) -> str:
    """For `tritonactor serve`, before it becomes the ASGI server (same process, by exec): the
    engine starts first, so that models that fail to load stop the command with their error
    (rather than a worker pool starting failing workers again), and it is tied to this
    process: when the ASGI server ends, so does the engine. Returns its socket."""
    path = engine_socket(settings)
    found = _locked_start(settings, path, tied=True)
    if found is not None:
        found.close()
    return path


async def ensure_engine(settings: Settings) -> tuple[str, socket.socket | None]:
    """The socket of the server's engine, started now when none runs yet; and, when one
    already ran, a connection to it, which the caller closes once it has joined the engine
    (until then, an engine whose starter has ended waits for it rather than stopping)."""
    path = os.environ.get(SOCKET) or engine_socket(settings)
    found = await anyio.to_thread.run_sync(_locked_start, settings, path, abandon_on_cancel=True)
    return path, found


def tell_ready(message: str) -> None:
    """In the engine: tell the front end that started it (once)."""
    fd = os.environ.pop(READY_FD, None)
    if fd is None:
        return
    with contextlib.suppress(OSError), os.fdopen(int(fd), "wb") as pipe:
        pipe.write(message.encode() + b"\n")


def usable_cpus(cpu_max: Path = Path("/sys/fs/cgroup/cpu.max")) -> int:
    """The cores this process may use: its CPU affinity, bounded by a cgroup v2 CPU quota
    (a container's or a Kubernetes pod's CPU limit), rounded up; at least 1. How many front
    ends a server runs beside its engine follows from it (docs/decisions.md, "How many front
    ends")."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        quota, period = cpu_max.read_text().split()[:2]
        if quota != "max":
            cores = min(cores, -(-int(quota) // int(period)))
    except (OSError, ValueError):
        pass  # no cgroup v2 limit to read
    return max(1, cores)
