"""Compressed infer bodies, as Triton's HTTP front end takes and gives them.

A request body may come `Content-Encoding: gzip` or `deflate` (tritonclient's
`request_compression_algorithm`): it is inflated before anything reads it, and what it inflates
to is held to the same `--http-max-input-size` as a plain body. Either name reads gzip's and
zlib's formats alike (zlib detects which), and whatever follows the compressed stream is
ignored, as Triton does. `identity`, or no header, is a plain body; any other coding is
refused 501, "Unsupported compression type", with `Accept-Encoding: gzip, deflate` saying what
is supported (Triton's answer, word for word).

An infer response is compressed when the request's `Accept-Encoding` asks for gzip or deflate
(tritonclient's `response_compression_algorithm`), chosen as Triton chooses: of `identity`,
`deflate` and `gzip`, the one with the highest `q` (1 where none is given), the first listed on
a tie; names are matched exactly. `Inference-Header-Content-Length` still gives the JSON's
length before compression, as Triton's does. Only infer bodies are compressed, both ways.
"""

from __future__ import annotations

import re
import zlib

from tritonactor.core.errors import ErrorCode, TritonError, invalid_arg
from tritonactor.core.inflate import EITHER_FORMAT, Inflated, TooLarge, Truncated, inflate
from tritonactor.core.offload import off_loop

IDENTITY = "identity"
GZIP = "gzip"
DEFLATE = "deflate"

# What deflating a byte costs, in offload.py's bytes copied (core/inflate.py, the other way).
_DEFLATE_WORK = 16
_WEIGHT = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)")


class UnsupportedEncoding(TritonError):
    """A request body in a coding the server does not read: 501, with the codings it does."""

    headers = ((b"accept-encoding", b"gzip, deflate"),)

    def __init__(self) -> None:
        super().__init__(ErrorCode.UNSUPPORTED, "Unsupported compression type")


async def inflated(body: bytes, coding: str, max_size: int) -> bytes:
    """`body` as it was before `Content-Encoding: coding` compressed it (itself for
    `identity`), at most `max_size` bytes of it. Raises UnsupportedEncoding for a coding other
    than gzip, deflate or identity, and INVALID_ARG for data that does not inflate or that
    inflates past `max_size`."""
    if coding == IDENTITY:
        return body
    if coding != GZIP and coding != DEFLATE:
        raise UnsupportedEncoding()
    return await _inflate(body, max_size)


async def _inflate(body: bytes, max_size: int) -> bytes:
    if not body:
        raise invalid_arg("nothing to be decompressed")  # (Triton's words)
    try:
        return await inflate(body, EITHER_FORMAT, max_size)
    except TooLarge:
        raise _too_large(max_size) from None
    except Truncated:
        raise invalid_arg(
            "failed to decompress the request body: it ends before its data"
        ) from None
    except Inflated as error:
        raise invalid_arg(f"failed to decompress the request body: {error}") from None


def _too_large(limit: int) -> TritonError:
    return invalid_arg(
        f"Decompressed data size exceeds the maximum allowed value of {limit} bytes. Use "
        "--http-max-input-size to increase the limit."
    )


def response_coding(accept_encoding: str) -> str:
    """The coding of an infer response to a request with this `Accept-Encoding`: gzip,
    deflate or identity (see the module's docstring)."""
    chosen = IDENTITY
    best = 0.0
    for entry in accept_encoding.split(","):
        name, _, weight_text = entry.lstrip(" ").partition(";q=")
        if not name:
            continue
        weight = 1.0
        if weight_text:
            found = _WEIGHT.match(weight_text)
            if found is None:
                continue
            weight = float(found.group(1))
        if name in (IDENTITY, DEFLATE, GZIP) and weight > best:
            chosen, best = name, weight
    return chosen


async def deflated(pieces: tuple[bytes, ...], coding: str) -> bytes:
    """The response body `pieces` compressed for `coding` (gzip or deflate: zlib's format, as
    HTTP's `deflate` means), at zlib's default level."""
    size = sum(map(len, pieces))
    return await off_loop(lambda: _deflate(pieces, coding), size * _DEFLATE_WORK)


def _deflate(pieces: tuple[bytes, ...], coding: str) -> bytes:
    window = zlib.MAX_WBITS | 16 if coding == GZIP else zlib.MAX_WBITS
    deflater = zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION, zlib.DEFLATED, window)
    out = [deflater.compress(piece) for piece in pieces]
    out.append(deflater.flush())
    return b"".join(out)
