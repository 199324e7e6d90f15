"""Classification: the class count a request may ask for, the labels read at load, Triton's
ranking order and the `value:index[:label]` strings. Expected strings are those Triton 2.51
answered for the same scores (probed over HTTP and gRPC)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tritonactor.config.model_config import parse_pbtxt
from tritonactor.core.datatypes import to_numpy_dtype
from tritonactor.core.errors import ErrorCode, TritonError
from tritonactor.core.types import InferenceRequest, InferenceResponse, RequestedOutput, Tensor
from tritonactor.frontends.classification import classify, classify_tensor
from tritonactor.frontends.ranking import sort_indices_descending, top_k
from tritonactor.scheduling.signature import (
    CLASSIFICATION,
    Classification,
    ModelSignature,
    read_labels,
)

WAIT = 30  # s: the bound on a wait for something bound to happen (only a hang reaches it)

CONFIG = """
name: "scores"
max_batch_size: {batch}
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [
  {{ name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] label_filename: "labels.txt" }},
  {{ name: "RAW" data_type: TYPE_FP32 dims: [ 4 ] }}
]
"""


def signature(tmp_path: Path, batch: int = 0, labels: bytes = b"cat\ndog\n\nbird\n"):
    (tmp_path / "labels.txt").write_bytes(labels)
    return ModelSignature.from_config(parse_pbtxt(CONFIG.format(batch=batch)), tmp_path)


def request(*outputs: RequestedOutput, batch: int = 0) -> InferenceRequest:
    shape = (batch, 4) if batch else (4,)
    data = np.zeros(shape, np.float32)
    return InferenceRequest(
        "scores", inputs=[Tensor("IN", "FP32", shape, data)], outputs=[*outputs]
    )


def strings(tensor: Tensor) -> list[str]:
    return [item.decode() for item in tensor.data.reshape(-1)]


# --- the class count ---------------------------------------------------------------------------


def test_a_class_count_attaches_count_labels_and_batching(tmp_path: Path) -> None:
    sig = signature(tmp_path, batch=2)
    req = request(RequestedOutput("OUT", {"classification": 3}), RequestedOutput("RAW"), batch=1)
    sig.validate(req)
    assert req.context[CLASSIFICATION] == {
        "OUT": Classification(3, (b"cat", b"dog", b"", b"bird"), True)
    }


def test_no_or_zero_class_count_asks_for_nothing(tmp_path: Path) -> None:
    sig = signature(tmp_path)
    req = request(RequestedOutput("OUT", {"classification": 0}), RequestedOutput("RAW"))
    sig.validate(req)
    assert CLASSIFICATION not in req.context


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (-1, "invalid value for 'classification' parameter, expected >= 0"),
        (1.5, "invalid value type for 'classification' parameter, expected int64_param"),
        (2.0, "invalid value type for 'classification' parameter, expected int64_param"),
        ("2", "invalid value type for 'classification' parameter, expected int64_param"),
        (True, "invalid value type for 'classification' parameter, expected int64_param"),
    ],
)
def test_a_bad_class_count_is_refused_first(tmp_path: Path, value: object, message: str) -> None:
    sig = signature(tmp_path)
    # The input is wrong too: as in Triton, the class count is reported first.
    req = request(RequestedOutput("OUT", {"classification": value}))
    req.inputs[0].datatype = "INT32"
    with pytest.raises(TritonError) as caught:
        sig.validate(req)
    assert (caught.value.code, caught.value.message) == (ErrorCode.INVALID_ARG, message)
    assert req.context == {}


def test_classification_and_shared_memory_exclude_each_other(tmp_path: Path) -> None:
    output = RequestedOutput("OUT", {"classification": 1, "shared_memory_region": "r"})
    with pytest.raises(TritonError, match="can't set both 'shared_memory_region' and 'class"):
        signature(tmp_path).validate(request(output))


def test_an_unknown_output_is_still_reported(tmp_path: Path) -> None:
    req = request(RequestedOutput("NOPE", {"classification": 1}))
    with pytest.raises(TritonError, match="unexpected inference output 'NOPE'"):
        signature(tmp_path).validate(req)
    assert req.context == {}


# --- labels ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "labels"),
    [
        (b"a\nb\n", (b"a", b"b")),
        (b"a\nb", (b"a", b"b")),
        (b"a\n\nb\n", (b"a", b"", b"b")),
        (b"", ()),
        (b"\n", (b"",)),
        (b"a\r\nb\r\n", (b"a\r", b"b\r")),  # as std::getline: only "\n" ends a line
        ("é\n".encode(), ("é".encode(),)),
    ],
)
def test_label_files_are_read_line_by_line(tmp_path: Path, text: bytes, labels: tuple) -> None:
    path = tmp_path / "labels.txt"
    path.write_bytes(text)
    assert read_labels(path) == labels


def test_a_missing_label_file_fails_the_signature(tmp_path: Path) -> None:
    config = parse_pbtxt(CONFIG.format(batch=0))
    with pytest.raises(TritonError) as caught:
        ModelSignature.from_config(config, tmp_path)
    assert caught.value.code is ErrorCode.INTERNAL
    assert caught.value.message == (
        f"failed to open text file for read {tmp_path / 'labels.txt'}: No such file or directory"
    )
    # Without a model folder (a signature for checks only) nothing is read.
    assert ModelSignature.from_config(config).labels("OUT") == ()


# --- ranking -----------------------------------------------------------------------------------


def test_ties_come_in_the_order_triton_lists_them() -> None:
    # Triton 2.51's answers for these INT32 outputs with classification = their length.
    assert top_k(np.array([1, 2, 2, 1, 2], np.int32), 5) == [1, 2, 4, 0, 3]
    twenty = [1, 19, 17, 15, 13, 11, 9, 7, 5, 3, 8, 6, 10, 12, 4, 14, 16, 2, 18, 0]
    assert top_k(np.array([1, 2] * 10, np.int32), 20) == twenty
    forty = [29, 20, 17, 23, 14, 26, 11, 8, 32, 5, 35, 2, 38, 31, 1, 34, 28, 25, 37, 22]
    forty += [16, 13, 4, 10, 19, 7, 30, 39, 0, 3, 36, 6, 33, 9, 12, 27, 15, 24, 18, 21]
    assert top_k(np.array([i % 3 for i in range(40)], np.int32), 40) == forty


def test_the_fast_path_agrees_with_the_sort_itself() -> None:
    rng = np.random.default_rng(7)
    for size in (1, 5, 16, 17, 100, 1000):
        for row in (rng.random(size), rng.integers(0, 4, size), rng.integers(0, 1000, size)):
            expected = sort_indices_descending(row.tolist())
            for k in (1, 3, size):
                assert top_k(row, k) == expected[:k]


def test_nan_scores_rank_as_the_sort_leaves_them() -> None:
    row = np.array([1.0, np.nan, 3.0, 2.0], np.float32)
    assert top_k(row, 4) == sort_indices_descending(row.tolist())
    assert top_k(np.array([], np.float32), 3) == []


# --- the strings -------------------------------------------------------------------------------

LABELS = (b"cat", b"dog", b"", b"bird")


def scores(datatype: str, values: list, shape: tuple[int, ...] | None = None) -> Tensor:
    data = np.array(values, dtype=to_numpy_dtype(datatype))
    return Tensor("OUT", datatype, shape or data.shape, data.reshape(shape or data.shape))


def test_top_k_with_labels_as_triton_answers() -> None:
    out = classify_tensor(scores("FP32", [0.1, 0.7, 0.2, 0.5]), Classification(2, LABELS, False))
    assert (out.datatype, out.shape) == ("BYTES", (2,))
    assert strings(out) == ["0.700000:1:dog", "0.500000:3:bird"]


def test_more_classes_than_scores_gives_every_score_and_no_label_past_the_file() -> None:
    values = [0.1, 0.7, 0.2, 0.5, 0.9]
    out = classify_tensor(scores("FP32", values), Classification(10, LABELS, False))
    assert out.shape == (5,)
    assert strings(out) == [
        "0.900000:4",
        "0.700000:1:dog",
        "0.500000:3:bird",
        "0.200000:2",
        "0.100000:0:cat",
    ]


def test_floats_are_written_as_c_does() -> None:
    values = [1e20, -3.5, 1e-7, 123.456]
    out = classify_tensor(scores("FP32", values), Classification(4, LABELS, False))
    assert strings(out) == [
        "100000002004087734272.000000:0:cat",
        "123.456001:3:bird",
        "0.000000:2",
        "-3.500000:1:dog",
    ]
    out = classify_tensor(scores("FP64", [0.1, 0.7, 1 / 3]), Classification(3, (), False))
    assert strings(out) == ["0.700000:1", "0.333333:2", "0.100000:0"]
    special = classify_tensor(scores("FP64", [np.inf, -np.inf]), Classification(2, (), False))
    assert strings(special) == ["inf:0", "-inf:1"]


@pytest.mark.parametrize("datatype", ["INT8", "INT16", "INT32", "INT64"])
def test_signed_integers(datatype: str) -> None:
    out = classify_tensor(scores(datatype, [-3, 1, 2]), Classification(3, (), False))
    assert strings(out) == ["2:2", "1:1", "-3:0"]


@pytest.mark.parametrize("datatype", ["UINT8", "UINT16", "UINT32", "UINT64"])
def test_unsigned_integers(datatype: str) -> None:
    out = classify_tensor(scores(datatype, [3, 1, 2]), Classification(3, (), False))
    assert strings(out) == ["3:0", "2:2", "1:1"]
    big = classify_tensor(scores("UINT64", [2**64 - 1, 1]), Classification(2, (), False))
    assert strings(big) == ["18446744073709551615:0", "1:1"]


def test_a_batched_output_is_classified_per_row_of_everything_after_the_batch() -> None:
    probs = scores("FP32", [0.1, 0.4, 0.3, 0.2, 4, 3, 2, 1], (2, 4))
    out = classify_tensor(probs, Classification(2, (b"north", b"east", b"south"), True))
    assert out.shape == (2, 2)
    assert strings(out) == [
        "0.400000:1:east",
        "0.300000:2:south",
        "4.000000:0:north",
        "3.000000:1:east",
    ]
    grid = classify_tensor(scores("INT32", list(range(12)), (2, 2, 3)), Classification(2, (), True))
    assert (grid.shape, strings(grid)) == ((2, 2), ["5:5", "4:4", "11:5", "10:4"])


def test_a_non_batching_model_ranks_the_whole_output() -> None:
    grid = scores("FP32", [0.1, 0.4, 0.3, 0.2], (2, 2))
    out = classify_tensor(grid, Classification(3, (b"r0c0", b"r0c1", b"r1c0"), False))
    assert (out.shape, strings(out)) == ((3,), ["0.400000:1:r0c1", "0.300000:2:r1c0", "0.200000:3"])


def test_an_empty_output_has_no_classes() -> None:
    out = classify_tensor(scores("FP32", []), Classification(3, LABELS, False))
    assert (out.shape, out.data.size) == ((0,), 0)


@pytest.mark.parametrize("datatype", ["BOOL", "FP16", "BF16", "BYTES"])
def test_types_that_cannot_be_ranked(datatype: str) -> None:
    tensor = Tensor("OUT", datatype, (1,), np.zeros(1))
    with pytest.raises(TritonError) as caught:
        classify_tensor(tensor, Classification(1, (), False))
    assert caught.value.code is ErrorCode.INVALID_ARG
    assert caught.value.message == (
        f"class result not available for output due to unsupported type '{datatype}'"
    )


def test_classify_replaces_only_the_classified_outputs_and_leaves_the_response(
    tmp_path: Path,
) -> None:
    sig = signature(tmp_path)
    req = request(RequestedOutput("OUT", {"classification": 1}), RequestedOutput("RAW"))
    sig.validate(req)
    raw = scores("FP32", [1, 2, 3, 4])
    raw.name = "RAW"
    response = InferenceResponse("scores", "1", outputs=[scores("FP32", [0.1, 0.7, 0.2, 0.5]), raw])
    answered = classify(response, req)
    assert strings(answered.outputs[0]) == ["0.700000:1:dog"]
    assert answered.outputs[1] is raw
    assert response.outputs[0].datatype == "FP32"  # the original (maybe cached) is untouched
    plain = request(RequestedOutput("OUT"))
    sig.validate(plain)
    assert classify(response, plain) is response


# --- review fixes: label paths, ensembles, duplicates, the event loop ---------------------------


def labelled(filename: str) -> object:
    return parse_pbtxt(
        'name: "m" input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ] output [ '
        f'{{ name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] label_filename: "{filename}" }} ]'
    )


def test_an_absolute_label_filename_is_joined_to_the_model_folder(tmp_path: Path) -> None:
    # As Triton: "/etc/passwd" names <model folder>/etc/passwd, never the system's file.
    model = tmp_path / "m"
    model.mkdir()
    with pytest.raises(TritonError) as caught:
        ModelSignature.from_config(labelled("/etc/passwd"), model)
    assert caught.value.message == (
        f"failed to open text file for read {model / 'etc/passwd'}: No such file or directory"
    )
    (model / "etc").mkdir()
    (model / "etc" / "passwd").write_bytes(b"inside\n")
    assert ModelSignature.from_config(labelled("/etc/passwd"), model).labels("OUT") == (b"inside",)


@pytest.mark.parametrize("filename", ["../secret.txt", "sub/../../secret.txt", "//../secret.txt"])
def test_a_label_filename_that_leaves_the_model_folder_is_refused(
    tmp_path: Path, filename: str
) -> None:
    model = tmp_path / "m"
    (model / "sub").mkdir(parents=True)
    (tmp_path / "secret.txt").write_bytes(b"secret\n")
    with pytest.raises(TritonError) as caught:
        ModelSignature.from_config(labelled(filename), model)
    assert caught.value.code is ErrorCode.INVALID_ARG
    assert caught.value.message == (
        f"label_filename '{filename}' of output 'OUT' is outside the model's folder"
    )


def test_a_label_file_over_the_size_limit_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tritonactor.scheduling.signature as signature_module

    monkeypatch.setattr(signature_module, "LABEL_FILE_LIMIT", 8)
    (tmp_path / "labels.txt").write_bytes(b"a\nb\nc\nd\n")  # 8 bytes: at the limit
    assert read_labels(tmp_path / "labels.txt") == (b"a", b"b", b"c", b"d")
    (tmp_path / "labels.txt").write_bytes(b"a\nb\nc\nd\ne\n")
    with pytest.raises(TritonError) as caught:
        read_labels(tmp_path / "labels.txt")
    assert caught.value.code is ErrorCode.INTERNAL
    assert caught.value.message == (
        f"label file {tmp_path / 'labels.txt'} is larger than the limit of 8 bytes"
    )


def test_a_duplicate_requested_output_keeps_the_first_class_count(tmp_path: Path) -> None:
    sig = signature(tmp_path)
    req = request(
        RequestedOutput("OUT", {"classification": 1}),
        RequestedOutput("OUT", {"classification": 3}),
    )
    sig.validate(req)
    assert req.context[CLASSIFICATION]["OUT"].count == 1


ENSEMBLE = """
name: "ens"
platform: "ensemble"
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [
  { name: "A" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "B" data_type: TYPE_FP32 dims: [ 4 ] label_filename: "own.txt" },
  { name: "C" data_type: TYPE_FP32 dims: [ 4 ] }
]
ensemble_scheduling { step [
  { model_name: "scores" model_version: -1 input_map { key: "IN" value: "X" }
    output_map [ { key: "OUT" value: "A" }, { key: "RAW" value: "C" } ] },
  { model_name: "other" model_version: 2 input_map { key: "IN" value: "X" }
    output_map [ { key: "OUT" value: "B" } ] }
] }
"""


def test_an_ensemble_output_without_labels_takes_its_steps(tmp_path: Path) -> None:
    step = signature(tmp_path)  # OUT: cat, dog, "", bird; RAW: none
    (tmp_path / "own.txt").write_bytes(b"mine\n")
    asked: list[tuple[str, str]] = []

    def resolve(name: str, version: str) -> ModelSignature:
        asked.append((name, version))
        if name == "other":
            raise TritonError(ErrorCode.UNAVAILABLE, "not loaded")
        return step

    ens = ModelSignature.from_config(parse_pbtxt(ENSEMBLE), tmp_path, resolve)
    assert ens.labels("A") == (b"cat", b"dog", b"", b"bird")  # from the step's OUT
    assert ens.labels("B") == (b"mine",)  # its own file wins
    assert ens.labels("C") == ()  # the step's output has none
    assert asked == [("scores", "")]  # -1: the highest ready version


# --- the event loop stays free while a large output is ranked -----------------------------------


def test_a_large_classification_is_encoded_off_the_event_loop(tmp_path: Path) -> None:
    import threading

    import anyio

    from tritonactor.frontends.classification import LARGE_OUTPUT, encode_off_loop

    sig = signature(tmp_path)
    req = request(RequestedOutput("OUT", {"classification": 5}))
    sig.validate(req)
    big = Tensor("OUT", "FP32", (LARGE_OUTPUT,), np.zeros(LARGE_OUTPUT, np.float32))
    response = InferenceResponse("scores", "1", outputs=[big])
    loop_ran = threading.Event()

    def encode() -> str:
        # Runs the ranking: the loop must be able to run meanwhile (the safety timeout only
        # turns a block into a failure instead of a hang).
        return "free" if loop_ran.wait(timeout=WAIT) else "blocked"

    async def run() -> str:
        async def mark() -> None:
            loop_ran.set()

        async with anyio.create_task_group() as group:
            group.start_soon(mark)
            return await encode_off_loop(response, req, encode)

    assert anyio.run(run) == "free"
    # A small output, or one not classified, is encoded in place.
    small = InferenceResponse("scores", "1", outputs=[scores("FP32", [1, 2, 3, 4])])
    here = threading.get_ident()
    assert anyio.run(encode_off_loop, small, req, threading.get_ident) == here
    assert anyio.run(encode_off_loop, response, request(), threading.get_ident) == here


def test_the_grpc_encoder_cannot_be_called_without_the_request() -> None:
    # Without the request it could not know which outputs to classify: no silent default.
    from tritonactor.frontends.grpc import codec as grpc_codec

    response = InferenceResponse("scores", "1", outputs=[scores("FP32", [1, 2, 3, 4])])
    with pytest.raises(TypeError, match="request"):
        grpc_codec.encode_infer_response(response)  # type: ignore[call-arg]
    req = request(RequestedOutput("OUT", {"classification": 1}))
    req.context[CLASSIFICATION] = {"OUT": Classification(1, (b"a",), False)}
    message = grpc_codec.encode_infer_response(response, request=req)
    assert message.outputs[0].datatype == "BYTES"
