"""TLS settings and contexts (tritonactor/frontends/tls.py): Triton's `--grpc-use-ssl` family
and its HTTP twins, honoured; what is missing or unusable stops the start naming the variable."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import pytest
import trustme

from tritonactor.frontends.tls import (
    check_hand_started_http,
    check_tls,
    describe,
    server_context,
    tls_files,
)
from tritonactor.settings import OPTIONS, Settings, SettingsError
from tritonactor.settings.options import Support


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "repo"
    path.mkdir()
    return path


@pytest.fixture
def pem(tmp_path: Path) -> dict[str, Path]:
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1")
    client = ca.issue_cert("client@example.com")
    files = {
        "ca": tmp_path / "ca.pem",
        "cert": tmp_path / "server.pem",
        "key": tmp_path / "server.key",
        "client_cert": tmp_path / "client.pem",
        "client_key": tmp_path / "client.key",
        "other_key": tmp_path / "other.key",
    }
    ca.cert_pem.write_to_path(str(files["ca"]))
    server.cert_chain_pems[0].write_to_path(str(files["cert"]))
    server.private_key_pem.write_to_path(str(files["key"]))
    client.cert_chain_pems[0].write_to_path(str(files["client_cert"]))
    client.private_key_pem.write_to_path(str(files["client_key"]))
    trustme.CA().issue_cert("x").private_key_pem.write_to_path(str(files["other_key"]))
    return files


def settings(repo: Path, tmp_path: Path, **env: str) -> Settings:
    variables = {"TRITONACTOR_MODEL_REPOSITORY": str(repo), "HOME": str(tmp_path / "home")}
    variables |= {f"TRITONACTOR_{name.upper()}": value for name, value in env.items()}
    return Settings.from_env(variables)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_tls_settings_are_honoured_not_warned_about(protocol: str) -> None:
    for suffix in ("use_ssl", "use_ssl_mutual", "server_cert", "server_key", "root_cert"):
        assert OPTIONS[f"{protocol}_{suffix}"].support is Support.HONOURED
    assert OPTIONS[f"{protocol}_use_ssl"].flags_for(f"{protocol}_use_ssl") == (
        f"--{protocol}-use-ssl",
    )


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_plain_text_by_default(repo: Path, tmp_path: Path, protocol: str) -> None:
    given = settings(repo, tmp_path)
    assert tls_files(given, protocol) is None
    assert server_context(given, protocol) is None
    assert describe(None) == ""
    check_tls(given)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_server_tls_loads_the_certificate_and_key(
    repo: Path, tmp_path: Path, pem: dict[str, Path], protocol: str
) -> None:
    given = settings(
        repo,
        tmp_path,
        **{
            f"{protocol}_use_ssl": "true",
            f"{protocol}_server_cert": str(pem["cert"]),
            f"{protocol}_server_key": str(pem["key"]),
            # A root certificate without mutual TLS asks nothing of clients (as in Triton).
            f"{protocol}_root_cert": str(pem["ca"]),
        },
    )
    files = tls_files(given, protocol)
    assert files is not None and files.client_roots is None
    context = server_context(given, protocol)
    assert context is not None
    assert context.verify_mode == ssl.CERT_NONE
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert describe(context) == " (TLS)"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_mutual_tls_implies_tls_and_requires_client_certificates(
    repo: Path, tmp_path: Path, pem: dict[str, Path], protocol: str
) -> None:
    given = settings(
        repo,
        tmp_path,
        **{
            f"{protocol}_use_ssl_mutual": "true",
            f"{protocol}_server_cert": str(pem["cert"]),
            f"{protocol}_server_key": str(pem["key"]),
            f"{protocol}_root_cert": str(pem["ca"]),
        },
    )
    context = server_context(given, protocol)
    assert context is not None
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert describe(context) == " (TLS, client certificates required)"


def test_a_grpc_context_speaks_http2_with_a_client_that_asks_for_it(
    repo: Path, tmp_path: Path, pem: dict[str, Path]
) -> None:
    # grpc's C core refuses a server that does not select h2 by ALPN.
    given = settings(
        repo,
        tmp_path,
        grpc_use_ssl="true",
        grpc_server_cert=str(pem["cert"]),
        grpc_server_key=str(pem["key"]),
    )
    context = server_context(given, "grpc")
    assert context is not None

    async def handshake() -> str | None:
        server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0, ssl=context)
        port = server.sockets[0].getsockname()[1]
        client = ssl.create_default_context(cafile=str(pem["ca"]))
        client.set_alpn_protocols(["h2"])
        _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client)
        chosen = writer.get_extra_info("ssl_object").selected_alpn_protocol()
        writer.close()
        server.close()
        return chosen

    assert asyncio.run(handshake()) == "h2"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"grpc_use_ssl": "true"},
            "TRITONACTOR_GRPC_USE_SSL=true needs TRITONACTOR_GRPC_SERVER_CERT and "
            "TRITONACTOR_GRPC_SERVER_KEY: PEM files (gRPC TLS: the server's certificate and key)",
        ),
        (
            {"http_use_ssl": "true", "http_server_cert": "{cert}"},
            "TRITONACTOR_HTTP_USE_SSL=true needs TRITONACTOR_HTTP_SERVER_KEY",
        ),
        (
            {
                "grpc_use_ssl_mutual": "true",
                "grpc_server_cert": "{cert}",
                "grpc_server_key": "{key}",
            },
            "TRITONACTOR_GRPC_USE_SSL_MUTUAL=true needs TRITONACTOR_GRPC_ROOT_CERT",
        ),
        (
            {"grpc_use_ssl": "true", "grpc_server_cert": "{missing}", "grpc_server_key": "{key}"},
            "TRITONACTOR_GRPC_SERVER_CERT='{missing}' cannot be read: no such file or directory",
        ),
        (
            {"http_use_ssl": "true", "http_server_cert": "{ca_dir}", "http_server_key": "{key}"},
            "TRITONACTOR_HTTP_SERVER_CERT='{ca_dir}' cannot be read: is a directory",
        ),
        (
            {"grpc_use_ssl": "true", "grpc_server_cert": "{junk}", "grpc_server_key": "{key}"},
            "are not a PEM certificate and its private key",
        ),
        (
            {"grpc_use_ssl": "true", "grpc_server_cert": "{cert}", "grpc_server_key": "{other}"},
            "are not a PEM certificate and its private key: key values mismatch",
        ),
        (
            {
                "http_use_ssl_mutual": "true",
                "http_server_cert": "{cert}",
                "http_server_key": "{key}",
                "http_root_cert": "{junk}",
            },
            "TRITONACTOR_HTTP_ROOT_CERT='{junk}' holds no PEM certificate",
        ),
    ],
)
def test_unusable_tls_settings_stop_the_start_naming_the_variable(
    repo: Path, tmp_path: Path, pem: dict[str, Path], env: dict[str, str], message: str
) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    names = {
        "cert": pem["cert"],
        "key": pem["key"],
        "other": pem["other_key"],
        "missing": tmp_path / "missing.pem",
        "ca_dir": tmp_path,
        "junk": junk,
    }
    given = settings(repo, tmp_path, **{k: v.format(**names) for k, v in env.items()})
    with pytest.raises(SettingsError) as refused:
        check_tls(given)
    assert message.format(**names) in str(refused.value)
    assert refused.value.variable is not None and refused.value.variable.startswith("TRITONACTOR_")


@pytest.mark.parametrize(
    ("argv", "refused"),
    [
        (["hypercorn", "tritonactor.app:app"], True),
        (["hypercorn", "tritonactor.app:app", "--certfile", "s.pem", "--keyfile", "s.key"], False),
        (["hypercorn", "tritonactor.app:app", "--certfile=s.pem", "--keyfile=s.key"], False),
    ],
)
def test_http_tls_under_a_hand_started_hypercorn_needs_its_own_certificate(
    repo: Path, tmp_path: Path, pem: dict[str, Path], argv: list[str], refused: bool
) -> None:
    given = settings(
        repo,
        tmp_path,
        http_use_ssl="true",
        http_server_cert=str(pem["cert"]),
        http_server_key=str(pem["key"]),
    )
    if refused:
        with pytest.raises(SettingsError, match="TRITONACTOR_HTTP_USE_SSL=true, but this ASGI"):
            check_hand_started_http(given, argv)
    else:
        check_hand_started_http(given, argv)
    check_hand_started_http(settings(repo, tmp_path), argv[:2])  # plain text: nothing to give


MUTUAL_FLAGS = ["--certfile", "s.pem", "--keyfile", "s.key", "--ca-certs", "ca.pem"]


@pytest.mark.parametrize(
    ("argv", "lacking"),
    [
        (["--certfile", "s.pem", "--keyfile", "s.key"], "--ca-certs"),
        (["--certfile", "s.pem", "--keyfile", "s.key"], "--verify-mode CERT_REQUIRED"),
        (MUTUAL_FLAGS, "--verify-mode CERT_REQUIRED"),
        ([*MUTUAL_FLAGS, "--verify-mode", "CERT_OPTIONAL"], "--verify-mode CERT_REQUIRED"),
        ([*MUTUAL_FLAGS[:4], "--verify-mode", "CERT_REQUIRED"], "--ca-certs"),
        ([*MUTUAL_FLAGS, "--verify-mode=CERT_REQUIRED", "--insecure-bind", ":1"], "insecure"),
        ([*MUTUAL_FLAGS, "--verify-mode", "CERT_REQUIRED"], None),
        ([*MUTUAL_FLAGS, "--cert-reqs", "2"], None),
    ],
)
def test_mutual_tls_under_a_hand_started_hypercorn_needs_it_to_require_client_certificates(
    repo: Path, tmp_path: Path, pem: dict[str, Path], argv: list[str], lacking: str | None
) -> None:
    given = settings(
        repo,
        tmp_path,
        http_use_ssl_mutual="true",
        http_server_cert=str(pem["cert"]),
        http_server_key=str(pem["key"]),
        http_root_cert=str(pem["ca"]),
    )
    command = ["/venv/bin/hypercorn", "tritonactor.app:app", *argv]
    if lacking is None:
        check_hand_started_http(given, command)
        return
    with pytest.raises(SettingsError, match="TRITONACTOR_HTTP_USE_SSL_MUTUAL=true") as refused:
        check_hand_started_http(given, command)
    assert lacking in str(refused.value)


def test_an_encrypted_private_key_stops_the_start_rather_than_waiting_for_a_passphrase(
    repo: Path, tmp_path: Path, pem: dict[str, Path]
) -> None:
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(pem["key"].read_bytes(), password=None)
    encrypted = tmp_path / "encrypted.key"
    encrypted.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )
    for protocol in ("http", "grpc"):
        given = settings(
            repo,
            tmp_path,
            **{
                f"{protocol}_use_ssl": "true",
                f"{protocol}_server_cert": str(pem["cert"]),
                f"{protocol}_server_key": str(encrypted),
            },
        )
        # A prompt would block here (stdin is the test's): the error comes at once instead.
        with pytest.raises(SettingsError, match="the private key is encrypted") as refused:
            server_context(given, protocol)  # type: ignore[arg-type]
        assert refused.value.variable == f"TRITONACTOR_{protocol.upper()}_SERVER_KEY"
        assert str(encrypted) in str(refused.value)
