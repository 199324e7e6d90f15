"""Compressed bytes inflated within a limit, in pieces, off the event loop when they are large:
what both front ends do with a compressed request (an HTTP body, a gRPC message), each telling
its failures in its own protocol's words."""

from __future__ import annotations

import zlib

from tritonactor.core.offload import off_loop

__all__ = ["EITHER_FORMAT", "GZIP", "ZLIB", "Inflated", "TooLarge", "Truncated", "inflate"]

# zlib's window bits: gzip's format, zlib's, and either (zlib detects which).
GZIP = zlib.MAX_WBITS | 16
ZLIB = zlib.MAX_WBITS
EITHER_FORMAT = zlib.MAX_WBITS | 32
# What inflating a byte may cost, in offload.py's bytes copied: zlib works a byte in about the
# time a copy takes ten, and a byte may inflate to up to 1032 (deflate's most): a few KiB crafted
# to inflate to the limit leave the event loop (each front end's limit may be GiBs).
_INFLATE_WORK = 1032
_CHUNK = 1 << 20


class Inflated(Exception):
    """Compressed bytes that could not be inflated (zlib's words)."""


class TooLarge(Inflated):
    """They inflate past the limit."""


class Truncated(Inflated):
    """They end before the compressed stream does."""


async def inflate(data: bytes | memoryview, window: int, max_size: int) -> bytes:
    """`data` inflated (`window`: GZIP, ZLIB or EITHER_FORMAT), at most `max_size` bytes, read in
    pieces so that no more than the limit is ever held; whatever follows the compressed stream
    is ignored. Raises TooLarge, Truncated, or Inflated with zlib's words."""
    return await off_loop(lambda: _inflate(data, window, max_size), len(data) * _INFLATE_WORK)


def _inflate(data: bytes | memoryview, window: int, max_size: int) -> bytes:
    inflater = zlib.decompressobj(window)
    pieces: list[bytes] = []
    size = 0
    try:
        while data and not inflater.eof:
            piece = inflater.decompress(data, _CHUNK)
            size += len(piece)
            if size > max_size:
                raise TooLarge()
            pieces.append(piece)
            data = inflater.unconsumed_tail
    except zlib.error as error:
        raise Inflated(str(error)) from None
    if not inflater.eof:
        raise Truncated()
    return b"".join(pieces)
