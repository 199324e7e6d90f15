"""The live server against its own OpenAPI description (docs/openapi.yaml, served at
GET /v2/openapi.json): schemathesis generates requests for every operation (the schema's
examples, its boundary values, then random and invalid ones, a bounded number of each) and
checks that no answer is a server error, that every status is documented, and that every body
matches the documented schema and content type."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from starlette.routing import Route

from tests.server_process import ServerProcess, start_server
from tritonactor.app import create_app
from tritonactor.frontends.http import openapi
from tritonactor.settings import Settings

pytestmark = pytest.mark.e2e

EXAMPLES = Path(__file__).resolve().parents[2] / "tritonactor" / "examples" / "models"

# The 5xx answers that are Triton 2.51's own for the same request (checked against a real
# tritonserver: same status, same message): compatibility keeps them. Anything else 5xx fails.
TRITON_5XX: list[tuple[str, str, int, re.Pattern[str]]] = [
    (
        "POST",
        "/v2/logging",
        501,
        re.compile(r"log file location can not be updated through network protocol"),
    ),
    # The trace file, as the log file: not changed over the network (UNSUPPORTED, 501).
    *(
        (
            "POST",
            path,
            501,
            re.compile(r"trace file location can not be updated through network protocol"),
        )
        for path in ("/v2/trace/setting", "/v2/models/{model}/trace/setting")
    ),
    (
        "POST",
        "/v2/repository/models/{model}/load",
        500,
        re.compile(r"failed to load '.*', failed to poll from model repository", re.S),
    ),
    # A load or unload through a named repository (seen on a real tritonserver too).
    *(
        (
            "POST",
            f"/v2/repository/{{repository}}/models/{{model}}/{action}",
            501,
            re.compile(r"^'repository_name' specification is not supported$"),
        )
        for action in ("load", "unload")
    ),
    (
        "POST",
        "/v2/systemsharedmemory/region/{region}/register",
        500,
        re.compile(r"Unable to open shared memory region: '.*'", re.S),
    ),
    # Triton's generate extension answers a body it cannot take as a JSON object with 500.
    *(
        (
            "POST",
            f"/v2/models/{{model}}{versioned}/{route}",
            500,
            re.compile(
                r"attempt to get members for non-object|failed to parse the request JSON buffer"
                r"|Unable to parse 'id'"
            ),
        )
        for versioned in ("", "/versions/{version}")
        for route in ("generate", "generate_stream")
    ),
]


def no_server_error(ctx: object, response: schemathesis.Response, case: schemathesis.Case) -> None:
    """No 5xx, other than Triton's own answers listed above."""
    status = response.status_code
    if status < 500:
        return
    try:
        message = json.loads(response.content).get("error", "")
    except (ValueError, AttributeError):
        message = ""
    for method, path, known, pattern in TRITON_5XX:
        if (case.method, case.path, status) == (method, path, known) and pattern.search(message):
            return
    raise AssertionError(f"server error {status}: {response.content[:500]!r}")


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The bundled example repository, in explicit mode so that load and unload are served."""
    server = start_server(
        [EXAMPLES],
        tmp_path_factory.mktemp("openapi"),
        {"TRITONACTOR_MODEL_CONTROL_MODE": "explicit", "TRITONACTOR_LOAD_MODEL": "*"},
    )
    yield server
    server.stop()


@pytest.fixture(scope="module")
def session() -> Iterator[requests.Session]:
    with requests.Session() as session:
        yield session


# The packaged description (the test below checks that the server serves this same file); the
# requests go to the live server's address.
schema = schemathesis.openapi.from_path(openapi.PACKAGED)


@schema.parametrize()
@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
)
def test_every_operation_conforms(
    case: schemathesis.Case, live: ServerProcess, session: requests.Session
) -> None:
    response = case.call(base_url=live.base, session=session, timeout=30)
    case.validate_response(
        response,
        checks=[
            no_server_error,
            status_code_conformance,
            content_type_conformance,
            response_schema_conformance,
        ],
    )


def test_served_description_is_the_packaged_one(live: ServerProcess) -> None:
    answer = httpx.get(f"{live.base}{openapi.PATH}")
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "application/json"
    assert answer.content == openapi.PACKAGED.read_bytes()
    assert answer.json()["openapi"].startswith("3.")


def test_description_names_every_route() -> None:
    """Every route the app serves is described, and nothing else is."""
    app = create_app(Settings(), workers=0)  # its routes, without starting it
    served = {
        (method, re.sub(r"\{(\w+)(:\w+)?\}", r"{\1}", route.path))
        for route in app.routes
        if isinstance(route, Route)
        for method in route.methods or ()
    }
    described = {
        (method.upper(), path)
        for path, item in json.loads(openapi.PACKAGED.read_bytes())["paths"].items()
        for method in item
        if method != "parameters"
    }
    assert served == described


def test_packaged_description_is_current() -> None:
    """The packaged JSON is docs/openapi.yaml's (`--update` after editing the YAML)."""
    check = subprocess.run(
        [sys.executable, "-m", "tritonactor.frontends.http.openapi", "--check"],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stderr


def test_description_is_metadata_when_restricted(tmp_path: Path) -> None:
    """Restricting the `metadata` category restricts the description with it (403 without the
    header, Triton's message), and leaves it readable with the header."""
    server = start_server(
        [EXAMPLES],
        tmp_path,
        {"TRITONACTOR_HTTP_RESTRICTED_API": "metadata:api-key=yes"},
    )
    try:
        refused = httpx.get(f"{server.base}{openapi.PATH}")
        assert refused.status_code == 403
        assert refused.json() == {"error": "This API is restricted, expecting header 'api-key'"}
        allowed = httpx.get(f"{server.base}{openapi.PATH}", headers={"api-key": "yes"})
        assert allowed.status_code == 200
        assert allowed.content == openapi.PACKAGED.read_bytes()
    finally:
        server.stop()
