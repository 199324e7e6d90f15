"""TLS on the HTTP and gRPC listeners (docs/tls.md), with real TLS clients (tritonclient's
HTTP and gRPC clients, httpx): server TLS and mutual TLS, under `tritonactor serve` with uvicorn
(one process) and with hypercorn (front ends in front of an engine), and a plain hypercorn whose
gRPC settings come from the environment. A client that speaks plain text to a TLS port, or shows
no (or an untrusted) certificate under mutual TLS, is refused."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import trustme
from tritonclient.utils import InferenceServerException

from tests.e2e.test_ports_e2e import Started, launch, stop

pytestmark = pytest.mark.e2e

KINDS = ("serve-uvicorn-1", "serve-hypercorn-2")


@dataclass(frozen=True)
class Pki:
    """A CA, the server's certificate from it, a client's from it, and a client's from a CA
    the server does not trust; PEM files."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    stranger_cert: Path
    stranger_key: Path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    root = tmp_path_factory.mktemp("pki")
    ca, stranger_ca = trustme.CA(), trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("client@example.com")
    stranger = stranger_ca.issue_cert("stranger@example.com")
    ca.cert_pem.write_to_path(str(root / "ca.pem"))
    server.cert_chain_pems[0].write_to_path(str(root / "server.pem"))
    server.private_key_pem.write_to_path(str(root / "server.key"))
    client.cert_chain_pems[0].write_to_path(str(root / "client.pem"))
    client.private_key_pem.write_to_path(str(root / "client.key"))
    stranger.cert_chain_pems[0].write_to_path(str(root / "stranger.pem"))
    stranger.private_key_pem.write_to_path(str(root / "stranger.key"))
    return Pki(
        root / "ca.pem",
        root / "server.pem",
        root / "server.key",
        root / "client.pem",
        root / "client.key",
        root / "stranger.pem",
        root / "stranger.key",
    )


def tls_flags(pki: Pki, mutual: bool) -> tuple[str, ...]:
    flags = []
    for protocol in ("http", "grpc"):
        flags.append(f"--{protocol}-use-ssl{'-mutual' if mutual else ''}=true")
        flags.append(f"--{protocol}-server-cert={pki.server_cert}")
        flags.append(f"--{protocol}-server-key={pki.server_key}")
        if mutual:
            flags.append(f"--{protocol}-root-cert={pki.ca}")
    return tuple(flags)


def client_context(pki: Pki, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca))
    if cert is not None:
        context.load_cert_chain(str(cert), str(key))
    return context


def served(kind: str, root: Path, pki: Pki, mutual: bool) -> Started:
    started = launch(kind, root, flags=tls_flags(pki, mutual))
    started.scheme = "https"
    cert = (pki.client_cert, pki.client_key) if mutual else (None, None)
    started.wait_ready(verify=client_context(pki, *cert))
    return started


@pytest.fixture(params=KINDS)
def server_tls(request: pytest.FixtureRequest, tmp_path: Path, pki: Pki) -> Iterator[Started]:
    started = served(request.param, tmp_path, pki, mutual=False)
    try:
        yield started
    finally:
        stop(started)


@pytest.fixture(params=KINDS)
def mutual_tls(request: pytest.FixtureRequest, tmp_path: Path, pki: Pki) -> Iterator[Started]:
    started = served(request.param, tmp_path, pki, mutual=True)
    try:
        yield started
    finally:
        stop(started)


DATA = np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32)


def http_infer(client: httpclient.InferenceServerClient) -> np.ndarray:
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = httpclient.InferInput(name, [4], "FP32")
        tensor.set_data_from_numpy(DATA)
        inputs.append(tensor)
    return client.infer("add_sub", inputs).as_numpy("OUTPUT0")


def grpc_infer(client: grpcclient.InferenceServerClient) -> np.ndarray:
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = grpcclient.InferInput(name, [4], "FP32")
        tensor.set_data_from_numpy(DATA)
        inputs.append(tensor)
    return client.infer("add_sub", inputs).as_numpy("OUTPUT0")


