"""`ModelSignature.validate`'s one-pass path for the common request against its full checks:
whatever request the one pass lets through, the full checks pass too and note nothing (so the
errors, their wording and their order are the full checks' alone), and the requests clients
send most are let through by the one pass."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tritonactor.core.errors import TritonError, invalid_arg
from tritonactor.core.tensors import DATA_ERROR, UNREAD
from tritonactor.core.types import InferenceRequest, RequestedOutput, Tensor
from tritonactor.scheduling.signature import CLASSIFICATION, ModelSignature, TensorSpec

NAMES = ("A", "B", "C")
DATATYPES = ("FP32", "INT32", "BYTES")
DIMS = st.lists(st.sampled_from((-1, 0, 1, 2, 3)), max_size=3).map(tuple)


@st.composite
def signatures(draw: Any) -> ModelSignature:
    names = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=3, unique=True))
    inputs = tuple(
        TensorSpec(name, draw(st.sampled_from(DATATYPES)), draw(DIMS), draw(st.booleans()))
        for name in names
    )
    outputs = tuple(
        TensorSpec(name, "FP32", (1,))
        for name in draw(st.lists(st.sampled_from(("X", "Y")), min_size=1, unique=True))
    )
    return ModelSignature("m", draw(st.sampled_from((0, 1, 4))), inputs, outputs)


SHAPES = st.lists(st.integers(-1, 5), max_size=4).map(tuple)
PARAMETERS = st.sampled_from(
    ({}, {"binary_data": True}, {"classification": 0}, {"classification": 2}, {"x": 1})
)


@st.composite
def requests(draw: Any, signature: ModelSignature) -> InferenceRequest:
    """Mostly near-valid requests for `signature`: its own inputs, shapes and datatypes, each
    perhaps changed (another name, datatype, shape or batch size, left out or given twice)."""
    inputs = []
    for spec in signature.inputs:
        if spec.optional and draw(st.booleans()):
            continue
        shape = tuple(2 if d == -1 else d for d in spec.dims)
        if signature.max_batch_size:
            shape = (draw(st.integers(0, signature.max_batch_size + 1)), *shape)
        name, datatype = spec.name, spec.datatype
        change = draw(
            st.sampled_from(("none", "none", "name", "datatype", "shape", "twice", "drop"))
        )
        if change == "drop":
            continue
        if change == "name":
            name = draw(st.sampled_from(NAMES))
        elif change == "datatype":
            datatype = draw(st.sampled_from(DATATYPES))
        elif change == "shape":
            shape = draw(SHAPES)
        tensor = Tensor(name, datatype, shape, np.zeros(0, np.float32))
        inputs.append(tensor)
        if change == "twice":
            inputs.append(tensor)
    outputs = [
        RequestedOutput(draw(st.sampled_from(("X", "Y", "Z"))), dict(draw(PARAMETERS)))
        for _ in range(draw(st.integers(0, 2)))
    ]
    return InferenceRequest("m", "", "", draw(st.permutations(inputs)), outputs, {})


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_the_one_pass_lets_through_only_what_the_checks_pass(data: st.DataObject) -> None:
    signature = data.draw(signatures())
    request = data.draw(requests(signature))
    if signature._plainly_valid(request):
        signature._check(request)  # raises nothing
        assert CLASSIFICATION not in request.context


@pytest.mark.parametrize("max_batch_size", [0, 8])
def test_a_common_request_takes_the_one_pass(max_batch_size: int) -> None:
    signature = ModelSignature(
        "m",
        max_batch_size,
        (TensorSpec("INPUT0", "FP32", (-1, 16)), TensorSpec("EXTRA", "INT32", (1,), True)),
        (TensorSpec("OUTPUT0", "FP32", (16,)),),
    )
    batch = (3,) if max_batch_size else ()
    request = InferenceRequest(
        "m",
        "",
        "",
        [Tensor("INPUT0", "FP32", (*batch, 2, 16), np.zeros((*batch, 2, 16), np.float32))],
        [RequestedOutput("OUTPUT0", {"binary_data": True})],
        {},
    )
    assert signature._plainly_valid(request)
    signature.validate(request)
    # Anything else goes to the full checks, with their errors.
    request.outputs = [RequestedOutput("OUTPUT0", {"classification": 1})]
    assert not signature._plainly_valid(request)
    signature.validate(request)
    assert request.context[CLASSIFICATION]["OUTPUT0"].count == 1
    request.inputs[0] = Tensor("INPUT0", "FP64", (*batch, 2, 16), np.zeros(0))
    assert not signature._plainly_valid(request)
    with pytest.raises(TritonError, match="data-type is 'FP64'"):
        signature.validate(request)


def test_data_that_did_not_fit_their_shape_are_refused_once_the_rest_passes_every_time() -> None:
    """The decoders keep a data error for the signature (DATA_ERROR): a wrong shape is told of
    first, and a request otherwise right is refused at each validation (the router may validate
    a request twice: `prepare`, then `submit`), never let through with its placeholder data."""
    signature = ModelSignature("m", 8, (TensorSpec("INPUT0", "FP32", (16,)),), ())
    error = invalid_arg("input byte size mismatch")
    wrong_shape = Tensor("INPUT0", "FP32", (1, 15), UNREAD)
    request = InferenceRequest("m", "", "", [wrong_shape], [], {}, context={DATA_ERROR: error})
    with pytest.raises(TritonError, match="unexpected shape"):
        signature.validate(request)
    request.inputs = [Tensor("INPUT0", "FP32", (1, 16), UNREAD)]
    for _ in range(2):
        with pytest.raises(TritonError) as caught:
            signature.validate(request)
        assert caught.value is error


def test_a_name_given_twice_is_left_to_the_checks() -> None:
    # Both required inputs counted, one of them twice: the full checks find the other missing.
    signature = ModelSignature(
        "m", 0, (TensorSpec("A", "FP32", (1,)), TensorSpec("C", "FP32", (1,))), ()
    )
    tensor = Tensor("A", "FP32", (1,), np.zeros(1, np.float32))
    request = InferenceRequest("m", "", "", [tensor, tensor], [], {})
    assert not signature._plainly_valid(request)
    with pytest.raises(TritonError, match="missing required input"):
        signature.validate(request)


def test_no_inputs_for_a_batching_model_of_optional_inputs() -> None:
    signature = ModelSignature("m", 4, (TensorSpec("A", "FP32", (1,), True),), ())
    request = InferenceRequest("m", "", "", [], [], {})
    assert not signature._plainly_valid(request)  # no batch size to check: the full checks
    signature.validate(request)


def _request(*inputs: tuple[str, str, Any]) -> InferenceRequest:
    tensors = [Tensor(name, datatype, shape, np.zeros(0)) for name, datatype, shape in inputs]
    return InferenceRequest("m", "", "", tensors, [], {})


TWO = (TensorSpec("A", "FP32", (2,)), TensorSpec("B", "FP32", (2,), True))


@pytest.mark.parametrize(
    ("max_batch_size", "specs", "request_", "error"),
    [
        pytest.param(
            4,
            (TensorSpec("A", "FP32", (2,)), TensorSpec("C", "FP32", (2,))),
            _request(("A", "FP32", (1, 2)), ("C", "FP32", (3, 2))),
            "batch size does not match",
            id="two batch sizes",
        ),
        pytest.param(
            0, TWO, _request(("B", "FP32", (2,))), "missing required", id="optional for required"
        ),
        pytest.param(
            0, TWO, _request(("A", "INT32", (2,))), "data-type is 'INT32'", id="datatype alone"
        ),
        pytest.param(
            4, TWO, _request(("A", "FP32", (5, 2))), "batch-size must be <= 4", id="batch size"
        ),
        pytest.param(
            -1, TWO, _request(("A", "FP32", (2,))), "batch-size must be <= -1", id="negative max"
        ),
    ],
)
def test_what_the_checks_refuse_the_one_pass_leaves_to_them(
    max_batch_size: int, specs: tuple[TensorSpec, ...], request_: InferenceRequest, error: str
) -> None:
    signature = ModelSignature("m", max_batch_size, specs, ())
    assert not signature._plainly_valid(request_)
    with pytest.raises(TritonError, match=error):
        signature.validate(request_)


def test_a_shape_given_as_a_numpy_array() -> None:
    # (A shape is a tuple wherever the server makes one; a library caller may pass an array,
    # which the full checks of a model that does not batch take: they answer, as before.)
    signature = ModelSignature("m", 0, TWO, ())
    good = _request(("A", "FP32", np.array([2])))
    signature.validate(good)
    bad = _request(("A", "FP32", np.array([2, 3])))
    with pytest.raises(TritonError, match="unexpected shape"):
        signature.validate(bad)
