"""The KServe v2 / Triton HTTP inference request body -> InferenceRequest. Responses are
encoded in `responses.py`, raw binary requests decoded in `raw.py`, the JSON of bodies read and
written in `json_body.py`.

Functions over bytes and dicts: no models, actors or web framework; their one state is a
bounded memory of JSON headers seen before (a header sent again is not decoded again: see
"requests seen before" below). Decisions that a reader of the wire protocol alone would not
guess:

- Numeric binary inputs are zero-copy `np.frombuffer` views of the request body. They are
  read-only (the body is `bytes`) and may be unaligned (the JSON header has any length); a
  consumer that must write into an input copies it first.
- Only wire-level consistency is checked here (element counts, byte sizes, JSON types); shapes
  and datatypes are checked against the model config elsewhere. Errors use Triton's wording
  where Triton has a message for the same mistake, and all are INVALID_ARG (400), also where
  Triton answers 500 (a JSON parse error, 'data' that does not fit 'shape').
- The body is cut into every binary input's bytes before any is checked against its shape, as
  in Triton: bytes left over are reported before a size that does not fit.
- `binary_data_size` and resolved `shared_memory_*` parameters describe transport, not the
  tensor, so they are dropped from `Tensor.parameters`.
- JSON tensor data becomes arrays in `json_tensors.py` (FP16 and BF16 have no JSON form there,
  as in Triton: such inputs must be binary).
- `binary_data_output` is a wire option, not a model parameter: it is taken out of the request's
  parameters (the model never sees it) and kept in `request.context` for the encoder. Parameter
  keys starting with `triton_` are reserved, as in Triton.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np

from tritonactor.core.datatypes import (
    is_datatype,
    num_elements,
    to_numpy_dtype,
)
from tritonactor.core.errors import TritonError, invalid_arg
from tritonactor.core.protocol import RESERVED_PARAMETER_PREFIX
from tritonactor.core.tensors import (
    RequestContext,
    array_or_later,
    keep_data_error,
)
from tritonactor.core.types import (
    InferenceRequest,
    Parameters,
    RequestedOutput,
    Tensor,
)
from tritonactor.frontends.http.json_body import decode_json
from tritonactor.frontends.http.json_tensors import array_from_json
from tritonactor.frontends.http.limits import DEFAULT_JSON_DEPTH
from tritonactor.memory.lease import Reader, Reserver
from tritonactor.memory.region import UINT64

# request.context key: the request's `binary_data_output` (the default for outputs that do not
# say), read by `encode_infer_response`.
BINARY_DATA_OUTPUT = "http.binary_data_output"


# --- requests ----------------------------------------------------------------------------------


def decode_infer_request(
    body: bytes | bytearray | memoryview,
    header_length: int | None,
    model_name: str,
    model_version: str,
    *,
    shared_memory: Reader | None = None,
    shared_memory_outputs: Reserver | None = None,
    max_depth: int = DEFAULT_JSON_DEPTH,
) -> InferenceRequest:
    """Decode an inference request body.

    `header_length` is the `Inference-Header-Content-Length` header: the body is that many bytes
    of JSON followed by the inputs' binary data. None means the whole body is JSON.
    `shared_memory` reads inputs that name a shared-memory region, `shared_memory_outputs`
    takes note of outputs to be written into one; without them such tensors are refused.
    `max_depth`: how deep the JSON may nest.
    """
    header, binary = _split_body(body, header_length)
    plan_key = None
    if header_length is not None and header_length <= _PLAN_HEADER_LIMIT:
        plan_key = (bytes(header), max_depth)
        plan = _PLANS.get(plan_key)
        if plan is not None and len(binary) == plan.size:
            return plan.request(binary, model_name, model_version)
    # The whole body when it is all JSON: its depth is checked without a copy.
    document = decode_json(body if header_length is None else header, max_depth)
    if not isinstance(document, dict):
        raise invalid_arg("the inference request must be a JSON object")
    request_id = _decode_id(document.get("id"))
    context = RequestContext(model_name, request_id)
    # The request's parameters before its tensors, as Triton reads them.
    parameters = _request_parameters(document.get("parameters"))
    binary_output = parameters.pop("binary_data_output", False)
    reader = _BinaryReader(binary, model_name, has_header_length=header_length is not None)
    errors: list[TritonError] = []  # data not fitting their shapes, told of later (DATA_ERROR)
    inputs, binary_sizes = _decode_inputs(document, reader, shared_memory, context, errors)
    outputs, reserved = _decode_outputs(document.get("outputs"), shared_memory_outputs)
    request = InferenceRequest(
        model_name=model_name,
        model_version=model_version,
        id=request_id,
        inputs=inputs,
        outputs=outputs,
        parameters=parameters,
    )
    if binary_output:
        request.context[BINARY_DATA_OUTPUT] = True
    if errors:
        return keep_data_error(request, errors)
    if plan_key is not None and binary_sizes is not None and not reserved and not request_id:
        _remember(plan_key, _Plan.of(request, binary_sizes, bool(binary_output)))
    return request


# --- requests seen before ----------------------------------------------------------------------
#
# A client sends the same JSON header again and again (perf_analyzer, a tritonclient loop): only
# its binary data changes. What such a header means, once decoded and found valid, is kept by its
# bytes, and the next request with those bytes only cuts its binary data anew (the same checks
# of the data against the shapes). Only headers whose inputs are all binary and that name no
# shared memory are kept (a region's contents and registration change between requests);
# a binary section of another length is decoded in full, for its error. A header that names a
# request id is not kept: the id is part of the bytes, and a client giving each request its own
# id would only ever add headers (and pay for keeping each).

_PLAN_HEADER_LIMIT = 4096
_PLANS_LIMIT = 128


@dataclass(frozen=True, slots=True)
class _Plan:
    """A decoded JSON header (one that names no request id): everything but the binary data."""

    # (name, datatype, shape, parameters, where its bytes start and end in the binary data) of
    # each input, in the order of the body
    inputs: tuple[tuple[str, str, tuple[int, ...], Parameters, int, int], ...]
    outputs: tuple[tuple[str, Parameters], ...]
    parameters: Parameters
    binary_output: bool
    size: int  # of the binary section

    @classmethod
    def of(cls, request: InferenceRequest, sizes: list[int], binary_output: bool) -> _Plan:
        ends = list(itertools.accumulate(sizes))
        inputs = tuple(
            (tensor.name, tensor.datatype, tensor.shape, dict(tensor.parameters), end - size, end)
            for tensor, size, end in zip(request.inputs, sizes, ends, strict=True)
        )
        outputs = tuple((output.name, dict(output.parameters)) for output in request.outputs)
        return cls(inputs, outputs, dict(request.parameters), binary_output, sum(sizes))

    def request(self, binary: memoryview, model_name: str, model_version: str) -> InferenceRequest:
        """The request of this header with `binary` (of the size it says) as its data; each
        input checked against its shape as a full decode does it, last one first."""
        context = RequestContext(model_name, "")
        errors: list[TritonError] = []
        tensors = [
            Tensor(
                name,
                datatype,
                shape,
                array_or_later(errors, context, name, datatype, shape, binary[start:end]),
                dict(parameters),
            )
            for name, datatype, shape, parameters, start, end in reversed(self.inputs)
        ]
        tensors.reverse()
        request = InferenceRequest(
            model_name=model_name,
            model_version=model_version,
            inputs=tensors,
            outputs=[RequestedOutput(name, dict(parameters)) for name, parameters in self.outputs],
            parameters=dict(self.parameters),
        )
        if self.binary_output:
            request.context[BINARY_DATA_OUTPUT] = True
        return keep_data_error(request, errors)


_PLANS: dict[tuple[bytes, int], _Plan] = {}


def _remember(key: tuple[bytes, int], plan: _Plan) -> None:
    _PLANS[key] = plan
    while len(_PLANS) > _PLANS_LIMIT:
        try:
            del _PLANS[next(iter(_PLANS))]
        except (KeyError, RuntimeError, StopIteration):  # another thread's at the same time
            break


def _split_body(
    body: bytes | bytearray | memoryview, header_length: int | None
) -> tuple[memoryview, memoryview]:
    view = memoryview(body)
    if header_length is None:
        return view, view[len(view) :]
    if header_length < 0 or header_length > len(view):
        raise invalid_arg(
            f"Inference-Header-Content-Length {header_length} is outside the request body "
            f"of {len(view)} bytes"
        )
    return view[:header_length], view[header_length:]


class _BinaryReader:
    """Hands out the binary section to inputs in order of appearance."""

    __slots__ = ("_has_header_length", "_model", "_offset", "_view")

    def __init__(self, view: memoryview, model: str, *, has_header_length: bool) -> None:
        self._view = view
        self._model = model
        self._offset = 0
        self._has_header_length = has_header_length

    def take(self, name: str, size: int) -> memoryview:
        if not self._has_header_length:
            raise invalid_arg(
                f"input '{name}' has 'binary_data_size' but the request has no binary data "
                "(no Inference-Header-Content-Length header)"
            )
        end = self._offset + size
        if end > len(self._view):
            raise invalid_arg(
                f"unexpected size for input '{name}', expecting {end - len(self._view)} "
                f"additional bytes for model '{self._model}'"
            )
        chunk = self._view[self._offset : end]
        self._offset = end
        return chunk

    def finish(self) -> None:
        if len(self._view) > self._offset:
            raise invalid_arg(f"unexpected additional input data for model '{self._model}'")


def _decode_id(value: Any) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise invalid_arg("the request 'id' must be a string")
    return value


def _decode_parameters(value: Any, owner: str) -> Parameters:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise invalid_arg(f"'parameters' of {owner} must be a JSON object")
    for key, item in value.items():
        if not isinstance(item, bool | int | float | str):
            raise invalid_arg(
                f"parameter '{key}' of {owner} must be a bool, number or string, "
                f"not {_json_type(item)}"
            )
    return value


# What Triton's JSON reader says of a value of the wrong type (its words; answered 400 here).
_NOT_UNSIGNED = "attempt to access JSON non-unsigned-integer as unsigned-integer"
_NOT_BOOLEAN = "attempt to access JSON non-boolean as boolean"
_NOT_STRING = "attempt to access JSON non-string as string"


def _request_parameters(value: Any) -> Parameters:
    """The request's parameters, checked key by key in their order as Triton checks them (a
    request wrong in several is told of the first): those the server acts on of the types
    Triton reads them as, whatever the model (a scheduler that acts on one checks it again);
    no key starting with `triton_`, Triton's; any other a bool, number or string."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise invalid_arg("failed to get request params.: attempt to get members for non-object")
    for key, item in value.items():
        if key in ("priority", "timeout"):
            if not _unsigned(item):
                raise invalid_arg(f"Unable to parse '{key}': {_NOT_UNSIGNED}")
        elif key in ("sequence_start", "sequence_end", "binary_data_output"):
            if not isinstance(item, bool):
                raise invalid_arg(f"Unable to parse '{key}': {_NOT_BOOLEAN}")
        elif key == "sequence_id":
            if not (isinstance(item, str) or _unsigned(item)):
                raise invalid_arg(f"Unable to parse '{key}': {_NOT_STRING}")
        elif key.startswith(RESERVED_PARAMETER_PREFIX):
            raise invalid_arg(
                "parameter keys starting with 'triton_' are reserved for Triton usage and "
                "should not be specified."
            )
        elif not isinstance(item, bool | int | float | str):
            raise invalid_arg(
                f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or "
                "'string'."
            )
    return value


