"""TLS for the HTTP and gRPC listeners, from the settings of Triton's `--grpc-use-ssl` family
and their HTTP twins (`--http-use-ssl`...): whether to use it, whether clients must show a
certificate (mutual), and the PEM files. One set of rules for both protocols; see docs/tls.md.

gRPC's context is built here and given to grpclib; HTTP's files are handed to the ASGI server
(`tritonactor serve` builds its command line from `TlsFiles`), which builds its own."""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tritonactor.frontends.hypercorn_command import hypercorn_config
from tritonactor.settings import VARIABLES, Settings, SettingsError

Protocol = Literal["http", "grpc"]
_NAMES: dict[Protocol, str] = {"http": "HTTP", "grpc": "gRPC"}


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """What one listener's TLS is made of: its certificate (chain) and key, and for mutual TLS
    the root certificate(s) a client's certificate must chain to (None: clients are not asked)."""

    certificate: Path
    key: Path
    client_roots: Path | None


def tls_files(settings: Settings, protocol: Protocol) -> TlsFiles | None:
    """The TLS files `protocol`'s settings name, None when it is served in plain text. Raises
    SettingsError naming the variable when TLS is asked for and a file is missing or
    unreadable (Triton 2.51 would start and fail to bind, with a misleading "already in use")."""
    mutual = bool(getattr(settings, f"{protocol}_use_ssl_mutual"))
    if not mutual and not getattr(settings, f"{protocol}_use_ssl"):
        return None
    switch = f"{protocol}_use_ssl_mutual" if mutual else f"{protocol}_use_ssl"
    needed = [f"{protocol}_server_cert", f"{protocol}_server_key"]
    if mutual:
        needed.append(f"{protocol}_root_cert")
    missing = [VARIABLES[name] for name in needed if getattr(settings, name) is None]
    if missing:
        roots = ", and the root certificate client certificates must chain to" if mutual else ""
        raise SettingsError(
            f"{VARIABLES[switch]}=true needs {' and '.join(missing)}: PEM files "
            f"({_NAMES[protocol]} TLS: the server's certificate and key{roots})",
            variable=VARIABLES[switch],
        )
    for name in needed:
        _readable(name, getattr(settings, name))
    certificate = getattr(settings, f"{protocol}_server_cert")
    key = getattr(settings, f"{protocol}_server_key")
    roots = getattr(settings, f"{protocol}_root_cert") if mutual else None
    return TlsFiles(certificate, key, roots)


def server_context(settings: Settings, protocol: Protocol) -> ssl.SSLContext | None:
    """The server-side TLS context for `protocol`'s listener, None for plain text. Raises
    SettingsError when a file is not what it should be (not PEM, a key that does not match)."""
    files = tls_files(settings, protocol)
    if files is None:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        # A key under a passphrase would have OpenSSL ask for it on the terminal, and the start
        # wait there: no passphrase is ever given, so asking for one fails at once.
        context.load_cert_chain(files.certificate, files.key, password=_no_passphrase)
    except _EncryptedKey:
        raise SettingsError(
            f"{VARIABLES[f'{protocol}_server_key']}={str(files.key)!r}: the private key is "
            "encrypted (a key under a passphrase is not supported: give its decrypted PEM)",
            variable=VARIABLES[f"{protocol}_server_key"],
        ) from None
    except (ssl.SSLError, OSError) as error:
        raise SettingsError(
            f"{VARIABLES[f'{protocol}_server_cert']}={str(files.certificate)!r} and "
            f"{VARIABLES[f'{protocol}_server_key']}={str(files.key)!r} are not a PEM "
            f"certificate and its private key: {_reason(error)}",
            variable=VARIABLES[f"{protocol}_server_cert"],
        ) from None
    if files.client_roots is not None:
        try:
            context.load_verify_locations(cafile=files.client_roots)
        except (ssl.SSLError, OSError) as error:
            raise SettingsError(
                f"{VARIABLES[f'{protocol}_root_cert']}={str(files.client_roots)!r} holds no "
                f"PEM certificate: {_reason(error)}",
                variable=VARIABLES[f"{protocol}_root_cert"],
            ) from None
        context.verify_mode = ssl.CERT_REQUIRED
    # HTTP/2 is negotiated by ALPN: gRPC clients (grpc's C core) refuse a server without it.
    context.set_alpn_protocols(["h2"] if protocol == "grpc" else ["h2", "http/1.1"])
    return context


