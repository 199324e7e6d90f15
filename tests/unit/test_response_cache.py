"""The response cache in-process: the store's accounting (sizes measured on Triton 2.51's local
cache), its LRU order, entries as immutable copies, what the key tells apart, the configs Triton
refuses, and the settings that make one."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tritonactor._proto.inference import ModelResponseCache, ModelTransactionPolicy
from tritonactor.cache import (
    Inserted,
    ResponseCache,
    measure,
    pack,
    request_key,
    rough_work,
    unpack,
)
from tritonactor.cache.config import caches_responses, check_model_config
from tritonactor.cache.store import ENTRY_OVERHEAD, MIN_SIZE, SEGMENT_OVERHEAD, charge, cost
from tritonactor.config.model_config import ConfigError, parse_pbtxt
from tritonactor.core import offload
from tritonactor.core.types import InferenceRequest, InferenceResponse, RequestedOutput, Tensor
from tritonactor.settings import Settings, SettingsError
from tritonactor.settings.model import LOCAL_CACHE_MIN_SIZE


def fp32_response(n: int, seed: float = 1.0) -> InferenceResponse:
    """Like the probe model on Triton: OUTPUT0 and OUTPUT1 FP32 [n], CALLS INT64 [1]."""
    a = np.full(n, seed, dtype=np.float32)
    return InferenceResponse(
        "m",
        "1",
        outputs=[
            Tensor("OUTPUT0", "FP32", (n,), a + 1),
            Tensor("OUTPUT1", "FP32", (n,), a - 1),
            Tensor("CALLS", "INT64", (1,), np.array([1], dtype=np.int64)),
        ],
    )


def entry(n: int, seed: float = 1.0) -> bytes:
    response = fp32_response(n, seed)
    measured = measure(response)
    blob = pack(response)
    assert measured is not None and measured.size == len(blob)
    return blob


# -- sizes, as Triton's local cache counts them ----------------------------------------------------


@pytest.mark.parametrize(("n", "packed", "taken"), [(1, 160, 176), (4, 184, 192), (100, 952, 960)])
def test_an_entry_takes_what_it_takes_in_tritons_local_cache(
    n: int, packed: int, taken: int
) -> None:
    # Measured on Triton 2.51 (nv_cache_util before and after each insertion); here each entry
    # also pays for its Python objects.
    assert len(entry(n)) == packed
    assert charge(packed) == taken
    assert cost(packed) == taken + ENTRY_OVERHEAD


def test_the_smallest_block_is_48_bytes() -> None:
    assert len(pack(InferenceResponse("m", "1"))) == 4
    assert charge(4) == 48


def test_an_empty_cache_reports_its_own_bookkeeping() -> None:
    cache = ResponseCache(1_048_576)
    assert cache.sample().utilization == SEGMENT_OVERHEAD / 1_048_576  # Triton: 0.0001220703125


def test_the_settings_and_the_store_agree_on_the_smallest_size() -> None:
    assert LOCAL_CACHE_MIN_SIZE == MIN_SIZE == 192
    with pytest.raises(ValueError, match="at least 192 bytes"):
        ResponseCache(191)


# -- parameters are charged (review finding 1) -------------------------------------------------


def test_parameters_are_kept_and_charged() -> None:
    # A model answering a large parameter: it counts like output bytes (it was free before).
    plain = fp32_response(4)
    blob = "x" * 100_000
    response = fp32_response(4)
    response.parameters = {"blob": blob, "n": 3, "f": 1.0, "b": True}
    response.outputs[0].parameters = {"o": "p"}
    measured = measure(response)
    assert measured is not None and measured.size > len(pack(plain)) + 100_000
    packed = pack(response)
    assert len(packed) == measured.size
    answer = unpack(packed, "m", "1", "r")
    assert answer.parameters == {"blob": blob, "n": 3, "f": 1.0, "b": True}
    assert type(answer.parameters["f"]) is float and type(answer.parameters["n"]) is int
    assert answer.outputs[0].parameters == {"o": "p"} and answer.outputs[1].parameters == {}
    cache = ResponseCache(65_536)
    assert cache.insert(b"K", ("m", 1), packed) is Inserted.REFUSED  # 100 kB > 64 KiB
    assert len(cache) == 0


# -- the size bounds the memory (review finding 3) ---------------------------------------------


def test_an_entry_takes_no_more_memory_than_it_is_charged() -> None:
    # How ENTRY_OVERHEAD was measured: many small entries, their memory by tracemalloc.
    import tracemalloc

    count = 50_000
    cache = ResponseCache(1 << 40)
    blobs = [
        pack(InferenceResponse("m", "1", outputs=[Tensor("OUT", "INT64", (1,), np.array([i]))]))
        for i in range(count)
    ]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i, blob in enumerate(blobs):
            cache.insert(i.to_bytes(16, "little"), ("m", 1), blob)
        taken = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    blob_bytes = sum(len(blob) for blob in blobs)  # counted in `taken` only as held already
    assert taken + blob_bytes <= cache.sample().used
    assert cache.sample().used == count * cost(len(blobs[0]))


# -- least recently used out first ---------------------------------------------------------------

# Entries of fp32_response(16): 280 bytes packed, 288 in Triton, 288 + ENTRY_OVERHEAD here; the
# cache holds three of them.
THREE = SEGMENT_OVERHEAD + 3 * cost(280)


def test_a_hit_makes_an_entry_the_most_recently_used() -> None:
    # Three entries: A, B, C; A is hit; D evicts B.
    cache = ResponseCache(THREE)
    for key in (b"A", b"B", b"C"):
        assert cache.insert(key, ("m", 1), entry(16)) is Inserted.STORED
    assert cache.lookup(b"A") is not None
    assert cache.insert(b"D", ("m", 1), entry(16)) is Inserted.STORED
    assert cache.lookup(b"B") is None
    assert cache.lookup(b"A") is not None and cache.lookup(b"C") is not None
    sample = cache.sample()
    assert (sample.entries, sample.evictions, sample.used) == (3, 1, 3 * cost(280))
    assert (sample.hits, sample.misses, sample.lookups) == (3, 1, 4)


def test_an_entry_larger_than_the_cache_is_refused_and_evicts_nothing() -> None:
    cache = ResponseCache(THREE)
    cache.insert(b"A", ("m", 1), entry(16))
    assert cache.refuses(len(entry(300))) and not cache.refuses(len(entry(16)))
    assert cache.insert(b"huge", ("m", 1), entry(300)) is Inserted.REFUSED
    assert len(cache) == 1 and cache.sample().evictions == 0


def test_an_entry_that_fits_the_size_but_not_the_room_evicts_everything_first() -> None:
    # 1592 bytes <= the size, but it takes more than the room left for entries: as Triton
    # ("Cache is empty, nothing to evict."), every entry is evicted and it still fails.
    cache = ResponseCache(THREE)
    for key in (b"A", b"B", b"C"):
        cache.insert(key, ("m", 1), entry(16))
    assert len(entry(180)) == 1592 <= THREE
    assert cache.insert(b"big", ("m", 1), entry(180)) is Inserted.REFUSED
    sample = cache.sample()
    assert (sample.entries, sample.evictions, sample.used) == (0, 3, 0)


def test_a_key_stored_already_is_not_replaced() -> None:
    cache = ResponseCache(4096)
    first = entry(4, 1.0)
    assert cache.insert(b"K", ("m", 1), first) is Inserted.STORED
    assert cache.insert(b"K", ("m", 1), entry(4, 2.0)) is Inserted.EXISTS
    assert cache.lookup(b"K") is first


def test_dropping_a_version_forgets_only_its_entries() -> None:
    cache = ResponseCache(4096)
    cache.insert(b"1", ("m", 1), entry(4))
    cache.insert(b"2", ("m", 2), entry(4))
    cache.insert(b"3", ("other", 1), entry(4))
    assert cache.drop("m", 1) == 1
    assert cache.drop("m", 1) == 0
    assert cache.lookup(b"1") is None
    assert cache.lookup(b"2") is not None and cache.lookup(b"3") is not None
    sample = cache.sample()
    assert sample.used == 2 * cost(len(entry(4))) and sample.evictions == 0
    # An evicted entry leaves the by-version index too: dropping its version finds nothing.
    small = ResponseCache(SEGMENT_OVERHEAD + cost(184))
    small.insert(b"a", ("m", 1), entry(4))
    small.insert(b"b", ("m", 2), entry(4))  # evicts a
    assert small.drop("m", 1) == 0 and small.drop("m", 2) == 1 and small.sample().used == 0


def test_lookups_are_counted_on_their_own() -> None:
    cache = ResponseCache(4096)
    cache.lookup(b"x")
    cache.insert(b"x", ("m", 1), entry(1))
    cache.lookup(b"x")
    cache.lookup(b"x")
    sample = cache.sample()
    assert (sample.lookups, sample.hits, sample.misses) == (3, 2, 1)


# -- entries are copies ----------------------------------------------------------------------------


def test_an_entry_is_a_copy_and_each_hit_gets_its_own_response() -> None:
    response = fp32_response(4)
    blob = pack(response)
    response.outputs[0].data[:] = -7  # the model's own array changes later: not the cache's
    first = unpack(blob, "m", "1", "a")
    second = unpack(blob, "m", "1", "b")
    assert first.id == "a" and second.id == "b"
    assert first.outputs is not second.outputs
    np.testing.assert_array_equal(first.outputs[0].data, np.full(4, 2.0, np.float32))
    assert [t.name for t in first.outputs] == ["OUTPUT0", "OUTPUT1", "CALLS"]
    assert first.outputs[2].data.dtype == np.int64 and first.outputs[2].shape == (1,)
    with pytest.raises(ValueError, match="read-only"):
        first.outputs[0].data[0] = 9


def test_bytes_outputs_are_kept_in_their_wire_form() -> None:
    data = np.array([b"ab", b"", "c\u00e9"], dtype=np.object_).reshape(3, 1)
    response = InferenceResponse("m", "1", outputs=[Tensor("S", "BYTES", (3, 1), data)])
    # 4 + (8 + 4+1 + 4+5 + 4+16 + 8 + 3*4+2+0+3)
    measured = measure(response)
    assert measured is not None and measured.size == 4 + 8 + 5 + 9 + 20 + 8 + 17
    blob = pack(response)
    assert len(blob) == measured.size
    out = unpack(blob, "m", "1", "").outputs[0]
    assert out.shape == (3, 1) and out.data.tolist() == [[b"ab"], [b""], ["c\u00e9".encode()]]


def test_an_output_outside_host_memory_is_not_cached() -> None:
    class Device:  # stands for a GPU tensor
        dtype = np.dtype(np.float32)

    response = InferenceResponse("m", "1", outputs=[Tensor("X", "FP32", (1,), Device())])  # type: ignore[arg-type]
    assert measure(response) is None


# -- the key ---------------------------------------------------------------------------------------


def make_request(a: np.ndarray, b: np.ndarray | None = None, **fields: object) -> InferenceRequest:
    b = a if b is None else b
    return InferenceRequest(
        "m",
        inputs=[
            Tensor("INPUT1", "FP32", b.shape, b),
            Tensor("INPUT0", "FP32", a.shape, a),
        ],
        **fields,  # type: ignore[arg-type]
    )


FOUR = np.arange(4, dtype=np.float32)


def test_the_same_request_has_the_same_key_whatever_the_input_order() -> None:
    first = make_request(FOUR)
    second = make_request(FOUR.copy())
    second.inputs.reverse()
    assert request_key("m", 1, first) == request_key("m", 1, second)
    assert len(request_key("m", 1, first) or b"") == 16


@pytest.mark.parametrize(
    "other",
    [
        pytest.param(make_request(FOUR.reshape(2, 2)), id="same bytes, another shape"),
        pytest.param(make_request(FOUR.view(np.int32)), id="same bytes, another datatype"),
        pytest.param(make_request(FOUR, outputs=[RequestedOutput("OUTPUT1")]), id="outputs"),
        pytest.param(make_request(FOUR, parameters={"p": 1}), id="a parameter"),
        pytest.param(make_request(FOUR, headers={"x-h": "1"}), id="a forwarded header"),
        pytest.param(make_request(FOUR + 1), id="other data"),
    ],
)
def test_what_the_model_would_answer_differently_has_another_key(
    other: InferenceRequest,
) -> None:
    if other.inputs[0].datatype == "FP32" and other.inputs[0].data.dtype == np.int32:
        for tensor in other.inputs:
            tensor.datatype = "INT32"
    assert request_key("m", 1, other) != request_key("m", 1, make_request(FOUR))


def test_scheduling_parameters_model_and_version() -> None:
    plain = request_key("m", 1, make_request(FOUR))
    assert request_key("m", 1, make_request(FOUR, parameters={"priority": 2})) == plain
    assert request_key("m", 1, make_request(FOUR, id="another id")) == plain
    assert request_key("m", 2, make_request(FOUR)) != plain
    assert request_key("n", 1, make_request(FOUR)) != plain


def test_bytes_elements_are_told_apart_by_their_lengths() -> None:
    def strings(*items: bytes) -> InferenceRequest:
        data = np.array(items, dtype=np.object_)
        return InferenceRequest("m", inputs=[Tensor("S", "BYTES", data.shape, data)])

    assert request_key("m", 1, strings(b"ab", b"c")) != request_key("m", 1, strings(b"a", b"bc"))
    assert request_key("m", 1, strings(b"ab", b"c")) == request_key("m", 1, strings(b"ab", b"c"))


def test_an_input_outside_host_memory_has_no_key() -> None:
    request = make_request(FOUR)
    request.inputs[0].data = object()  # type: ignore[assignment]
    assert request_key("m", 1, request) is None


# -- model configs --------------------------------------------------------------------------------

BASE = """
name: "m"
backend: "python"
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""


