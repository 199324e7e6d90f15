"""The server's TCP listening sockets (HTTP, gRPC, metrics). Each is bound once, by one
process, without SO_REUSEPORT: an address that another process holds fails the start with a
message naming it, and no other process can later bind it and take part of the traffic. This
server's own front ends share one socket (they inherit it, or the engine hands it to each of them:
engine/listeners.py); see docs/operations.md, "Ports"."""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import socket
from pathlib import Path

log = logging.getLogger(__name__)

# The queue of connections not yet accepted: large, as a listener shared by several front ends
# (or waiting for a restarted one) keeps the ones that arrive meanwhile.
BACKLOG = 1024


class ListenFailed(RuntimeError):
    """An endpoint could not listen on its address; the message names both and why (e.g.
    "gRPC: cannot listen on 0.0.0.0:8001: address already in use")."""


def address_text(host: str, port: int) -> str:
    """``host:port``, an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def listen_failed(endpoint: str, host: str, port: int, error: OSError) -> ListenFailed:
    """The error for `endpoint` (HTTP, gRPC, metrics) failing to bind `host:port`."""
    if isinstance(error, socket.gaierror):
        reason = f"cannot resolve {host!r}"
    elif error.errno is not None:
        reason = os.strerror(error.errno).lower()
        if error.errno == errno.EADDRINUSE:
            reason += " (another process listens there)"
    else:
        reason = str(error)
    return ListenFailed(f"{endpoint}: cannot listen on {address_text(host, port)}: {reason}")


def listening_socket(endpoint: str, host: str, port: int) -> socket.socket:
    """A non-blocking TCP socket bound to `host:port` and listening (port 0: one the OS
    chooses); raises ListenFailed. SO_REUSEADDR lets a restarted server bind at once despite
    connections of the last one in TIME_WAIT; it lets nobody share a listening socket."""
    return _bound(endpoint, host, port, listen=True)


def bound_socket(endpoint: str, host: str, port: int) -> socket.socket:
    """As `listening_socket`, but not listening yet: a connection to it is refused until
    `listen` is called (`sock.listen(BACKLOG)`, or an event loop's `create_server` on it). For
    the engine's gRPC socket, bound before its models load so that a taken address fails the
    start then, and listening once they have loaded, as tritonserver opens no endpoint before."""
    return _bound(endpoint, host, port, listen=False)


def check_free(endpoint: str, host: str, port: int) -> None:
    """Raise ListenFailed now when `host:port` is taken, so that a server fails before it
    loads its models rather than after. Only a look (a bind that never listens, so that it
    takes no connection): the real bind that follows is what refuses an address taken
    meanwhile."""
    if port == 0:
        return
    bound_socket(endpoint, host, port).close()


def _bound(endpoint: str, host: str, port: int, listen: bool) -> socket.socket:
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host or None, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE
        )[0]
    except OSError as error:
        raise listen_failed(endpoint, host, port, error) from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind(address)
        if listen:
            sock.listen(BACKLOG)
    except OSError as error:
        sock.close()
        raise listen_failed(endpoint, host, port, error) from None
    sock.setblocking(False)
    return sock


def others_listening(host: str, port: int) -> int:
    """How many sockets of other processes listen on `host:port` beside this process's own
    (Linux: /proc/net/tcp and tcp6, by inode; 0 where they cannot be read). For a socket this
    server did not bind by its own rules: hypercorn's, which it binds with SO_REUSEPORT under
    `--workers N`, so that this server may have joined another process's port."""
    try:
        ours = ipaddress.ip_address(
            socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][4][0]
        )
    except (OSError, ValueError):
        return 0
    own = _own_inodes(port)
    found = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _LISTEN or fields[9] in own:
                continue
            address, _, hex_port = fields[1].partition(":")
            if int(hex_port, 16) == port and _overlap(ours, proc_address(address)):
                found += 1
    return found


_LISTEN = "0A"


def _own_inodes(port: int) -> set[str]:
    """The inodes of this process's TCP sockets bound to `port` (inherited from the ASGI
    server's parent: bound, perhaps not listening yet)."""
    inodes = set()
    for entry in Path("/proc/self/fd").iterdir():
        try:
            target = os.readlink(entry)
            if not target.startswith("socket:["):
                continue
            with socket.socket(fileno=os.dup(int(entry.name))) as sock:
                inet = sock.family in (socket.AF_INET, socket.AF_INET6)
                if inet and sock.getsockname()[1] == port:
                    inodes.add(target.removeprefix("socket:[").removesuffix("]"))
        except (OSError, ValueError):
            continue
    return inodes


def proc_address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An address as /proc/net/tcp{,6} writes it: 32-bit words in host (little-endian) order."""
    raw = bytes.fromhex(text)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(words)


def _overlap(
    a: ipaddress.IPv4Address | ipaddress.IPv6Address,
    b: ipaddress.IPv4Address | ipaddress.IPv6Address,
) -> bool:
    """Whether sockets listening on `a` and `b` (one port) take each other's connections: the
    same address, or a wildcard of the same family; across families only IPv6's `::`, when it
    also accepts IPv4 (dual-stack: Linux's default, net.ipv6.bindv6only=0, which /proc does
    not tell per socket). `0.0.0.0` and `::1` are two listeners that Linux lets coexist."""
    a = getattr(a, "ipv4_mapped", None) or a
    b = getattr(b, "ipv4_mapped", None) or b
    if a.version == b.version:
        return a == b or a.is_unspecified or b.is_unspecified
    six = a if a.version == 6 else b
    return six.is_unspecified and _dual_stack()


def _dual_stack() -> bool:
    try:
        return Path("/proc/sys/net/ipv6/bindv6only").read_text().strip() == "0"
    except OSError:
        return True


def refuse_shared(endpoint: str, host: str, port: int) -> None:
    """Raise ListenFailed when another process listens on `host:port` beside this server
    (see `others_listening`): this server then leaves the address to the one already there."""
    if port and others_listening(host, port):
        error = ListenFailed(
            f"{endpoint}: cannot listen on {address_text(host, port)}: address already in use "
            "(another process listens there: hypercorn's workers bind it with SO_REUSEPORT, "
            "which let this server join it; `tritonactor serve --asgi-server hypercorn` "
            "binds it without)"
        )
        log.error("%s", error)
        raise error