def describe(context: ssl.SSLContext | None) -> str:
    """What the log says after a listener's address."""
    if context is None:
        return ""
    if context.verify_mode == ssl.CERT_REQUIRED:
        return " (TLS, client certificates required)"
    return " (TLS)"


def check_tls(settings: Settings) -> None:
    """Both listeners' TLS settings and files, checked as their contexts will load them; raises
    SettingsError. `tritonactor serve` calls it before anything starts."""
    for protocol in ("http", "grpc"):
        server_context(settings, protocol)


def check_hand_started_http(settings: Settings, argv: Sequence[str]) -> None:
    """For an ASGI server started by hand (`hypercorn tritonactor.app:app`), which binds HTTP
    itself: raise SettingsError when the HTTP TLS settings ask for more than its own command
    line gives (read as hypercorn reads it): TLS without a certificate and key, mutual TLS
    without the client roots and `--verify-mode CERT_REQUIRED`, or a plain-text
    `--insecure-bind` beside them. HTTP would otherwise be served in plain text, or to clients
    without a certificate, by a server meant to refuse them."""
    if tls_files(settings, "http") is None:
        return
    mutual = settings.http_use_ssl_mutual
    name = "http_use_ssl_mutual" if mutual else "http_use_ssl"
    config = hypercorn_config(argv)
    if config is None:
        missing = ["hypercorn's --certfile and --keyfile"] if _plain(argv) else []
    else:
        missing = _missing_tls(config, mutual)
    if not missing:
        return
    raise SettingsError(
        f"{VARIABLES[name]}=true, but this ASGI server binds HTTP itself and its command line "
        f"lacks {'; '.join(missing)}: give it its own TLS flags (hypercorn: --certfile, "
        "--keyfile, and for mutual TLS --ca-certs and --verify-mode CERT_REQUIRED), or start "
        "the server with `tritonactor serve`, which passes them (docs/tls.md)",
        variable=VARIABLES[name],
    )


def _missing_tls(config: Any, mutual: bool) -> list[str]:
    """What hypercorn's `config` lacks to serve HTTP as the settings ask."""
    if not config.ssl_enabled:
        return ["--certfile and --keyfile"]
    missing = []
    if config.insecure_bind:
        missing.append(f"no --insecure-bind (it serves plain text on {config.insecure_bind[0]})")
    if mutual:
        if config.ca_certs is None:
            missing.append("--ca-certs (the roots client certificates must chain to)")
        if config.verify_mode != ssl.CERT_REQUIRED:
            missing.append("--verify-mode CERT_REQUIRED (otherwise no client is asked)")
    return missing


def _plain(argv: Sequence[str]) -> bool:
    """Whether another ASGI server's command line (uvicorn: not a supported way to start the
    server) gives it no certificate."""
    return not any(argument.split("=", 1)[0] in _CERT_FLAGS for argument in argv)


# How an ASGI server other than hypercorn is given its certificate (uvicorn).
_CERT_FLAGS = frozenset({"--certfile", "--ssl-certfile"})


class _EncryptedKey(Exception):
    pass


def _no_passphrase() -> bytes:
    raise _EncryptedKey


def _readable(name: str, path: Path) -> None:
    try:
        with path.open("rb"):
            pass
    except OSError as error:
        reason = error.strerror.lower() if error.strerror else str(error)
        raise SettingsError(
            f"{VARIABLES[name]}={str(path)!r} cannot be read: {reason}", variable=VARIABLES[name]
        ) from None


def _reason(error: Exception) -> str:
    if isinstance(error, ssl.SSLError) and error.reason:
        return error.reason.lower().replace("_", " ")
    return str(error)