def _unsigned(value: Any) -> bool:
    return type(value) is int and 0 <= value < 1 << 64


def _require_bool(parameters: Parameters, key: str, owner: str) -> None:
    if key in parameters and not isinstance(parameters[key], bool):
        raise invalid_arg(f"parameter '{key}' of {owner} must be a bool")


def _decode_outputs(
    value: Any, shared_memory: Reserver | None
) -> tuple[list[RequestedOutput], bool]:
    """The requested outputs, and whether one of them is to be written to shared memory."""
    if value is None:
        return [], False
    if not isinstance(value, list):
        raise invalid_arg("'outputs' of the inference request must be a JSON array")
    outputs = []
    reserved = False
    for index, item in enumerate(value):
        if not isinstance(item, dict):
            raise invalid_arg(f"requested output {index} must be a JSON object")
        name = item.get("name")
        if not isinstance(name, str):
            raise invalid_arg(f"requested output {index} has no 'name' string")
        owner = f"requested output '{name}'"
        parameters = _decode_parameters(item.get("parameters"), owner)
        _require_bool(parameters, "binary_data", owner)
        if "shared_memory_region" in parameters:
            _reserve_shared_memory(name, parameters, shared_memory)
            reserved = True
        outputs.append(RequestedOutput(name, parameters))
    return outputs, reserved


