"""The OpenAPI description of the HTTP API, served at `GET /v2/openapi.json`.

Its one source is `docs/openapi.yaml`; the package carries it as JSON (`openapi.json` beside
this module), which the server sends as it is. After editing the YAML:

    python -m tritonactor.frontends.http.openapi --update    # rewrite the packaged JSON
    python -m tritonactor.frontends.http.openapi --check     # exit 1 when it is stale
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

PATH = "/v2/openapi.json"
PACKAGED = Path(__file__).with_name("openapi.json")
SOURCE = Path(__file__).resolve().parents[3] / "docs" / "openapi.yaml"


@functools.cache
def schema_bytes() -> bytes:
    """The packaged description, read once."""
    return PACKAGED.read_bytes()


async def serve_openapi(request: Request) -> Response:
    """`GET /v2/openapi.json`: the description of every route this server answers."""
    return Response(schema_bytes(), media_type="application/json")


def render(source: Path = SOURCE) -> str:
    """The packaged JSON for the YAML at `source` (needs PyYAML, a development dependency)."""
    import yaml  # only where the description is rebuilt, never in the server

    document: Any = yaml.safe_load(source.read_text())
    return json.dumps(document, indent=1, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--update", action="store_true", help="rewrite the packaged JSON")
    action.add_argument("--check", action="store_true", help="exit 1 when it is stale")
    parser.add_argument("--source", type=Path, default=SOURCE, help="the YAML description")
    args = parser.parse_args(argv)
    text = render(args.source)
    if args.update:
        PACKAGED.write_text(text)
        return 0
    if PACKAGED.read_text() != text:
        update = "python -m tritonactor.frontends.http.openapi --update"
        print(f"{PACKAGED} is stale: run {update}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
