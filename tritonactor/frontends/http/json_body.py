"""The JSON of HTTP bodies: a request body parsed (INVALID_ARG when it does not parse or nests
too deep), a response body written. Numbers are read and written as Triton's parser and writer
take them, NaN and the infinities included (responses.py writes those in tensor data)."""

from __future__ import annotations

import json
import math
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
            document = json.loads(text.decode(), parse_float=_finite, parse_int=_integer)
            orjson.dumps(document)  # what orjson refuses besides (a lone surrogate, say)
        except (ValueError, orjson.JSONEncodeError):  # json's and UTF-8's errors are too
            pass
        else:
            return document
    raise invalid_arg(f"failed to parse the request JSON buffer: {error}") from None


def _integer(text: str) -> int | float:
    """A JSON integer as orjson reads it: a float outside 64 bits (then finite, or an error)."""
    value = int(text)
    return value if -(1 << 63) <= value < 1 << 64 else _finite(text)


def _finite(text: str) -> float:
    """A JSON number as Python's json reads it, but one too large for a float (1e999) is an
    error, as orjson and Triton's parser have it; NaN and the infinities come only as words."""
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"number out of range: {text}")
    return value


def encode_json(obj: Any) -> bytes:
    """Serialize a response body; numpy arrays of numbers and bools are written natively."""
    try:
        return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY)
    except orjson.JSONEncodeError as exc:
        raise internal(f"failed to serialize the response JSON: {exc}") from None
