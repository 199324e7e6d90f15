"""Triton's gRPC messages <-> InferenceRequest / InferenceResponse.

Inputs arrive either all in `raw_input_contents` (one entry per input, in order) or each in its
typed `contents`; FP16 and BF16 have no typed field and travel raw only. Outputs always go back
in `raw_output_contents`: tritonclient's `as_numpy` reads nothing else.
"""

from __future__ import annotations

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


def decode_infer_request(message: ModelInferRequest) -> InferenceRequest:
    context = RequestContext(message.model_name, message.id)
    prefix, model = context.prefix, context.model
    raw = message.raw_input_contents
    seen: set[str] = set()
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
        if raw:
            if _has_contents(tensor):
                raise invalid_arg(
                    f"contents field must not be specified when using raw_input_contents for "
                    f"'{tensor.name}' for model '{model}'"
                )
            if index >= len(raw):
                raise invalid_arg(
                    f"unable to find data for input tensor '{tensor.name}' for model "
                    f"'{model}' in request."
                )
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
        if raw:
            data = array_from_bytes(
                context, tensor.name, tensor.datatype, shape, memoryview(raw[index])
            )
        else:
            data = _array_from_contents(tensor, shape, prefix, model)
        inputs.append(
            Tensor(tensor.name, tensor.datatype, shape, data, decode_parameters(tensor.parameters))
        )
    inputs.reverse()
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
        outputs=[
            RequestedOutput(output.name, decode_parameters(output.parameters))
            for output in message.outputs
        ],
        parameters=parameters,
    )
    if empty_final is True:
        request.context[ENABLE_EMPTY_FINAL] = True
    return request


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


def encode_infer_response(response: InferenceResponse) -> ModelInferResponse:
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
        raw.append(bytes(tensor_to_bytes(tensor.datatype, np.asarray(tensor.data))))
    return ModelInferResponse(
        model_name=response.model_name,
        model_version=response.model_version,
        id=response.id,
        parameters=encode_parameters(response.parameters),
        outputs=outputs,
        raw_output_contents=raw,
    )