def _reserve_shared_memory(
    name: str, parameters: Parameters, shared_memory: Reserver | None
) -> None:
    if "classification" in parameters:
        raise invalid_arg("Output can't set both 'shared_memory_region' and 'classification'")
    if parameters.get("binary_data") is True:
        raise invalid_arg("Output can't set both 'shared_memory_region' and 'binary_data'")
    region, offset, size = _shared_memory_place(parameters)
    if shared_memory is None:
        raise invalid_arg(f"output '{name}' uses shared memory, which this endpoint cannot write")
    shared_memory(name, region, offset, size)


def _decode_inputs(
    document: dict[str, Any],
    reader: _BinaryReader,
    shared_memory: Reader | None,
    context: RequestContext,
    errors: list[TritonError],
) -> tuple[list[Tensor], list[int] | None]:
    """The inputs, and the byte size of each when every one came from the binary data (else
    None)."""
    if "inputs" not in document:
        raise invalid_arg("the inference request has no 'inputs'")
    items = document["inputs"]
    if not isinstance(items, list):
        raise invalid_arg("'inputs' of the inference request must be a JSON array")
    decoded: list[Tensor | _BinaryInput] = []
    seen: set[str] = set()
    for index, item in enumerate(items):
        entry = _decode_input(index, item, reader, shared_memory, context, errors)
        if entry.name in seen:
            raise invalid_arg(f"{context.prefix}input '{entry.name}' already exists in request")
        seen.add(entry.name)
        decoded.append(entry)
    # As in Triton, the body is cut into every input's bytes before any is held against its
    # shape: bytes left over are reported before a size that does not fit. Triton then holds
    # the inputs against their shapes last one first, so a request with several bad inputs is
    # told about its last.
    reader.finish()
    tensors = [
        entry.tensor(context, errors) if isinstance(entry, _BinaryInput) else entry
        for entry in reversed(decoded)
    ]
    tensors.reverse()
    sizes = [len(entry.chunk) for entry in decoded if isinstance(entry, _BinaryInput)]
    return tensors, sizes if len(sizes) == len(decoded) else None