def test_a_config_asks_for_the_cache() -> None:
    config = parse_pbtxt(BASE)
    assert not caches_responses(config)
    config.response_cache = ModelResponseCache(enable=False)
    assert not caches_responses(config)
    config.response_cache = ModelResponseCache(enable=True)
    assert caches_responses(config)
    check_model_config(config)  # allowed


def test_the_configs_triton_refuses_with_its_words() -> None:
    decoupled = parse_pbtxt(BASE + "response_cache { enable: true }")
    decoupled.model_transaction_policy = ModelTransactionPolicy(decoupled=True)
    with pytest.raises(ConfigError) as caught:
        check_model_config(decoupled)
    assert str(caught.value) == (
        "Response Cache does not currently support model m with 'decoupled' transaction "
        "policy. Please disable the response cache."
    )
    sequence = parse_pbtxt(
        BASE + "max_batch_size: 2 sequence_batching { } response_cache { enable: true }"
    )
    with pytest.raises(ConfigError) as caught:
        check_model_config(sequence)
    assert str(caught.value) == (
        "Response Cache does not currently support model m with sequence batching scheduler. "
        "Please disable the response cache."
    )
    # An ensemble with a decoupled step model is decoupled, as Triton makes it.
    ensemble = parse_pbtxt(
        'name: "e" platform: "ensemble" ensemble_scheduling { step [ { model_name: "d" '
        'model_version: -1 input_map { key: "X" value: "X" } output_map { key: "Y" value: "Y" }'
        " } ] } response_cache { enable: true }"
    )
    check_model_config(ensemble, [parse_pbtxt(BASE)])
    with pytest.raises(ConfigError, match="model e with 'decoupled' transaction policy"):
        check_model_config(ensemble, [parse_pbtxt(BASE), decoupled])
    # Without the cache they are fine.
    decoupled.response_cache = None
    check_model_config(decoupled)