def test_tls_clients_are_served_on_both_listeners(server_tls: Started, pki: Pki) -> None:
    http = httpclient.InferenceServerClient(
        server_tls.url, ssl=True, ssl_options={"ca_certs": str(pki.ca)}
    )
    assert http.is_server_ready()
    np.testing.assert_array_equal(http_infer(http), DATA * 2)
    http.close()
    grpc = grpcclient.InferenceServerClient(
        server_tls.grpc_url, ssl=True, root_certificates=str(pki.ca)
    )
    assert grpc.is_server_ready()
    np.testing.assert_array_equal(grpc_infer(grpc), DATA * 2)
    grpc.close()
    answer = httpx.get(f"{server_tls.base}/v2", verify=client_context(pki), timeout=10)
    assert answer.status_code == 200 and answer.json()["name"] == "triton"
    assert "(TLS)" in server_tls.log()
    # The metrics listener stays plain HTTP, as Triton's (docs/tls.md).
    metrics = httpx.get(f"http://127.0.0.1:{server_tls.ports['metrics']}/metrics", timeout=10)
    assert metrics.status_code == 200


def test_plain_text_clients_are_refused_on_the_tls_ports(server_tls: Started) -> None:
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://{server_tls.url}/v2/health/live", timeout=10)
    grpc = grpcclient.InferenceServerClient(server_tls.grpc_url)
    with pytest.raises(InferenceServerException) as refused:
        grpc.is_server_live(client_timeout=10)
    assert refused.value.status() in ("StatusCode.UNAVAILABLE", "StatusCode.DEADLINE_EXCEEDED")
    grpc.close()


def test_a_client_that_does_not_trust_the_server_refuses_it(
    server_tls: Started, tmp_path: Path
) -> None:
    other = trustme.CA()
    other.cert_pem.write_to_path(str(tmp_path / "other.pem"))
    with pytest.raises(httpx.ConnectError):
        httpx.get(
            f"{server_tls.base}/v2/health/live",
            verify=ssl.create_default_context(cafile=str(tmp_path / "other.pem")),
            timeout=10,
        )
    grpc = grpcclient.InferenceServerClient(
        server_tls.grpc_url, ssl=True, root_certificates=str(tmp_path / "other.pem")
    )
    with pytest.raises(InferenceServerException):
        grpc.is_server_live(client_timeout=10)
    grpc.close()


def test_mutual_tls_serves_a_client_with_a_trusted_certificate(
    mutual_tls: Started, pki: Pki
) -> None:
    http = httpclient.InferenceServerClient(
        mutual_tls.url,
        ssl=True,
        ssl_options={
            "ca_certs": str(pki.ca),
            "certfile": str(pki.client_cert),
            "keyfile": str(pki.client_key),
        },
    )
    np.testing.assert_array_equal(http_infer(http), DATA * 2)
    http.close()
    grpc = grpcclient.InferenceServerClient(
        mutual_tls.grpc_url,
        ssl=True,
        root_certificates=str(pki.ca),
        private_key=str(pki.client_key),
        certificate_chain=str(pki.client_cert),
    )
    np.testing.assert_array_equal(grpc_infer(grpc), DATA * 2)
    grpc.close()
    assert "(TLS, client certificates required)" in mutual_tls.log()


@pytest.mark.parametrize("certificate", ["none", "untrusted"])
def test_mutual_tls_refuses_a_client_without_a_trusted_certificate(
    mutual_tls: Started, pki: Pki, certificate: str
) -> None:
    cert = (pki.stranger_cert, pki.stranger_key) if certificate == "untrusted" else (None, None)
    with pytest.raises(httpx.HTTPError):
        httpx.get(
            f"{mutual_tls.base}/v2/health/live", verify=client_context(pki, *cert), timeout=10
        )
    options = {}
    if certificate == "untrusted":
        options = {
            "private_key": str(pki.stranger_key),
            "certificate_chain": str(pki.stranger_cert),
        }
    grpc = grpcclient.InferenceServerClient(
        mutual_tls.grpc_url, ssl=True, root_certificates=str(pki.ca), **options
    )
    with pytest.raises(InferenceServerException):
        grpc.is_server_live(client_timeout=10)
    grpc.close()
    # Refused at the handshake: no request reached the server's statistics or models.
    ok = httpx.get(
        f"{mutual_tls.base}/v2/health/live",
        verify=client_context(pki, pki.client_cert, pki.client_key),
        timeout=10,
    )
    assert ok.status_code == 200


