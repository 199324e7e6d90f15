"""Header blocks decoded or encoded from the cache (frontends/grpc/hpack_cache.py) are what
hpack itself makes of them, whatever the order of blocks, repeats and table changes."""

from __future__ import annotations

from typing import Any

import pytest
from hpack import Decoder, Encoder, HeaderTuple, NeverIndexedHeaderTuple
from hpack.exceptions import HPACKDecodingError, OversizedHeaderListError
from hypothesis import given, settings
from hypothesis import strategies as st

from tritonactor.frontends.grpc import hpack_cache
from tritonactor.frontends.grpc.hpack_cache import (
    KEPT,
    KEPT_BYTES,
    _CachedDecoder,
    _CachedEncoder,
    cache_header_blocks,
)

NAMES = ["content-type", "te", "grpc-timeout", "x-a", "x-bb", ":path", "user-agent", ":method"]
VALUES = ["application/grpc", "trailers", "1S", "", "v", "w" * 40, "/", "POST", "grpc-c++/1.67"]
header = st.tuples(st.sampled_from(NAMES), st.sampled_from(VALUES))
# A few lists that come back often, as a connection's answers repeat theirs.
POOL = [[(":status", "200"), ("content-type", "application/grpc")], [("x-a", "v")]]
# A header list, a table size to set before it (None: unchanged), the form of its headers,
# whether it is passed as the same tuple each time it comes (see `passed`), and the Huffman
# flag.
step = st.tuples(
    st.one_of(st.lists(header, min_size=1, max_size=6), st.sampled_from(POOL)),
    st.one_of(st.none(), st.sampled_from([0, 64, 256, 4096])),
    st.sampled_from(["tuples", "bytes", "header tuples", "never indexed", "sensitive"]),
    st.booleans(),
    st.booleans(),
)


def pair() -> tuple[Decoder, Encoder]:
    decoder, encoder = Decoder(), Encoder()
    assert cache_header_blocks(decoder, encoder)
    return decoder, encoder


def shaped(headers: list[tuple[str, str]], form: str) -> list[Any]:
    if form == "bytes":
        return [(n.encode(), v.encode()) for n, v in headers]
    if form == "header tuples":
        return [HeaderTuple(n, v) for n, v in headers]
    if form == "never indexed":
        return [NeverIndexedHeaderTuple(n, v) if n == "x-a" else (n, v) for n, v in headers]
    if form == "sensitive":
        return [(n, v, n == "x-bb") for n, v in headers]
    return list(headers)


def passed(
    same: dict[Any, tuple[Any, ...]], headers: list[tuple[str, str]], form: str, as_same: bool
) -> Any:
    """The headers as the cached encoder gets them: an iterator of a new list, or one tuple
    object for each list and form, passed again whenever they come again (as the direct
    answers pass their constant headers), which the encoder finds by its identity."""
    if not as_same:
        return iter(shaped(headers, form))
    return same.setdefault((form, tuple(headers)), tuple(shaped(headers, form)))


def table(coder: Decoder | Encoder) -> tuple[Any, ...]:
    return (coder.header_table.maxsize, tuple(coder.header_table.dynamic_entries))


@settings(max_examples=300, deadline=None)
@given(st.lists(step, min_size=1, max_size=30), st.integers(0, 4))
def test_encoding_and_decoding_from_the_cache_match_hpack(
    steps: list[tuple[list[tuple[str, str]], int | None, str, bool, bool]], repeat: int
) -> None:
    plain_encoder = Encoder()
    _, cached_encoder = pair()
    same: dict[Any, tuple[Any, ...]] = {}
    # Decoders in pairs, one hpack's own and one cached: the pair of raw=False, of raw=True.
    decoders = {raw: (Decoder(), pair()[0]) for raw in (False, True)}
    # Each list is sent `repeat` more times after its first, as a client repeats its calls.
    for headers, size, form, as_same, huffman in steps:
        if size is not None:
            for encoder in (plain_encoder, cached_encoder):
                encoder.header_table_size = size
        for _ in range(1 + repeat):
            block = plain_encoder.encode(shaped(headers, form), huffman)
            given = passed(same, headers, form, as_same)
            assert cached_encoder.encode(given, huffman) == block
            assert table(cached_encoder) == table(plain_encoder)
            for raw, (plain_decoder, cached_decoder) in decoders.items():
                plain = plain_decoder.decode(block, raw)
                cached = cached_decoder.decode(block, raw)
                assert cached == plain
                assert [type(h) for h in cached] == [type(h) for h in plain]
                assert table(cached_decoder) == table(plain_decoder)
                expected = [(n.encode(), v.encode()) for n, v in headers] if raw else headers
                assert cached == expected


