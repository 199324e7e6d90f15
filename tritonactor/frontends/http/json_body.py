"""The JSON of HTTP bodies: a request body parsed (INVALID_ARG when it does not parse or nests
too deep), a response body written. Numbers are read and written as Triton's parser and writer
take them, NaN and the infinities included (responses.py writes those in tensor data)."""

from __future__ import annotations

import json
from typing import Any

import orjson

from tritonactor.core.errors import internal, invalid_arg
from tritonactor.frontends.http.limits import DEFAULT_JSON_DEPTH, check_json_depth


def decode_json(
    body: bytes | bytearray | memoryview | str, max_depth: int = DEFAULT_JSON_DEPTH
) -> Any:
    """Parse a JSON request body; malformed JSON, or JSON nested deeper than `max_depth`, is
    the client's error (INVALID_ARG)."""
    check_json_depth(body, max_depth)
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        error = exc
    # Triton's parser takes NaN, Infinity and -Infinity for numbers, as Python's does; orjson
    # refuses them, so a body that may hold one is read again that way.
    text = bytes(body) if not isinstance(body, str) else body.encode()
    if b"NaN" in text or b"Infinity" in text:
        try:
            return json.loads(text.decode())
        except ValueError:  # UnicodeDecodeError and json's JSONDecodeError alike
            pass
    raise invalid_arg(f"failed to parse the request JSON buffer: {error}") from None


def encode_json(obj: Any) -> bytes:
    """Serialize a response body; numpy arrays of numbers and bools are written natively."""
    try:
        return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY)
    except orjson.JSONEncodeError as exc:
        raise internal(f"failed to serialize the response JSON: {exc}") from None
