"""Header blocks a connection decodes or encodes again, taken from a cache.

A gRPC client sends the same headers with every call, and after the first call HPACK gives
them as references into the connection's table: the same bytes each time, which h2's HPACK
decoder (Python) takes ~15 µs to read. The answer's headers and trailers are the same each
time too. A block decoded (or a header list encoded) while the connection's HPACK table stays
as it was is kept, keyed by the block (the header list) and by the table's generation: a count
of every change made to the table (an entry added, its size set), so that a kept result is
used only while the table holds exactly what it held then. A block that changes the table is
not kept. What else the result depends on is in the key too (the decoder's limits, the
encoder's Huffman flag); a block that fails to decode raises as before and is not kept. Only
what h2 hands over is kept: blocks of bytes up to KEPT_BYTES (a client cannot make a
connection hold much: hpack alone keeps nothing), header lists of str or bytes names and
values, a sensitive flag a bool; anything else is decoded or encoded as hpack does it. A
tuple of such headers encoded before is also found by its identity (while the table and the
flag are as they were), without a key made from it: the direct answers' constant headers and
trailers (direct.py).

A block the lane (lane.py) decoded for a call it leaves to h2 is handed over (`hand_over`):
h2's decode of it, which comes next, gives what the lane read, so that its changes to the
table are made once.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hpack import Decoder, Encoder, HeaderTuple
from hpack.exceptions import HPACKDecodingError
from hpack.table import HeaderTable

# Results kept per decoder or encoder (a connection's calls repeat a few blocks), and the
# largest block kept (a gRPC call's headers take ~100 bytes).
KEPT = 64
KEPT_BYTES = 4096
_BLOCK_TYPES = (bytes, bytearray, memoryview)
_TEXT_TYPES = (str, bytes)


def keep(kept: dict[Any, Any], key: Any, value: Any) -> None:
    """`value` kept under `key`, at most KEPT results a coder (all let go when full: a
    connection's calls repeat a few blocks, which come back at once)."""
    if len(kept) >= KEPT:
        kept.clear()
    kept[key] = value


class _CountedTable(HeaderTable):
    """An HPACK table that counts its changes."""

    generation = 0

    def add(self, name: bytes, value: bytes) -> None:
        self.generation += 1
        super().add(name, value)

    def _set_maxsize(self, newmax: int) -> None:
        self.generation += 1
        HeaderTable.maxsize.fset(self, newmax)  # type: ignore[attr-defined]

    maxsize = property(HeaderTable.maxsize.fget, _set_maxsize)  # type: ignore[assignment]


class _CachedDecoder(Decoder):
    header_table: _CountedTable
    _kept: dict[tuple[Any, ...], tuple[Any, ...]]
    _handed: tuple[bytes, tuple[Any, ...]] | None = None

    def hand_over(self, data: bytes, headers: Iterable[Any]) -> None:
        """`data` was decoded (`decode(data, raw=True)`) to `headers`, its changes to the table
        made: the next decode, which must be of `data` (the lane read a block h2 reads next,
        lane.py), gives them without decoding it again."""
        self._handed = (bytes(data), tuple(headers))

    def hand_back(self) -> None:
        """Forget a block handed over and not decoded since."""
        self._handed = None

    def decode(self, data: bytes, raw: bool = False) -> Iterable[HeaderTuple]:
        handed = self._handed
        if handed is not None:
            self._handed = None
            if raw is not True or bytes(data) != handed[0]:
                # decoding another block now would read it against a table that already
                # holds what the handed one added: the connection cannot go on
                raise HPACKDecodingError("a header block out of its order")
            return list(handed[1])
        if type(data) not in _BLOCK_TYPES or type(raw) is not bool or len(data) > KEPT_BYTES:
            return super().decode(data, raw)
        generation = self.header_table.generation
        key = (
            bytes(data),
            raw,
            self.max_header_list_size,
            self.max_allowed_table_size,
            generation,
        )
        kept = self._kept.get(key)
        if kept is not None:
            return list(kept)
        headers = list(super().decode(data, raw))
        if self.header_table.generation == generation:
            keep(self._kept, key, tuple(headers))
        return headers


class _CachedEncoder(Encoder):
    header_table: _CountedTable
    _kept: dict[tuple[Any, ...], bytes]
    # A tuple of headers encoded before, by its identity: (the tuple, which keeps its id from
    # being reused; the Huffman flag; the table's generation; the block). The direct answers'
    # headers and trailers are constant tuples: found here without a key made from them.
    _same: dict[int, tuple[tuple[Any, ...], bool, int, bytes]]

    def encode(self, headers: Any, huffman: bool = True) -> bytes:
        table = self.header_table
        if type(headers) is tuple:
            same = self._same.get(id(headers))
            if (
                same is not None
                and same[0] is headers
                and same[1] is huffman
                and same[2] == table.generation
                and not table.resized
            ):
                return same[3]
        if table.resized or isinstance(headers, dict):
            return super().encode(headers, huffman)
        # (Listed first, as the key is made from it: hpack adds a header to its table as it
        # goes, so where the iterable fails part way it would have added those before.)
        listed = list(headers)
        if not all(_keyable(h) for h in listed) or type(huffman) is not bool:
            return super().encode(listed, huffman)
        generation = table.generation
        key = (tuple((type(h), tuple(h)) for h in listed), huffman, generation)
        encoded = self._kept.get(key)
        if encoded is None:
            encoded = super().encode(listed, huffman)
            if table.generation != generation or len(encoded) > KEPT_BYTES:
                return encoded
            keep(self._kept, key, encoded)
        if type(headers) is tuple:  # (its headers are keyable tuples: it cannot change)
            keep(self._same, id(headers), (headers, huffman, generation, encoded))
        return encoded


def _keyable(header: Any) -> bool:
    """Whether `header` is one that equal keys encode alike: hpack writes a value by its
    `str()` unless it is bytes, so 1 and True, or a bytes subclass, would not."""
    if not isinstance(header, tuple) or len(header) not in (2, 3):
        return False
    name, value = header[0], header[1]
    if type(name) not in _TEXT_TYPES or type(value) not in _TEXT_TYPES:
        return False
    return len(header) == 2 or type(header[2]) is bool


def cache_header_blocks(decoder: Decoder, encoder: Encoder) -> bool:
    """Make `decoder` and `encoder` (a connection's, before its first block) cached ones;
    False, with nothing changed, where hpack's classes are not the ones this expects."""
    for coder, kind in ((decoder, Decoder), (encoder, Encoder)):
        if type(coder) is not kind or type(getattr(coder, "header_table", None)) is not HeaderTable:
            return False
    for coder, cached in ((decoder, _CachedDecoder), (encoder, _CachedEncoder)):
        coder.header_table.__class__ = _CountedTable
        coder.__class__ = cached
        coder._kept = {}  # type: ignore[attr-defined]
    encoder._same = {}  # type: ignore[attr-defined]
    return True
