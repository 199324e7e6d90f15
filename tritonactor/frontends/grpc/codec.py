"""Triton's gRPC messages <-> InferenceRequest / InferenceResponse.

Inputs arrive either all in `raw_input_contents` (one entry per input, in order) or each in its
typed `contents`; FP16 and BF16 have no typed field and travel raw only. Outputs always go back
in `raw_output_contents`: tritonclient's `as_numpy` reads nothing else.

An input may instead name a shared-memory region (`shared_memory_region`, `_offset`,
`_byte_size` parameters, typed as in Triton: string and int64); `raw_input_contents` then holds
entries for the other inputs only, in order. An output may name a region to be written into; its
entry in `raw_output_contents` is then empty.

The messages are protobuf's own (`tritonactor._proto_c`, upb), parsed and serialized in C, with
the tensor data kept out of them (wire.py).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import betterproto2
import numpy as np

from tritonactor._proto_c.grpc_service_pb2 import (
    ModelInferRequest,
    ModelInferResponse,
)
from tritonactor.core.datatypes import (
    INVALID_DATATYPE,
    dims_text,
    is_datatype,
    num_elements,
    to_numpy_dtype,
)
from tritonactor.core.errors import TritonError, invalid_arg
from tritonactor.core.protocol import RESERVED_PARAMETER_PREFIX
from tritonactor.core.tensors import (
    UNREAD,
    RequestContext,
    array_or_later,
    keep_data_error,
    shaped,
    string_count_error,
    tensor_to_bytes,
)
from tritonactor.core.types import (
    InferenceRequest,
    InferenceResponse,
    Parameters,
    RequestedOutput,
    Tensor,
)
from tritonactor.frontends.classification import classify
from tritonactor.frontends.grpc.wire import InferRequestMessage, InferResponseMessage
from tritonactor.memory.lease import Reader, Reserver
from tritonactor.memory.region import UINT64

# The typed `contents` field that carries each data type.
CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
_INT64_MAX = 2**63 - 1
# A decoupled model's final flag as an (empty) response of its own: the one reserved parameter a
# client may send. Kept in request.context, not among the parameters the model sees.
ENABLE_EMPTY_FINAL = "triton_enable_empty_final_response"


# A map<string, InferParameter> field of a message.
ParameterMap = Any


def decode_parameters(parameters: ParameterMap) -> Parameters:
    if not parameters:  # (most tensors and requests carry none)
        return {}
    decoded: Parameters = {}
    for key, parameter in parameters.items():
        field = parameter.WhichOneof("parameter_choice")
        if field is not None:
            decoded[key] = getattr(parameter, field)
    return decoded


def encode_parameters(parameters: Parameters, into: ParameterMap) -> None:
    """Write `parameters` into the map field `into` of a message."""
    for key, value in parameters.items():
        entry = into[key]
        if isinstance(value, bool):
            entry.bool_param = value
        elif isinstance(value, int):
            if value > _INT64_MAX:
                entry.uint64_param = value
            else:
                entry.int64_param = value
        elif isinstance(value, float):
            entry.double_param = value
        else:
            entry.string_param = str(value)


def request_message(message: Any) -> InferRequestMessage:
    """`message` as the server reads a ModelInferRequest: as it comes from the wire, or from
    protobuf's or betterproto2's `ModelInferRequest` (through its wire bytes)."""
    if isinstance(message, InferRequestMessage):
        return message
    if isinstance(message, ModelInferRequest):
        return InferRequestMessage(message, [memoryview(r) for r in message.raw_input_contents])
    if isinstance(message, betterproto2.Message):
        return InferRequestMessage.FromString(bytes(message))
    raise TypeError(f"expected a ModelInferRequest, got {type(message).__name__}")


def decode_infer_request(
    message: InferRequestMessage | ModelInferRequest | betterproto2.Message,
    *,
    shared_memory: Reader | None = None,
    shared_memory_outputs: Reserver | None = None,
) -> InferenceRequest:
    """The request `message` carries. `shared_memory` reads inputs that name a shared-memory
    region, `shared_memory_outputs` takes note of outputs to be written into one; without
    them such tensors are refused."""
    wire = request_message(message)
    message = wire.message
    context = RequestContext(message.model_name, message.id)
    prefix, model = context.prefix, context.model
    # The request's parameters first, as Triton reads a request's own settings before its
    # tensors: a request wrong in both is told of its parameters.
    request_parameters: Parameters = {}
    empty_final = False
    if message.parameters:
        request_parameters = _request_parameters(message.parameters)
        empty_final = request_parameters.pop(ENABLE_EMPTY_FINAL, False)
    raw = wire.raw
    raw_count = len(raw)
    tensors = message.inputs
    seen: set[str] = set()
    # Per input: its name, datatype, shape and bytes (a shared-memory region's, or its
    # raw_input_contents entry; None when it comes in its typed contents).
    # (and the byte size a shared-memory input was given, as unsigned)
    found: list[tuple[str, str, tuple[int, ...], memoryview | None, int | None]] = []
    next_raw = 0
    for tensor in tensors:
        name = tensor.name
        datatype = tensor.datatype
        shape = tuple(tensor.shape)
        if name in seen:
            raise invalid_arg(f"{prefix}input '{name}' already exists in request")
        seen.add(name)
        if not is_datatype(datatype):
            # As Triton's front end, the data are looked for as for any input, and the model's
            # signature refuses the type in the core's words (or the name, if it has none).
            datatype = INVALID_DATATYPE
        elif shape and min(shape) < 0:
            if -1 in shape:
                raise invalid_arg(
                    f"{prefix}All input dimensions should be specified for input '{name}' for "
                    f"model '{model}', got {dims_text(shape)}"
                )
            raise invalid_arg(
                f"{prefix}input '{name}' for model '{model}' has a negative dimension "
                f"in shape {list(shape)}"
            )
        place = shared_memory_place(name, tensor.parameters)
        buffer: memoryview | None = None
        declared: int | None = None
        if place is not None:
            if _has_contents(tensor):
                raise invalid_arg(
                    f"unexpected 'content' provided when using shared memory for input tensor "
                    f"'{name}' for model '{model}'"
                )
            if shared_memory is None:
                raise invalid_arg(
                    f"input '{name}' uses shared memory, which this endpoint cannot read"
                )
            buffer = memoryview(shared_memory(*place))
            declared = place[2] % UINT64
        elif raw_count:
            if _has_contents(tensor):
                raise invalid_arg(
                    f"contents field must not be specified when using raw_input_contents for "
                    f"'{name}' for model '{model}'"
                )
            # As in Triton, raw_input_contents has entries for the inputs not in shared memory.
            if next_raw >= raw_count:
                raise invalid_arg(
                    f"unable to find data for input tensor '{name}' for model '{model}' in request."
                )
            buffer = raw[next_raw]
            next_raw += 1
        elif not tensor.HasField("contents") and num_elements(shape) != 0:
            # (A tensor with no elements needs no data: docs/grpc.md.)
            raise invalid_arg(
                f"unable to find data for input tensor '{name}' for model '{model}' in request."
            )
        else:  # typed contents, held against the type input by input, as Triton's front end
            _check_one_contents_field(tensor, model, datatype)
        found.append((name, datatype, shape, buffer, declared))
    if raw_count > len(found):
        raise invalid_arg(
            f"{prefix}raw_input_contents holds {raw_count} entries for {len(found)} "
            f"inputs of model '{model}'"
        )
    # As Triton does, the data are held against their shapes last input first: a request with
    # several bad inputs is told about its last.
    # Data that do not fit their shape are told of after the model's signature has checked the
    # request, as Triton does (DATA_ERROR).
    inputs: list[Tensor] = []
    errors: list[TritonError] = []
    for index in reversed(range(len(found))):
        name, datatype, shape, buffer, declared = found[index]
        tensor = tensors[index]
        if datatype == INVALID_DATATYPE:
            data = UNREAD  # the signature refuses the type
        elif buffer is not None:
            data = array_or_later(errors, context, name, datatype, shape, buffer, declared)
        else:
            try:
                data = _array_from_contents(tensor, shape, context)
            except TritonError as error:
                errors.append(error)
                data = UNREAD
        parameters = decode_parameters(tensor.parameters)
        if parameters:
            for key in SHARED_MEMORY_KEYS:
                parameters.pop(key, None)
        inputs.append(Tensor(name, datatype, shape, data, parameters))
    inputs.reverse()
    outputs = []
    for output in message.outputs:
        place = shared_memory_place(output.name, output.parameters)
        wanted = decode_parameters(output.parameters)
        if "classification" in output.parameters and "classification" not in wanted:
            wanted["classification"] = None  # unset: refused by its type, as Triton refuses it
        if place is not None:
            if "classification" in output.parameters:
                raise invalid_arg(
                    "output can't set both 'shared_memory_region' and 'classification'"
                )
            if shared_memory_outputs is None:
                raise invalid_arg(
                    f"output '{output.name}' uses shared memory, which this endpoint cannot write"
                )
            shared_memory_outputs(output.name, *place)
            for key in SHARED_MEMORY_KEYS:
                wanted.pop(key, None)
        outputs.append(RequestedOutput(output.name, wanted))
    request = InferenceRequest(
        model_name=model,
        model_version=message.model_version,
        id=message.id,
        inputs=inputs,
        outputs=outputs,
        parameters=request_parameters,
    )
    if empty_final is True:
        request.context[ENABLE_EMPTY_FINAL] = True
    return keep_data_error(request, errors)


# The request parameters the server acts on: the fields of InferParameter each may use, and how
# Triton names them when another is used.
_SERVER_PARAMETERS = {
    "sequence_id": (("int64_param", "string_param"), "int64_param or string_param"),
    "sequence_start": (("bool_param",), "bool_param"),
    "sequence_end": (("bool_param",), "bool_param"),
    "priority": (("int64_param", "uint64_param"), "int64_param or uint64_param"),
    "timeout": (("int64_param",), "int64_param"),
    ENABLE_EMPTY_FINAL: (("bool_param",), "bool_param"),
}
# The fields a parameter of the model's may use.
_MODEL_PARAMETER_FIELDS = ("int64_param", "bool_param", "string_param", "double_param")


def _request_parameters(parameters: ParameterMap) -> Parameters:
    """A request's parameters, decoded, once they are of the types Triton takes, whatever the
    model (with its words): those the server acts on of their own types, a priority not
    negative, the model's of int64, bool, string or double (not uint64, not unset); then no
    key of Triton's reserved prefix, set or not, but ENABLE_EMPTY_FINAL. One pass over the
    map (clients such as perf_analyzer send ENABLE_EMPTY_FINAL with every call: two passes,
    and a third over what they decoded, cost a call ~4 µs of the ~7 its whole decode
    takes)."""
    decoded: Parameters = {}
    reserved = False  # a reserved key other than ENABLE_EMPTY_FINAL, set
    for key, parameter in parameters.items():
        field = parameter.WhichOneof("parameter_choice")
        expected = _SERVER_PARAMETERS.get(key)
        if expected is not None:
            fields, words = expected
            if field not in fields:
                raise invalid_arg(f"invalid value type for '{key}' parameter, expected {words}.")
            if key == "priority" and field == "int64_param" and parameter.int64_param < 0:
                raise invalid_arg("invalid value for 'priority', expected value >= 0.")
        elif field not in _MODEL_PARAMETER_FIELDS and not key.startswith(RESERVED_PARAMETER_PREFIX):
            raise invalid_arg(
                f"invalid value type for '{key}' parameter, expected int64_param, bool_param, "
                "or string_param."
            )
        if field is not None:  # (one unset has no value: the model never sees it)
            decoded[key] = getattr(parameter, field)
        if key != ENABLE_EMPTY_FINAL and key.startswith(RESERVED_PARAMETER_PREFIX):
            reserved = True  # (set or not, as Triton refuses it)
    # Triton checks a key's type and its prefix in one pass over a map whose order protobuf
    # varies from call to call, so a request wrong both ways is told of either; here always
    # of the type (the first wrong one in the map's order), one of Triton's answers.
    if reserved:
        raise invalid_arg(
            "parameter keys starting with 'triton_' are reserved for Triton usage. Only the "
            f"following keys starting with 'triton_' are allowed: {ENABLE_EMPTY_FINAL}"
        )
    return decoded


SHARED_MEMORY_KEYS = ("shared_memory_region", "shared_memory_offset", "shared_memory_byte_size")


def shared_memory_place(name: str, parameters: ParameterMap) -> tuple[str, int, int] | None:
    """(region, offset, byte size) when tensor `name`'s parameters name a shared-memory region,
    with Triton's checks and messages: the region a string_param, offset and byte size
    int64_params (a negative one wraps around, out of bounds), the byte size required."""
    if not parameters:
        return None
    region = parameters.get("shared_memory_region")
    if region is not None:
        if region.WhichOneof("parameter_choice") != "string_param":
            raise invalid_arg(
                f"invalid value type for 'shared_memory_region' parameter for tensor '{name}', "
                "expected string_param."
            )
        region_name: str = region.string_param
    offset = _int64_parameter(name, parameters, "shared_memory_offset", region is not None)
    size = _int64_parameter(name, parameters, "shared_memory_byte_size", region is not None)
    if region is None:
        return None
    if size is None:
        raise invalid_arg(
            "'shared_memory_byte_size' must be specified along with 'shared_memory_region' "
            f"parameter for tensor '{name}'"
        )
    return region_name, offset or 0, size


def _int64_parameter(name: str, parameters: ParameterMap, key: str, has_region: bool) -> int | None:
    parameter = parameters.get(key)
    if parameter is None:
        return None
    if not has_region:
        raise invalid_arg(
            f"'{key}' can not be specified without 'shared_memory_region' parameter for tensor "
            f"'{name}'"
        )
    if parameter.WhichOneof("parameter_choice") != "int64_param":
        raise invalid_arg(
            f"invalid value type for '{key}' parameter for tensor '{name}', expected int64_param."
        )
    return int(parameter.int64_param)


_CONTENTS_FIELDS = frozenset(CONTENTS_FIELD.values())


def _has_contents(tensor: ModelInferRequest.InferInputTensor) -> bool:
    if not tensor.HasField("contents"):
        return False
    contents = tensor.contents
    return any(getattr(contents, field) for field in _CONTENTS_FIELDS)


# The typed fields in the order Triton reads them, and the data type each one's values are
# (int_contents and uint_contents carry the input's own 8- and 16-bit types).
_CONTENTS_ORDER = (
    ("bool_contents", "BOOL"),
    ("int_contents", "INT32"),
    ("int64_contents", "INT64"),
    ("uint_contents", "UINT32"),
    ("uint64_contents", "UINT64"),
    ("fp32_contents", "FP32"),
    ("fp64_contents", "FP64"),
    ("bytes_contents", "BYTES"),
)
_NARROW = {"int_contents": ("INT8", "INT16"), "uint_contents": ("UINT8", "UINT16")}


def _check_one_contents_field(
    tensor: ModelInferRequest.InferInputTensor, model: str, datatype: str
) -> None:
    """The typed contents hold data in one field, the input's datatype's (Triton's words)."""
    contents = tensor.contents
    supplied = False
    for field, field_type in _CONTENTS_ORDER:
        if not getattr(contents, field):
            continue
        where = (
            f"unexpected explicit tensor data for input tensor '{tensor.name}' for model '{model}'"
        )
        if supplied:
            raise invalid_arg(f"{where}, binary data was already supplied.")
        if datatype in _NARROW.get(field, ()):
            field_type = datatype
        if field_type != datatype:
            raise invalid_arg(f"{where} of type '{field_type}', expected datatype '{datatype}'")
        supplied = True


def _array_from_contents(
    tensor: ModelInferRequest.InferInputTensor, shape: tuple[int, ...], context: RequestContext
) -> np.ndarray:
    prefix, model = context.prefix, context.model
    field = CONTENTS_FIELD.get(tensor.datatype)
    if field is None:
        raise invalid_arg(
            f"{prefix}input '{tensor.name}' for model '{model}': {tensor.datatype} data must be "
            "sent in raw_input_contents; the typed contents have no field for it"
        )
    values: list[Any] = list(getattr(tensor.contents, field))
    count = num_elements(shape)
    if len(values) != count:
        if tensor.datatype == "BYTES":
            raise string_count_error(context, tensor.name, len(values), count)
        itemsize = to_numpy_dtype(tensor.datatype).itemsize
        raise invalid_arg(
            f"{prefix}input byte size mismatch for input '{tensor.name}' for model '{model}'. "
            f"Expected {count * itemsize}, got {len(values) * itemsize}"
        )
    if tensor.datatype == "BYTES":
        array = np.empty(count, dtype=np.object_)
        array[:] = values
        return shaped(array, shape)
    try:
        return _typed_array(values, to_numpy_dtype(tensor.datatype), shape)
    except OverflowError:
        raise invalid_arg(
            f"{prefix}input '{tensor.name}' for model '{model}' holds a value out of range "
            f"for {tensor.datatype}"
        ) from None


def _typed_array(values: list[Any], dtype: np.dtype[Any], shape: tuple[int, ...]) -> np.ndarray:
    if dtype.kind in "iu":
        # The wire fields are wider than INT8/INT16/UINT8/UINT16: values must fit the type.
        wide = np.array(values, dtype=np.int64 if dtype.kind == "i" else np.uint64)
        info = np.iinfo(dtype)
        if wide.size and (wide.min() < info.min or wide.max() > info.max):
            raise OverflowError(dtype.name)
        return shaped(wide.astype(dtype), shape)
    return shaped(np.array(values, dtype=dtype), shape)


def encode_infer_response(
    response: InferenceResponse,
    *,
    request: InferenceRequest,
    in_shared_memory: Collection[str] = (),
) -> InferResponseMessage:
    """The response message; the outputs named in `in_shared_memory` were written into the
    client's shared memory: their `raw_output_contents` entries are empty, as in Triton.
    `request` (the one answered) says which outputs to classify."""
    response = classify(response, request)
    message = ModelInferResponse(
        model_name=response.model_name, model_version=response.model_version, id=response.id
    )
    if response.parameters:
        encode_parameters(response.parameters, message.parameters)
    outputs = message.outputs
    raw: list[Any] = []
    for tensor in response.outputs:
        output = outputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        if tensor.parameters:
            encode_parameters(tensor.parameters, output.parameters)
        if tensor.name in in_shared_memory:
            raw.append(b"")
            continue
        # A view of the data (bytes for BYTES): copied once, into the reply.
        raw.append(tensor_to_bytes(tensor.datatype, np.asarray(tensor.data)))
    return InferResponseMessage(message, raw)