# -- settings -------------------------------------------------------------------------------------


@pytest.fixture
def repo(tmp_path: Path) -> dict[str, object]:
    (tmp_path / "models").mkdir()
    return {"model_repositories": (tmp_path / "models",), "journal": tmp_path / "j.jsonl"}


def test_the_cache_size_from_either_flag(repo: dict[str, object]) -> None:
    assert Settings(**repo).response_cache_size() is None  # type: ignore[arg-type]
    settings = Settings(**repo, cache_config='["local,size=1048576"]')  # type: ignore[arg-type]
    assert settings.response_cache_size() == 1_048_576
    assert settings.warnings() == []
    older = Settings(**repo, response_cache_byte_size="4096")  # type: ignore[arg-type]
    assert older.response_cache_size() == 4096
    assert older.warnings() == [
        "--response-cache-byte-size (TRITONACTOR_RESPONSE_CACHE_BYTE_SIZE=4096) is deprecated, "
        "as in Triton: it is --cache-config=local,size=4096"
    ]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"cache_config": '["redis,size=10"]'},
            "names the cache 'redis': the one cache is 'local'",
        ),
        ({"cache_config": '["local,bogus=1"]'}, "needs the local cache's one setting"),
        (
            {"cache_config": '["local,size=1048576", "local,bogus=1"]'},
            "needs the local cache's one setting",
        ),
        ({"cache_config": '["local,size=abc"]'}, "gives a size that is not a number of bytes"),
        ({"cache_config": '["local,size=-5"]'}, "gives a size that is not a number of bytes"),
        (
            {"cache_config": '["local,size=191"]'},
            "is too small: the local cache needs at least 192",
        ),
        ({"response_cache_byte_size": "0"}, "is too small: the local cache needs at least 192"),
        (
            {"cache_config": '["local,size=10000000000000"]'},
            "is larger than this machine's memory",
        ),
        (
            {"response_cache_byte_size": "10000000000000"},
            "Failed to initialize LocalCache: failed to allocate buffer",
        ),
        (
            {"cache_config": '["local,size=4096"]', "response_cache_byte_size": "4096"},
            "both set, incompatible flags: give one or the other",
        ),
        (
            {"cache_config": '["local,size=4096", "redis,host=h"]'},
            "found multiple cache configurations, but only a single cache is currently supported",
        ),
    ],
)
def test_bad_cache_settings_are_refused(
    repo: dict[str, object], values: dict[str, str], message: str
) -> None:
    with pytest.raises(SettingsError, match="TRITONACTOR_") as caught:
        Settings(**repo, **values)  # type: ignore[arg-type]
    assert message in str(caught.value)