def test_plain_hypercorn_takes_the_grpc_tls_settings_from_the_environment(
    tmp_path: Path, pki: Pki
) -> None:
    # HTTP TLS is hypercorn's own flags here; gRPC's is the TRITONACTOR_GRPC_* settings.
    started = launch(
        "hypercorn-2",
        tmp_path,
        env={
            "TRITONACTOR_GRPC_USE_SSL_MUTUAL": "true",
            "TRITONACTOR_GRPC_SERVER_CERT": str(pki.server_cert),
            "TRITONACTOR_GRPC_SERVER_KEY": str(pki.server_key),
            "TRITONACTOR_GRPC_ROOT_CERT": str(pki.ca),
        },
        hypercorn_flags=("--certfile", str(pki.server_cert), "--keyfile", str(pki.server_key)),
    )
    started.scheme = "https"
    try:
        started.wait_ready(verify=client_context(pki))
        grpc = grpcclient.InferenceServerClient(
            started.grpc_url,
            ssl=True,
            root_certificates=str(pki.ca),
            private_key=str(pki.client_key),
            certificate_chain=str(pki.client_cert),
        )
        np.testing.assert_array_equal(grpc_infer(grpc), DATA * 2)
        grpc.close()
        anonymous = grpcclient.InferenceServerClient(
            started.grpc_url, ssl=True, root_certificates=str(pki.ca)
        )
        with pytest.raises(InferenceServerException):
            anonymous.is_server_live(client_timeout=10)
        anonymous.close()
    finally:
        stop(started)


def test_grpc_tls_without_its_files_stops_a_plain_hypercorn_naming_them(tmp_path: Path) -> None:
    started = launch("hypercorn-1", tmp_path, env={"TRITONACTOR_GRPC_USE_SSL": "true"})
    started.wait_exit()
    assert (
        "TRITONACTOR_GRPC_USE_SSL=true needs TRITONACTOR_GRPC_SERVER_CERT and "
        "TRITONACTOR_GRPC_SERVER_KEY" in started.log()
    ), started.log()


def http_mutual_env(pki: Pki) -> dict[str, str]:
    return {
        "TRITONACTOR_HTTP_USE_SSL_MUTUAL": "true",
        "TRITONACTOR_HTTP_SERVER_CERT": str(pki.server_cert),
        "TRITONACTOR_HTTP_SERVER_KEY": str(pki.server_key),
        "TRITONACTOR_HTTP_ROOT_CERT": str(pki.ca),
    }


@pytest.mark.parametrize("kind", ["hypercorn-1", "hypercorn-2"])
def test_http_mutual_tls_stops_a_plain_hypercorn_that_would_not_ask_for_certificates(
    kind: str, tmp_path: Path, pki: Pki
) -> None:
    # Only a certificate and key on hypercorn's command line: it would serve TLS to anyone.
    started = launch(
        kind,
        tmp_path,
        env=http_mutual_env(pki),
        hypercorn_flags=("--certfile", str(pki.server_cert), "--keyfile", str(pki.server_key)),
    )
    started.wait_exit()
    log = started.log()
    assert "TRITONACTOR_HTTP_USE_SSL_MUTUAL=true, but this ASGI server" in log, log
    assert "--ca-certs" in log and "--verify-mode CERT_REQUIRED (otherwise" in log, log


def test_http_mutual_tls_under_a_plain_hypercorn_given_its_flags_refuses_anonymous_clients(
    tmp_path: Path, pki: Pki
) -> None:
    flags = ("--certfile", str(pki.server_cert), "--keyfile", str(pki.server_key))
    flags += ("--ca-certs", str(pki.ca), "--verify-mode", "CERT_REQUIRED")
    started = launch("hypercorn-2", tmp_path, env=http_mutual_env(pki), hypercorn_flags=flags)
    started.scheme = "https"
    try:
        started.wait_ready(verify=client_context(pki, pki.client_cert, pki.client_key))
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"{started.base}/v2/health/live", verify=client_context(pki), timeout=10)
    finally:
        stop(started)
