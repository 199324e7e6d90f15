"""Triton's gRPC messages <-> InferenceRequest / InferenceResponse.

Inputs arrive either all in `raw_input_contents` (one entry per input, in order) or each in its
typed `contents`; FP16 and BF16 have no typed field and travel raw only. Outputs always go back
in `raw_output_contents`: tritonclient's `as_numpy` reads nothing else.

An input may instead name a shared-memory region (`shared_memory_region`, `_offset`,
`_byte_size` parameters, typed as in Triton: string and int64); `raw_input_contents` then holds
entries for the other inputs only, in order. An output may name a region to be written into; its
entry in `raw_output_contents` is then empty.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import betterproto2
import numpy as np

from tritonactor._proto.inference import (
    InferParameter,
    ModelInferRequest,
    ModelInferRequestInferInputTensor,
    ModelInferResponse,
    ModelInferResponseInferOutputTensor,
)
from tritonactor.core.datatypes import (
    is_datatype,
    num_elements,
    to_numpy_dtype,
)
from tritonactor.core.errors import invalid_arg
from tritonactor.core.protocol import RESERVED_PARAMETER_PREFIX
from tritonactor.core.tensors import RequestContext, array_from_bytes, tensor_to_bytes
from tritonactor.core.types import (
    InferenceRequest,
    InferenceResponse,
    Parameters,
    RequestedOutput,
    Tensor,
)
from tritonactor.frontends.classification import classify
from tritonactor.memory.lease import Reader, Reserver

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


def decode_parameters(parameters: dict[str, InferParameter]) -> Parameters:
    decoded: Parameters = {}
    for key, parameter in parameters.items():
        _, value = betterproto2.which_one_of(parameter, "parameter_choice")
        if value is not None:
            decoded[key] = value
    return decoded


def encode_parameters(parameters: Parameters) -> dict[str, InferParameter]:
    encoded: dict[str, InferParameter] = {}
    for key, value in parameters.items():
        if isinstance(value, bool):
            encoded[key] = InferParameter(bool_param=value)
        elif isinstance(value, int):
            if value > _INT64_MAX:
                encoded[key] = InferParameter(uint64_param=value)
            else:
                encoded[key] = InferParameter(int64_param=value)
        elif isinstance(value, float):
            encoded[key] = InferParameter(double_param=value)
        else:
            encoded[key] = InferParameter(string_param=str(value))
    return encoded


def decode_infer_request(
    message: ModelInferRequest,
    *,
    shared_memory: Reader | None = None,
    shared_memory_outputs: Reserver | None = None,
) -> InferenceRequest:
    """The request `message` carries. `shared_memory` reads inputs that name a shared-memory
    region, `shared_memory_outputs` takes note of outputs to be written into one; without
    them such tensors are refused."""
    context = RequestContext(message.model_name, message.id)
    prefix, model = context.prefix, context.model
    raw = message.raw_input_contents
    seen: set[str] = set()
    # Input index -> its bytes: a shared-memory region's, or its raw_input_contents entry.
    buffers: dict[int, bytes | memoryview] = {}
    next_raw = 0
    for index, tensor in enumerate(message.inputs):
        if tensor.name in seen:
            raise invalid_arg(f"{prefix}input '{tensor.name}' already exists in request")
        seen.add(tensor.name)
        if not is_datatype(tensor.datatype):
            raise invalid_arg(f"invalid datatype for input {tensor.name}")
        if any(dim < 0 for dim in tensor.shape):
            raise invalid_arg(
                f"{prefix}input '{tensor.name}' for model '{model}' has a negative dimension "
                f"in shape {list(tensor.shape)}"
            )
        place = shared_memory_place(tensor.name, tensor.parameters)
        if place is not None:
            if _has_contents(tensor):
                raise invalid_arg(
                    f"unexpected 'content' provided when using shared memory for input tensor "
                    f"'{tensor.name}' for model '{model}'"
                )
            if shared_memory is None:
                raise invalid_arg(
                    f"input '{tensor.name}' uses shared memory, which this endpoint cannot read"
                )
            buffers[index] = shared_memory(*place)
        elif raw:
            if _has_contents(tensor):
                raise invalid_arg(
                    f"contents field must not be specified when using raw_input_contents for "
                    f"'{tensor.name}' for model '{model}'"
                )
            # As in Triton, raw_input_contents has entries for the inputs not in shared memory.
            if next_raw >= len(raw):
                raise invalid_arg(
                    f"unable to find data for input tensor '{tensor.name}' for model "
                    f"'{model}' in request."
                )
            buffers[index] = memoryview(raw[next_raw])
            next_raw += 1
    if len(raw) > len(message.inputs):
        raise invalid_arg(
            f"{prefix}raw_input_contents holds {len(raw)} entries for {len(message.inputs)} "
            f"inputs of model '{model}'"
        )
    # As Triton does, the data are held against their shapes last input first: a request with
    # several bad inputs is told about its last.
    inputs: list[Tensor] = []
    for index in reversed(range(len(message.inputs))):
        tensor = message.inputs[index]
        shape = tuple(tensor.shape)
        buffer = buffers.get(index)
        if buffer is not None:
            data = array_from_bytes(
                context, tensor.name, tensor.datatype, shape, memoryview(buffer)
            )
        else:
            data = _array_from_contents(tensor, shape, prefix, model)
        parameters = decode_parameters(tensor.parameters)
        for key in SHARED_MEMORY_KEYS:
            parameters.pop(key, None)
        inputs.append(Tensor(tensor.name, tensor.datatype, shape, data, parameters))
    inputs.reverse()
    outputs = []
    for output in message.outputs:
        place = shared_memory_place(output.name, output.parameters)
        parameters = decode_parameters(output.parameters)
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
                parameters.pop(key, None)
        outputs.append(RequestedOutput(output.name, parameters))
    parameters = decode_parameters(message.parameters)
    reserved = [key for key in parameters if key.startswith(RESERVED_PARAMETER_PREFIX)]
    if any(key != ENABLE_EMPTY_FINAL for key in reserved):
        raise invalid_arg(
            "parameter keys starting with 'triton_' are reserved for Triton usage. Only the "
            f"following keys starting with 'triton_' are allowed: {ENABLE_EMPTY_FINAL}"
        )
    empty_final = parameters.pop(ENABLE_EMPTY_FINAL, False)
    request = InferenceRequest(
        model_name=model,
        model_version=message.model_version,
        id=message.id,
        inputs=inputs,
        outputs=outputs,
        parameters=parameters,
    )
    if empty_final is True:
        request.context[ENABLE_EMPTY_FINAL] = True
    return request


SHARED_MEMORY_KEYS = ("shared_memory_region", "shared_memory_offset", "shared_memory_byte_size")


def shared_memory_place(
    name: str, parameters: dict[str, InferParameter]
) -> tuple[str, int, int] | None:
    """(region, offset, byte size) when tensor `name`'s parameters name a shared-memory region,
    with Triton's checks and messages: the region a string_param, offset and byte size
    int64_params (a negative one wraps around, out of bounds), the byte size required."""
    region = parameters.get("shared_memory_region")
    if region is not None:
        field, value = betterproto2.which_one_of(region, "parameter_choice")
        if field != "string_param":
            raise invalid_arg(
                f"invalid value type for 'shared_memory_region' parameter for tensor '{name}', "
                "expected string_param."
            )
        region_name: str = value
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


def _int64_parameter(
    name: str, parameters: dict[str, InferParameter], key: str, has_region: bool
) -> int | None:
    parameter = parameters.get(key)
    if parameter is None:
        return None
    if not has_region:
        raise invalid_arg(
            f"'{key}' can not be specified without 'shared_memory_region' parameter for tensor "
            f"'{name}'"
        )
    field, value = betterproto2.which_one_of(parameter, "parameter_choice")
    if field != "int64_param":
        raise invalid_arg(
            f"invalid value type for '{key}' parameter for tensor '{name}', expected int64_param."
        )
    return int(value)


def _has_contents(tensor: ModelInferRequestInferInputTensor) -> bool:
    contents = tensor.contents
    return contents is not None and any(
        getattr(contents, field) for field in set(CONTENTS_FIELD.values())
    )


def _array_from_contents(
    tensor: ModelInferRequestInferInputTensor, shape: tuple[int, ...], prefix: str, model: str
) -> np.ndarray:
    field = CONTENTS_FIELD.get(tensor.datatype)
    if field is None:
        raise invalid_arg(
            f"{prefix}input '{tensor.name}' for model '{model}': {tensor.datatype} data must be "
            "sent in raw_input_contents; the typed contents have no field for it"
        )
    values: list[Any] = getattr(tensor.contents, field) if tensor.contents is not None else []
    count = num_elements(shape)
    if len(values) != count:
        if tensor.datatype == "BYTES":
            raise invalid_arg(
                f"{prefix}unexpected number of string elements {len(values)} for inference "
                f"input '{tensor.name}' for model '{model}', expecting {count}"
            )
        itemsize = to_numpy_dtype(tensor.datatype).itemsize
        raise invalid_arg(
            f"{prefix}input byte size mismatch for input '{tensor.name}' for model '{model}'. "
            f"Expected {count * itemsize}, got {len(values) * itemsize}"
        )
    if tensor.datatype == "BYTES":
        array = np.empty(count, dtype=np.object_)
        array[:] = values
        return array.reshape(shape)
    try:
        return _typed_array(values, to_numpy_dtype(tensor.datatype), shape)
    except OverflowError:
        raise invalid_arg(
            f"{prefix}input '{tensor.name}' for model '{model}' holds a value out of range "
            f"for {tensor.datatype}"
        ) from None


def _typed_array(values: list[Any], dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    if dtype.kind in "iu":
        # The wire fields are wider than INT8/INT16/UINT8/UINT16: values must fit the type.
        wide = np.array(values, dtype=np.int64 if dtype.kind == "i" else np.uint64)
        info = np.iinfo(dtype)
        if wide.size and (wide.min() < info.min or wide.max() > info.max):
            raise OverflowError(dtype.name)
        return wide.astype(dtype).reshape(shape)
    return np.array(values, dtype=dtype).reshape(shape)


def encode_infer_response(
    response: InferenceResponse,
    *,
    request: InferenceRequest,
    in_shared_memory: Collection[str] = (),
) -> ModelInferResponse:
    """The response message; the outputs named in `in_shared_memory` were written into the
    client's shared memory: their `raw_output_contents` entries are empty, as in Triton.
    `request` (the one answered) says which outputs to classify."""
    response = classify(response, request)
    outputs: list[ModelInferResponseInferOutputTensor] = []
    raw: list[bytes] = []
    for tensor in response.outputs:
        outputs.append(
            ModelInferResponseInferOutputTensor(
                name=tensor.name,
                datatype=tensor.datatype,
                shape=list(tensor.shape),
                parameters=encode_parameters(tensor.parameters),
            )
        )
        if tensor.name in in_shared_memory:
            raw.append(b"")
            continue
        raw.append(bytes(tensor_to_bytes(tensor.datatype, np.asarray(tensor.data))))
    return ModelInferResponse(
        model_name=response.model_name,
        model_version=response.model_version,
        id=response.id,
        parameters=encode_parameters(response.parameters),
        outputs=outputs,
        raw_output_contents=raw,
    )
