"""Compressed infer bodies (frontends/http/compression.py): which coding an `Accept-Encoding`
picks (each case as Triton 2.51 answered it, checked with requests against its HTTP front end),
and request bodies inflated within the input limit."""

from __future__ import annotations

import gzip
import zlib

import anyio
import pytest

from tritonactor.core.errors import ErrorCode, TritonError
from tritonactor.frontends.http.compression import (
    UnsupportedEncoding,
    deflated,
    inflated,
    response_coding,
)

BODY = b'{"inputs":[{"name":"INPUT0","shape":[1,16],"datatype":"FP32","data":[1.0]}]}' * 20


@pytest.mark.parametrize(
    ("accept", "coding"),
    [
        ("gzip", "gzip"),
        ("deflate", "deflate"),
        ("gzip, deflate", "gzip"),  # a tie: the first listed
        ("deflate, gzip", "deflate"),
        ("deflate;q=0.5, gzip", "gzip"),
        ("identity, gzip", "identity"),
        ("gzip;q=0", "identity"),
        ("br", "identity"),
        ("*", "identity"),
        ("GZIP", "identity"),  # names are matched exactly
        ("gzip ;q=0.5", "identity"),  # "gzip " is not a name
        ("gzip;q=abc, deflate", "deflate"),  # a weight that does not parse drops its entry
        ("  gzip;q=0.8,deflate;q=0.9", "deflate"),
        ("gzip;q=1.5e-1, identity;q=0.1", "gzip"),
        (";q=1, deflate", "deflate"),
        ("", "identity"),
    ],
)
def test_the_response_coding_is_tritons_choice(accept: str, coding: str) -> None:
    assert response_coding(accept) == coding


def _inflated(body: bytes, coding: str, max_size: int = 1 << 20) -> bytes:
    return anyio.run(inflated, body, coding, max_size)


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
@pytest.mark.parametrize("compress", [gzip.compress, zlib.compress])
def test_either_name_inflates_either_format(coding: str, compress: object) -> None:
    assert callable(compress)
    assert _inflated(compress(BODY), coding) == BODY


def test_identity_is_the_body_itself() -> None:
    assert _inflated(BODY, "identity") is BODY


def test_what_follows_the_compressed_stream_is_ignored() -> None:
    assert _inflated(gzip.compress(BODY) + b"trailing", "gzip") == BODY
    assert _inflated(gzip.compress(BODY) + gzip.compress(b"second"), "gzip") == BODY


@pytest.mark.parametrize("coding", ["br", "GZIP", "", "gzip, identity", "compress"])
def test_other_codings_are_unsupported(coding: str) -> None:
    with pytest.raises(UnsupportedEncoding) as raised:
        _inflated(BODY, coding)
    assert raised.value.code is ErrorCode.UNSUPPORTED
    assert raised.value.message == "Unsupported compression type"
    assert raised.value.headers == ((b"accept-encoding", b"gzip, deflate"),)


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"\x1f\x8b not gzip at all", "unknown compression method"),
        (b"plain text", "incorrect header check"),
        (gzip.compress(BODY)[:30], "it ends before its data"),
    ],
)
def test_data_that_does_not_inflate_is_refused(body: bytes, words: str) -> None:
    with pytest.raises(TritonError) as raised:
        _inflated(body, "gzip")
    assert raised.value.code is ErrorCode.INVALID_ARG
    assert raised.value.message.startswith("failed to decompress the request body: ")
    assert words in raised.value.message


def test_an_empty_compressed_body_is_refused_in_tritons_words() -> None:
    with pytest.raises(TritonError) as raised:
        _inflated(b"", "gzip")
    assert (raised.value.code, raised.value.message) == (
        ErrorCode.INVALID_ARG,
        "nothing to be decompressed",
    )


def test_a_body_inflates_up_to_the_limit_and_not_past_it() -> None:
    big = bytes(3 << 20)  # several of the inflater's pieces
    compressed = gzip.compress(big)
    assert _inflated(compressed, "gzip", len(big)) == big
    with pytest.raises(TritonError) as raised:
        _inflated(compressed, "gzip", len(big) - 1)
    assert raised.value.code is ErrorCode.INVALID_ARG
    assert raised.value.message == (
        f"Decompressed data size exceeds the maximum allowed value of {len(big) - 1} bytes. "
        "Use --http-max-input-size to increase the limit."
    )


@pytest.mark.parametrize(
    ("coding", "decompress"), [("gzip", gzip.decompress), ("deflate", zlib.decompress)]
)
def test_a_response_deflates_as_its_coding_says(coding: str, decompress: object) -> None:
    assert callable(decompress)
    pieces = (b'{"outputs":[]}', bytes(range(256)) * 100)
    assert decompress(anyio.run(deflated, pieces, coding)) == b"".join(pieces)
