"""How deep a JSON document nests, decided on its bytes before it is parsed: the one check both
front ends (every HTTP JSON body) and the control plane (a load's `config` string, from HTTP or
gRPC) apply, so that no JSON parser recurses past the limit (docs/limits.md)."""

from __future__ import annotations

import re

import numpy as np

from tritonactor.core.errors import invalid_arg

# Triton's default (its HTTP_MAX_JSON_NESTING_DEPTH).
DEFAULT_JSON_DEPTH = 100

# A JSON string, escapes included, or one left open to the end of the body. Possessive, so
# that a match never backtracks: a body of unclosed strings costs one pass, not one pass per
# quote (quadratic: 80 KB of them held the event loop for 20 s).
_STRING = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+(?:"|\\?\Z)', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEPS = np.zeros(256, dtype=np.int8)
_STEPS[list(b"[{")] = 1
_STEPS[list(b"]}")] = -1
_BLOCK = 1 << 20  # brackets counted at a time: the count's memory stays a few MiB


def check_json_depth(body: bytes | bytearray | memoryview | str, limit: int) -> None:
    """Refuse JSON nested deeper than `limit` arrays and objects (INVALID_ARG naming the
    limit), from its bytes and before it is parsed. Fewer brackets than the limit: nothing
    more to look at; otherwise strings are taken out and the brackets counted."""
    if isinstance(body, str):
        data = body.encode()
    elif isinstance(body, bytes):
        data = body
    else:
        data = bytes(body)
    if data.count(b"[") + data.count(b"{") <= limit:
        return
    brackets = np.frombuffer(_STRING.sub(b"", data).translate(None, _NOT_BRACKETS), np.uint8)
    depth = 0
    for start in range(0, len(brackets), _BLOCK):
        depths = np.cumsum(_STEPS[brackets[start : start + _BLOCK]], dtype=np.int32) + depth
        if int(depths.max()) > limit:
            raise invalid_arg(
                f"JSON nesting depth exceeds maximum allowed limit ({limit}). Use "
                "--http-max-json-depth to increase the limit."
            )
        depth = int(depths[-1])


__all__ = ["DEFAULT_JSON_DEPTH", "check_json_depth"]
