"""`tritonactor serve`'s TLS arguments for uvicorn and hypercorn, and its ports: what it binds
and checks before anything starts (tritonactor/cli.py, tritonactor/frontends/listen.py)."""

from __future__ import annotations

import ipaddress
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import trustme

from tritonactor import cli
from tritonactor.frontends import listen
from tritonactor.frontends.listen import (
    ListenFailed,
    check_free,
    listening_socket,
    others_listening,
    refuse_shared,
)
from tritonactor.settings import Settings


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "repo"
    path.mkdir()
    return path


@pytest.fixture
def clean_environ(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.startswith(("TRITONACTOR_", "TA_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)


@pytest.fixture
def pem(tmp_path: Path) -> dict[str, str]:
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1")
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    server.cert_chain_pems[0].write_to_path(str(tmp_path / "server.pem"))
    server.private_key_pem.write_to_path(str(tmp_path / "server.key"))
    return {
        "ca": str(tmp_path / "ca.pem"),
        "cert": str(tmp_path / "server.pem"),
        "key": str(tmp_path / "server.key"),
    }


def http_settings(repo: Path, pem: dict[str, str], mutual: bool) -> Settings:
    values = {
        "model_repositories": (repo,),
        "journal": repo.parent / "journal.jsonl",
        "http_server_cert": pem["cert"],
        "http_server_key": pem["key"],
    }
    if mutual:
        values |= {"http_use_ssl_mutual": True, "http_root_cert": pem["ca"]}
    else:
        values |= {"http_use_ssl": True}
    return Settings(**values)


@pytest.mark.parametrize("mutual", [False, True])
def test_uvicorn_gets_the_http_tls_files(repo: Path, pem: dict[str, str], mutual: bool) -> None:
    command = cli.uvicorn_command(http_settings(repo, pem, mutual))
    assert command[command.index("--ssl-certfile") + 1] == pem["cert"]
    assert command[command.index("--ssl-keyfile") + 1] == pem["key"]
    if mutual:
        assert command[command.index("--ssl-ca-certs") + 1] == pem["ca"]
        assert command[command.index("--ssl-cert-reqs") + 1] == "2"  # ssl.CERT_REQUIRED
    else:
        assert "--ssl-ca-certs" not in command and "--ssl-cert-reqs" not in command


@pytest.mark.parametrize("mutual", [False, True])
def test_hypercorn_gets_the_http_tls_files(repo: Path, pem: dict[str, str], mutual: bool) -> None:
    command = cli.hypercorn_command(http_settings(repo, pem, mutual), http_fd=7)
    assert command[command.index("--bind") + 1] == "fd://7"
    assert command[command.index("--certfile") + 1] == pem["cert"]
    assert command[command.index("--keyfile") + 1] == pem["key"]
    if mutual:
        assert command[command.index("--ca-certs") + 1] == pem["ca"]
        assert command[command.index("--verify-mode") + 1] == "CERT_REQUIRED"
    else:
        assert "--ca-certs" not in command and "--verify-mode" not in command


def test_plain_text_commands_have_no_tls_arguments(repo: Path) -> None:
    plain = Settings(model_repositories=(repo,), journal=repo.parent / "j.jsonl")
    for command in (cli.uvicorn_command(plain), cli.hypercorn_command(plain)):
        assert not [argument for argument in command if "ssl" in argument or "cert" in argument]


@pytest.mark.usefixtures("clean_environ")
def test_serve_refuses_tls_without_its_files_naming_the_flag(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(["serve", f"--model-repository={repo}", "--grpc-use-ssl=true"])
    assert code == 2
    error = capsys.readouterr().err
    assert error.startswith(
        "tritonactor serve: error: TRITONACTOR_GRPC_USE_SSL=true needs "
        "TRITONACTOR_GRPC_SERVER_CERT and TRITONACTOR_GRPC_SERVER_KEY"
    )
    assert error.rstrip().endswith("(set by --grpc-use-ssl)")


# -- ports -----------------------------------------------------------------------------------------


def test_a_taken_address_is_named_with_its_endpoint() -> None:
    held = listening_socket("gRPC", "127.0.0.1", 0)
    port = held.getsockname()[1]
    try:
        with pytest.raises(ListenFailed) as refused:
            listening_socket("gRPC", "127.0.0.1", port)
        assert str(refused.value) == (
            f"gRPC: cannot listen on 127.0.0.1:{port}: address already in use "
            "(another process listens there)"
        )
        with pytest.raises(ListenFailed, match=f"metrics: cannot listen on 127.0.0.1:{port}"):
            check_free("metrics", "127.0.0.1", port)
        # The wildcard address overlaps every IPv4 one.
        with pytest.raises(ListenFailed, match=f"HTTP: cannot listen on 0.0.0.0:{port}"):
            check_free("HTTP", "0.0.0.0", port)
    finally:
        held.close()
    check_free("gRPC", "127.0.0.1", port)  # free again


def test_a_listening_socket_cannot_be_joined_with_so_reuseport() -> None:
    held = listening_socket("gRPC", "127.0.0.1", 0)
    port = held.getsockname()[1]
    intruder = socket.socket()
    intruder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        with pytest.raises(OSError, match="Address already in use"):
            intruder.bind(("127.0.0.1", port))
    finally:
        intruder.close()
        held.close()


def test_an_address_that_cannot_be_resolved_is_named() -> None:
    with pytest.raises(ListenFailed, match=r"gRPC: cannot listen on no-such-host\.invalid:1: can"):
        listening_socket("gRPC", "no-such-host.invalid", 1)


def test_another_process_sharing_a_reuseport_socket_is_found() -> None:
    # hypercorn's socket under --workers N: SO_REUSEPORT, so another process may join it.
    ours = socket.socket()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    ours.bind(("127.0.0.1", 0))
    port = ours.getsockname()[1]
    assert others_listening("127.0.0.1", port) == 0
    refuse_shared("HTTP", "127.0.0.1", port)  # bound, not listening yet: alone
    joiner = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import socket, sys\n"
            "s = socket.socket()\n"
            "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)\n"
            f"s.bind(('127.0.0.1', {port}))\n"
            "s.listen()\n"
            "print('listening', flush=True)\n"
            "sys.stdin.read()\n",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert joiner.stdout is not None and joiner.stdout.readline() == b"listening\n"
        ours.listen()
        assert others_listening("127.0.0.1", port) == 1
        assert others_listening("0.0.0.0", port) == 1
        assert others_listening("127.0.0.2", port) == 0
        with pytest.raises(ListenFailed, match=f"HTTP: cannot listen on 127.0.0.1:{port}"):
            refuse_shared("HTTP", "127.0.0.1", port)
    finally:
        joiner.communicate(b"")
        ours.close()


@pytest.mark.parametrize(
    ("a", "b", "dual_stack", "overlap"),
    [
        ("127.0.0.1", "127.0.0.1", True, True),
        ("0.0.0.0", "127.0.0.1", True, True),
        ("127.0.0.1", "127.0.0.2", True, False),
        ("::", "::1", False, True),
        ("::ffff:127.0.0.1", "127.0.0.1", False, True),  # IPv4 written as IPv6 (tcp6)
        # Across families only a dual-stack `::` takes IPv4's connections.
        ("0.0.0.0", "::1", True, False),
        ("::1", "0.0.0.0", True, False),
        ("0.0.0.0", "::", True, True),
        ("127.0.0.1", "::", True, True),
        ("0.0.0.0", "::", False, False),
    ],
)
def test_listeners_overlap_within_a_family_and_through_a_dual_stack_wildcard(
    monkeypatch: pytest.MonkeyPatch, a: str, b: str, dual_stack: bool, overlap: bool
) -> None:
    monkeypatch.setattr(listen, "_dual_stack", lambda: dual_stack)
    first, second = ipaddress.ip_address(a), ipaddress.ip_address(b)
    assert listen._overlap(first, second) is overlap
    assert listen._overlap(second, first) is overlap


def test_a_wildcard_is_not_refused_beside_a_listener_of_the_other_family() -> None:
    # Linux lets 0.0.0.0:P and [::1]:P both listen; neither takes the other's connections.
    other = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import socket, sys\n"
            "s = socket.socket(socket.AF_INET6)\n"
            "s.bind(('::1', 0))\n"
            "s.listen()\n"
            "print(s.getsockname()[1], flush=True)\n"
            "sys.stdin.read()\n",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert other.stdout is not None
        said = other.stdout.readline().strip()
        if not said.isdigit():
            pytest.skip("no IPv6 loopback here")
        port = int(said)
        assert others_listening("::1", port) == 1
        assert others_listening("::", port) == 1
        assert others_listening("0.0.0.0", port) == 0
        assert others_listening("127.0.0.1", port) == 0
        refuse_shared("HTTP", "0.0.0.0", port)  # not refused
        with pytest.raises(ListenFailed, match=rf"HTTP: cannot listen on \[::1\]:{port}"):
            refuse_shared("HTTP", "::1", port)
    finally:
        other.communicate(b"")


@pytest.mark.usefixtures("clean_environ")
def test_serve_stops_before_anything_starts_when_a_port_is_taken(
    repo: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def never(command: list[str], env: dict[str, str]) -> None:
        raise AssertionError("serve went on to exec the ASGI server")

    monkeypatch.setattr(cli, "_exec", never)
    held = listening_socket("metrics", "127.0.0.1", 0)
    port = held.getsockname()[1]
    try:
        code = cli.main(
            [
                "serve",
                f"--model-repository={repo}",
                "--http-address=127.0.0.1",
                "--http-port=0",
                "--grpc-port=0",
                f"--metrics-port={port}",
                "--workers=0",
            ]
        )
    finally:
        held.close()
    assert code == 1
    assert capsys.readouterr().err == (
        f"tritonactor serve: error: metrics: cannot listen on 127.0.0.1:{port}: address already "
        "in use (another process listens there)\n"
    )


@pytest.mark.usefixtures("clean_environ")
def test_serve_binds_hypercorns_http_socket_itself(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[str, bool, int]] = []

    def exec_(command: list[str], env: dict[str, str]) -> None:
        # What hypercorn would inherit across the exec.
        fd = int(command[command.index("--bind") + 1].removeprefix("fd://"))
        with socket.socket(fileno=os.dup(fd)) as inherited:
            reuse = inherited.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT)
            seen.append((inherited.getsockname()[0], os.get_inheritable(fd), reuse))

    monkeypatch.setattr(cli, "_exec", exec_)
    argv = ["serve", f"--model-repository={repo}", "--http-address=127.0.0.1", "--http-port=0"]
    cli.main([*argv, "--grpc-port=0", "--metrics-port=0", "--workers=0", "--asgi-server=hypercorn"])
    assert seen == [("127.0.0.1", True, 0)]
