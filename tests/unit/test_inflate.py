"""Compressed bytes inflated within a limit (core/inflate.py), what both front ends use: in
pieces, and off the event loop when they are large (a compressed gRPC message was inflated on
the loop, which stalled every connection while it ran)."""

from __future__ import annotations

import gzip
import threading
import zlib

import pytest

import tritonactor.core.inflate as inflating
from tritonactor.core.inflate import (
    EITHER_FORMAT,
    GZIP,
    ZLIB,
    Inflated,
    TooLarge,
    Truncated,
    inflate,
)
from tritonactor.core.offload import OFF_LOOP_BYTES

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    ("window", "compress"),
    [(GZIP, gzip.compress), (ZLIB, zlib.compress), (EITHER_FORMAT, gzip.compress)],
)
async def test_data_inflates_to_what_was_compressed(window: int, compress: object) -> None:
    data = b"tritonactor" * 1000
    assert await inflate(compress(data) + b"trailing", window, len(data)) == data  # type: ignore[operator]


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (gzip.compress(b"x" * 101), TooLarge),
        (gzip.compress(b"x" * 100)[:-12], Truncated),
        (b"not compressed", Inflated),
    ],
)
async def test_data_that_cannot_be_read_within_the_limit_is_refused(
    data: bytes, error: type[Exception]
) -> None:
    with pytest.raises(error):
        await inflate(data, GZIP, 100)


async def test_large_data_inflates_on_a_worker_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    threads: list[int] = []
    original = inflating._inflate

    def recorded(data: bytes, window: int, max_size: int) -> bytes:
        threads.append(threading.get_ident())
        return original(data, window, max_size)

    monkeypatch.setattr(inflating, "_inflate", recorded)
    small = gzip.compress(b"x" * 10)
    # Few bytes that may inflate to many: a bomb of a few KiB inflates to MiBs (here: zeros).
    large = gzip.compress(bytes(OFF_LOOP_BYTES))
    assert len(large) < 4096
    await inflate(small, GZIP, 1 << 30)
    await inflate(large, GZIP, 1 << 30)
    assert threads[0] == threading.get_ident()  # on the loop: too small to leave it
    assert threads[1] != threading.get_ident()