def test_the_work_of_packing_counts_bytes_lengths_and_parameters() -> None:
    # One BYTES element of 300 MB is as much work as 300 MB of numbers, not one step.
    element = b"x" * 300
    response = InferenceResponse(
        "m", "1", outputs=[Tensor("O", "BYTES", (1,), np.array([element], dtype=np.object_))]
    )
    assert measure(response).work == offload.ELEMENT_BYTES + 300
    response.parameters["p"] = "y" * 1000
    # The parameters travel as JSON in the blob: encoding them is work too.
    encoded = json.dumps([{"p": "y" * 1000}, [{}]], separators=(",", ":")).encode()
    assert measure(response).work == offload.ELEMENT_BYTES + 300 + len(encoded)


def test_rough_work_never_looks_at_an_element() -> None:
    # Whether a response is measured off the event loop is decided without walking its BYTES
    # elements (these would fail to be read as bytes).
    data = np.array([object() for _ in range(20_000)], dtype=np.object_)
    response = InferenceResponse("m", "1", outputs=[Tensor("O", "BYTES", (20_000,), data)])
    assert rough_work(response) == 20_000 * offload.ELEMENT_BYTES
    numbers = InferenceResponse(
        "m", "1", outputs=[Tensor("N", "FP32", (4,), np.zeros(4, dtype=np.float32))]
    )
    assert rough_work(numbers) == 16