@dataclass(frozen=True, slots=True)
class _BinaryInput:
    """An input whose bytes are cut from the body but not yet checked against its shape."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    parameters: Parameters
    chunk: memoryview

    def tensor(self, context: RequestContext, errors: list[TritonError]) -> Tensor:
        data = array_or_later(errors, context, self.name, self.datatype, self.shape, self.chunk)
        return Tensor(self.name, self.datatype, self.shape, data, self.parameters)


# Triton's wording when an input has more than one source of data, or none.
_ONE_SOURCE = (
    "Input must set only one of the following fields: 'data', 'binary_data_size' in "
    "'parameters', 'shared_memory_region' in 'parameters'."
)


def _decode_input(
    index: int,
    item: Any,
    reader: _BinaryReader,
    shared_memory: Reader | None,
    context: RequestContext,
    errors: list[TritonError],
) -> Tensor | _BinaryInput:
    if not isinstance(item, dict):
        raise invalid_arg(f"input {index} must be a JSON object")
    name = item.get("name")
    if not isinstance(name, str):
        raise invalid_arg(f"input {index} has no 'name' string")
    datatype = item.get("datatype")
    if not isinstance(datatype, str):
        raise invalid_arg(f"input '{name}' has no 'datatype' string")
    if not is_datatype(datatype):
        raise invalid_arg(f"invalid datatype for input {name}")
    shape = _decode_shape(name, item.get("shape"))
    parameters = _decode_parameters(item.get("parameters"), f"input '{name}'")
    binary_size = parameters.pop("binary_data_size", None)
    sources = [
        source
        for source, present in (
            ("'data'", "data" in item),
            ("'binary_data_size'", binary_size is not None),
            ("'shared_memory_region'", "shared_memory_region" in parameters),
        )
        if present
    ]
    if len(sources) > 1:
        raise invalid_arg(f"{_ONE_SOURCE} But set {' '.join(sources)}")
    if binary_size is not None:
        size = _non_negative_int(binary_size, f"'binary_data_size' of input '{name}'")
        return _BinaryInput(name, datatype, shape, parameters, reader.take(name, size))
    if sources:
        if "data" in item:
            data = array_from_json(context, name, datatype, shape, item["data"])
        else:
            buffer, declared = _read_shared_memory(name, parameters, shared_memory)
            data = array_or_later(
                errors, context, name, datatype, shape, memoryview(buffer), declared
            )
    elif num_elements(shape) == 0:
        data = np.empty(shape, dtype=to_numpy_dtype(datatype))
    else:
        raise invalid_arg(f"{_ONE_SOURCE} But no field is set")
    return Tensor(name, datatype, shape, data, parameters)


def _decode_shape(name: str, value: Any) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise invalid_arg(f"input '{name}' has no 'shape' array")
    for dim in value:
        # bool is an int in Python, but `true` is no dimension.
        if not isinstance(dim, int) or isinstance(dim, bool):
            raise invalid_arg(f"'shape' of input '{name}' must hold integers, got {value}")
        if dim < 0:
            raise invalid_arg(f"'shape' of input '{name}' has a negative dimension: {value}")
    return tuple(value)


def _non_negative_int(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise invalid_arg(f"{what} must be a non-negative integer, got {value!r}")
    return value


def _read_shared_memory(
    name: str, parameters: Parameters, shared_memory: Reader | None
) -> tuple[bytes | memoryview, int]:
    """The input's bytes in its region, and the byte size it was given (as unsigned)."""
    region, offset, size = _shared_memory_place(parameters)
    if shared_memory is None:
        raise invalid_arg(f"input '{name}' uses shared memory, which this endpoint cannot read")
    return shared_memory(region, offset, size), size % UINT64


def _shared_memory_place(parameters: Parameters) -> tuple[str, int, int]:
    """(region, offset, byte size) taken out of a tensor's parameters, with Triton's wording
    for values of the wrong type (INVALID_ARG here, where Triton answers 500). As in Triton,
    a missing offset is 0, and so is a missing byte size (out of bounds)."""
    region = parameters.pop("shared_memory_region")
    offset = parameters.pop("shared_memory_offset", 0)
    size = parameters.pop("shared_memory_byte_size", 0)
    if not isinstance(region, str):
        raise invalid_arg("Unable to parse 'shared_memory_region': expected a string")
    offset = parse_unsigned(offset, "shared_memory_offset")
    return region, offset, parse_unsigned(size, "shared_memory_byte_size")


def parse_unsigned(value: Any, field: str) -> int:
    """`value` as an unsigned 64-bit integer (an offset, a size), or INVALID_ARG naming
    `field` (where Triton answers 500 with its JSON library's words)."""
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**64:
        raise invalid_arg(f"Unable to parse '{field}': expected a non-negative integer")
    return value


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


__all__ = [
    "BINARY_DATA_OUTPUT",
    "decode_infer_request",
    "parse_unsigned",
]