def test_a_repeated_block_comes_from_the_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    decoder, encoder = pair()
    headers = [("content-type", "application/grpc"), ("x-a", "v")]
    decoder.decode(encoder.encode(headers))  # adds x-a to both tables: not kept
    repeat = encoder.encode(headers)  # references only
    assert encoder.encode(headers) == repeat  # kept, then taken
    assert decoder.decode(repeat) == headers  # kept

    def fails(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("hpack asked again")

    monkeypatch.setattr(Decoder, "decode", fails)
    monkeypatch.setattr(Encoder, "encode", fails)
    assert decoder.decode(repeat) == headers
    assert encoder.encode(headers) == repeat


def test_a_tuple_encoded_before_is_found_by_its_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    _, encoder = pair()
    plain = Encoder()
    headers = (("content-type", "application/grpc"), ("x-a", "v"))
    assert encoder.encode(headers) == plain.encode(headers)  # adds x-a: not kept
    repeat = plain.encode(headers)
    assert encoder.encode(headers) == repeat  # kept, by key and by identity
    assert encoder.encode(headers) == repeat

    def fails(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("looked at again")

    monkeypatch.setattr(hpack_cache, "_keyable", fails)
    monkeypatch.setattr(Encoder, "encode", fails)
    assert encoder.encode(headers) == repeat
    assert encoder.encode(headers, huffman=True) == repeat
    with pytest.raises(AssertionError, match="looked at again"):
        encoder.encode(tuple(headers[:1]))  # another tuple: not found by identity
    with pytest.raises(AssertionError, match="looked at again"):
        encoder.encode(headers, huffman=False)  # another flag
    monkeypatch.undo()
    encoder.header_table_size = 64  # the table changes: encoded again, as hpack does
    plain.header_table_size = 64
    assert encoder.encode(headers) == plain.encode(headers)
    assert encoder.encode(headers) == plain.encode(headers)


def test_a_table_made_smaller_is_not_read_from_the_cache() -> None:
    """Entries evicted by a smaller table, with no entry added since, must not be referred to:
    the table's generation counts its size changes too."""
    plain_encoder, plain_decoder = Encoder(), Decoder()
    cached_decoder, cached_encoder = pair()
    steps = [
        ([("x-a", "v")], None),
        ([("x-a", "v")], None),  # references only: kept
        ([(":method", "GET")], 0),  # the static table only, after x-a is evicted
        ([(":method", "GET")], 4096),
        ([("x-a", "v")], None),  # x-a must be sent again, as a literal
    ]
    for headers, size in steps:
        if size is not None:
            plain_encoder.header_table_size = size
            cached_encoder.header_table_size = size
        block = plain_encoder.encode(headers)
        assert cached_encoder.encode(headers) == block
        assert cached_decoder.decode(block) == plain_decoder.decode(block) == headers
        assert table(cached_decoder) == table(plain_decoder)


def test_raw_and_decoded_blocks_are_kept_apart() -> None:
    decoder, encoder = pair()
    block = encoder.encode([("x-a", "v")])
    assert decoder.decode(block, raw=False) == [("x-a", "v")]
    repeat = encoder.encode([("x-a", "v")])  # indexed now: the table is unchanged by it
    assert decoder.decode(repeat, raw=True) == [(b"x-a", b"v")]
    assert decoder.decode(repeat, raw=False) == [("x-a", "v")]
    assert decoder.decode(repeat, raw=True) == [(b"x-a", b"v")]


def test_a_kept_block_still_meets_the_decoders_limits() -> None:
    decoder, encoder = pair()
    encoder.encode([("x-a", "w" * 40)])
    repeat = encoder.encode([("x-a", "w" * 40)])
    decoder.decode(Encoder().encode([("x-a", "w" * 40)]))
    assert decoder.decode(repeat) == [("x-a", "w" * 40)]  # kept
    decoder.max_header_list_size = 10
    with pytest.raises(OversizedHeaderListError):
        decoder.decode(repeat)


def test_a_block_that_fails_to_decode_is_not_kept() -> None:
    decoder, _ = pair()
    bad = b"\xff\xff\xff\xff"  # an index far past the tables
    for _ in range(2):
        with pytest.raises(HPACKDecodingError):
            decoder.decode(bad)


def test_the_cache_is_bounded() -> None:
    decoder, encoder = pair()
    for i in range(3 * KEPT):
        encoder.encode([("x-a", "v")] * (i % 7 + 1))
    assert len(encoder._kept) <= KEPT  # type: ignore[attr-defined]
    reference = Encoder()
    for i in range(3 * KEPT):
        decoder.decode(reference.encode([(":path", f"/{i}")]))
        decoder.decode(b"\x82")  # `:method GET`, from the static table: kept
    assert len(decoder._kept) <= KEPT  # type: ignore[attr-defined]


def test_coders_not_as_expected_are_left_alone() -> None:
    class Other(Decoder):
        pass

    decoder, encoder = Other(), Encoder()
    assert not cache_header_blocks(decoder, encoder)
    assert type(decoder) is Other and type(encoder) is Encoder
    assert type(encoder.header_table).__name__ == "HeaderTable"
    decoder, encoder = pair()
    assert type(decoder) is _CachedDecoder and type(encoder) is _CachedEncoder


def test_a_large_block_is_not_kept() -> None:
    """A client cannot make a connection keep much: hpack alone keeps nothing."""
    decoder, _ = pair()
    reference = Encoder()
    # Never-indexed literals: blocks that leave the table as it was, so that size decides.
    large, small = (
        reference.encode([NeverIndexedHeaderTuple("x-a", value)], huffman=False)
        for value in ("w" * (2 * KEPT_BYTES), "v")
    )
    assert decoder.decode(large) == [("x-a", "w" * (2 * KEPT_BYTES))]
    assert decoder.decode(small) == [("x-a", "v")]
    kept = decoder._kept  # type: ignore[attr-defined]
    assert [key[0] for key in kept] == [small]


def test_headers_that_hpack_writes_by_their_str_are_not_kept() -> None:
    # 1 and True are equal keys that hpack writes as b"1" and b"True".
    _, encoder = pair()
    plain = Encoder()
    for headers in ([("x-a", 1)], [("x-a", True)], [("x-a", 1.0)], [("x-a", "1")]):
        assert encoder.encode(headers) == plain.encode(headers)


def test_a_block_handed_over_is_not_decoded_again() -> None:
    """The lane (lane.py) decodes a block h2 reads next: h2 gets what it decoded, and the
    table's changes are made once; any other block in its place ends the connection's coding."""
    encoder, decoder = Encoder(), Decoder()
    assert cache_header_blocks(decoder, Encoder())
    block = encoder.encode([("x-new", "value")])  # added to the table as it is decoded
    headers = list(decoder.decode(block, raw=True))
    size = len(decoder.header_table.dynamic_entries)
    decoder.hand_over(block, headers)
    assert list(decoder.decode(block, raw=True)) == headers
    assert len(decoder.header_table.dynamic_entries) == size  # not added twice
    again = encoder.encode([("x-new", "value")])  # a reference to the entry now
    assert list(decoder.decode(again, raw=True)) == headers
    decoder.hand_over(block, headers)
    with pytest.raises(HPACKDecodingError):
        decoder.decode(again, raw=True)
