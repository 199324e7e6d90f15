"""`triton_python_backend_utils`, as model code imports it (`import triton_python_backend_utils as
pb_utils`): the classes and helpers Triton's python backend documents, with the same names and
behaviour. Inside a stub process the stub connects this module to the server (`_stub`); imported
anywhere else, the data classes and helpers work and BLS, response senders and the logger's
server side do not.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Iterator
from typing import Any

import numpy as np

from tritonactor.core.datatypes import deserialize_bytes, serialize_bytes

# The stub that runs this process's model: set by tritonactor.backends.python.stub.
_stub: Any = None

TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2

# TRITONSERVER_DataType values, in Triton's order.
TYPE_INVALID = 0
_TRITON_TYPES: list[tuple[str, Any]] = [
    ("BOOL", np.bool_),
    ("UINT8", np.uint8),
    ("UINT16", np.uint16),
    ("UINT32", np.uint32),
    ("UINT64", np.uint64),
    ("INT8", np.int8),
    ("INT16", np.int16),
    ("INT32", np.int32),
    ("INT64", np.int64),
    ("FP16", np.float16),
    ("FP32", np.float32),
    ("FP64", np.float64),
    ("BYTES", np.object_),
    ("BF16", None),
]
_NUMBER_OF_WIRE = {name: number for number, (name, _) in enumerate(_TRITON_TYPES, start=1)}


# ---------------------------------------------------------------------------------------------
# Data types


def triton_to_numpy_type(data_type: int) -> Any:
    """TRITONSERVER_DataType number -> numpy type (None for BF16 and unknown numbers)."""
    if 1 <= data_type <= len(_TRITON_TYPES):
        return _TRITON_TYPES[data_type - 1][1]
    return None


def numpy_to_triton_type(data_type: Any) -> int | None:
    dtype = np.dtype(data_type)
    if dtype.kind in ("O", "S", "U"):
        return _NUMBER_OF_WIRE["BYTES"]
    for number, (_, numpy_type) in enumerate(_TRITON_TYPES, start=1):
        if numpy_type is not None and np.dtype(numpy_type) == dtype:
            return number
    return None


def triton_string_to_numpy(triton_type_string: str) -> Any:
    """A config data type ("TYPE_FP32", "TYPE_STRING") -> numpy type."""
    name = triton_type_string.removeprefix("TYPE_")
    if name == "STRING":
        name = "BYTES"
    number = _NUMBER_OF_WIRE.get(name)
    return triton_to_numpy_type(number) if number is not None else None


def serialize_byte_tensor(input_tensor: np.ndarray) -> np.ndarray | None:
    """Elements (bytes, or anything str() can render) -> one 0-d object array holding the
    length-prefixed (4-byte little-endian) concatenation, Triton's BYTES wire form."""
    if input_tensor.size == 0:
        return np.empty([0], dtype=np.object_)
    if input_tensor.dtype.kind not in ("O", "S", "U"):
        raise TritonModelException("cannot serialize bytes tensor: invalid datatype")
    return np.asarray(serialize_bytes(input_tensor), dtype=np.object_)


def deserialize_bytes_tensor(encoded_tensor: bytes) -> np.ndarray:
    """Triton's BYTES wire form -> a 1-D object array of bytes."""
    return deserialize_bytes(encoded_tensor)


# ---------------------------------------------------------------------------------------------
# Errors


class TritonError(Exception):
    """An error a response carries: a message and one of Triton's codes."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        super().__init__(message)
        self._message = message
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, code={self._code})"


_CODE_NAMES = {
    TritonError.UNKNOWN: "INTERNAL",
    TritonError.INTERNAL: "INTERNAL",
    TritonError.NOT_FOUND: "NOT_FOUND",
    TritonError.INVALID_ARG: "INVALID_ARG",
    TritonError.UNAVAILABLE: "UNAVAILABLE",
    TritonError.UNSUPPORTED: "UNSUPPORTED",
    TritonError.ALREADY_EXISTS: "ALREADY_EXISTS",
    TritonError.CANCELLED: "CANCELLED",
}
_CODE_NUMBERS = {name: number for number, name in _CODE_NAMES.items() if number}


class TritonModelException(Exception):
    """Raised by this module when model code asks for something that cannot be done."""


# ---------------------------------------------------------------------------------------------
# Tensors


class _Capsule:
    """Lets numpy import a bare DLPack capsule (it wants an object with `__dlpack__`)."""

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU


class Tensor:
    """A named tensor in CPU memory: Tensor(name, numpy_array)."""

    def __init__(self, name: str, data: np.ndarray, dtype: Any = None) -> None:
        if not isinstance(data, np.ndarray):
            raise TritonModelException(
                f"tensor '{name}' must be a numpy array, not {type(data).__name__}"
            )
        if data.dtype.kind in ("S", "U"):
            data = data.astype(np.object_)
        self._name = name
        self._array = data

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def triton_dtype(self) -> int | None:
        return numpy_to_triton_type(self._array.dtype)

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self) -> Any:
        if self._array.dtype == np.object_:
            raise TritonModelException("a BYTES tensor cannot be exported as DLPack")
        return self._array.__dlpack__()

    @staticmethod
    def from_dlpack(name: str, dlpack_tensor: Any) -> Tensor:
        """From a DLPack capsule or any object with `__dlpack__` (a torch tensor, a numpy
        array...). GPU tensors are copied to the CPU through torch when it is installed."""
        if hasattr(dlpack_tensor, "__dlpack__"):
            device = getattr(dlpack_tensor, "__dlpack_device__", lambda: (1, 0))()
            if device[0] == 1:
                return Tensor(name, np.from_dlpack(dlpack_tensor))
            import torch  # a GPU tensor: bring it to the host

            return Tensor(name, torch.from_dlpack(dlpack_tensor).cpu().numpy())
        try:
            return Tensor(name, np.from_dlpack(_Capsule(dlpack_tensor)))
        except Exception:
            import torch

            return Tensor(name, torch.utils.dlpack.from_dlpack(dlpack_tensor).cpu().numpy())

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, shape={self.shape()}, dtype={self._array.dtype})"


# ---------------------------------------------------------------------------------------------
# Requests and responses


def _parameters_json(parameters: Any) -> str:
    if parameters is None:
        return "{}"
    if isinstance(parameters, str):
        json.loads(parameters)  # fail early on a malformed string
        return parameters
    return json.dumps(parameters)


class InferenceResponse:
    """InferenceResponse(output_tensors=[...], error=None, parameters=None)."""

    def __init__(
        self,
        output_tensors: list[Tensor] | None = None,
        error: TritonError | None = None,
        parameters: dict[str, Any] | str | None = None,
    ) -> None:
        self._outputs = list(output_tensors or [])
        if error is not None and not isinstance(error, TritonError):
            error = TritonError(str(error))
        self._error = error
        self._parameters = _parameters_json(parameters)

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return self._parameters


class ResponseSender:
    """How a request of a decoupled model answers: send(response=None, flags=0) any number of
    times, the last with flags=TRITONSERVER_RESPONSE_COMPLETE_FINAL."""

    def __init__(self, key: int) -> None:
        self._key = key
        self._closed = False
        self._cancelled = False

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        if self._closed:
            raise TritonModelException("Unable to send response. Response sender has been closed.")
        if response is not None and not isinstance(response, InferenceResponse):
            raise TritonModelException("send() takes a pb_utils.InferenceResponse or None")
        if response is None and not flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            raise TritonModelException("a response sent without the final flag must not be None")
        if flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            self._closed = True
        _require_stub("ResponseSender.send").send_response(self._key, response, flags)

    def is_cancelled(self) -> bool:
        """Whether the server cancelled this request (its client went away): asks the server
        each time until the answer is True, which then stays."""
        if not self._cancelled:
            self._cancelled = _ask_cancelled(self._key)
        return self._cancelled


class InferenceTrace:
    """The trace of a request, as `request.trace()` gives it: `get_context()` is the W3C trace
    context the server propagates (a JSON string such as '{"traceparent": "00-..."}'), or None
    when the request is not traced. Pass it on as `InferenceRequest(..., trace=...)` and a BLS
    call joins the request's trace."""

    def __init__(self, context: dict[str, str] | None = None, key: int | None = None) -> None:
        self._context = context
        # The request the server knows this trace by (None: no request of this execute).
        self._key = key

    def get_context(self) -> str | None:
        return None if self._context is None else json.dumps(self._context)


class InferenceRequest:
    """A request the model receives in execute(), or one it builds to call another model (BLS):
    InferenceRequest(model_name=..., inputs=[...], requested_output_names=[...]) then .exec() or
    await .async_exec()."""

    def __init__(
        self,
        model_name: str = "",
        inputs: list[Tensor] | None = None,
        requested_output_names: list[str] | None = None,
        model_version: int = -1,
        request_id: str = "",
        correlation_id: int | str = 0,
        flags: int = 0,
        timeout: int = 0,
        preferred_memory: Any = None,
        trace: Any = None,
        parameters: dict[str, Any] | str | None = None,
    ) -> None:
        self._model_name = model_name
        self._inputs = list(inputs or [])
        self._requested = list(requested_output_names or [])
        self._model_version = model_version
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._flags = flags
        self._timeout = timeout
        self._parameters = _parameters_json(parameters)
        self._sender: ResponseSender | None = None
        # Set on the requests execute() receives: how the server knows this request.
        self._key: int | None = None
        self._cancelled = False
        self._trace = trace if isinstance(trace, InferenceTrace) else InferenceTrace()

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def timeout(self) -> int:
        return self._timeout

    def model_name(self) -> str:
        return self._model_name

    def model_version(self) -> int:
        return self._model_version

    def parameters(self) -> str:
        return self._parameters

    def requested_output_names(self) -> list[str]:
        return self._requested

    def trace(self) -> InferenceTrace:
        return self._trace

    def get_response_sender(self) -> ResponseSender:
        if self._sender is None:
            raise TritonModelException("this request has no response sender")
        return self._sender

    def is_cancelled(self) -> bool:
        """Whether the server cancelled this request (its client went away); always False for a
        request the model built itself (BLS)."""
        if not self._cancelled:
            self._cancelled = _ask_cancelled(self._key)
        return self._cancelled

    def exec(self, decoupled: bool = False) -> InferenceResponse | Iterator[InferenceResponse]:
        """Run this request on `model_name` through the server and wait for the answer; an
        error comes back as a response whose has_error() is true."""
        return _require_stub("InferenceRequest.exec").bls(self, decoupled)

    def async_exec(
        self, decoupled: bool = False
    ) -> Awaitable[InferenceResponse | Iterator[InferenceResponse]]:
        return _require_stub("InferenceRequest.async_exec").bls_async(self, decoupled)


# ---------------------------------------------------------------------------------------------
# Lookups


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    for tensor in inference_request.inputs():
        if tensor.name() == name:
            return tensor
    return None


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    for entry in model_config.get("input", []):
        if entry.get("name") == name:
            return entry
    return None


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    for entry in model_config.get("output", []):
        if entry.get("name") == name:
            return entry
    return None


# ---------------------------------------------------------------------------------------------
# Logging


class Logger:
    """Messages for the server's log, at Triton's levels."""

    class LogLevel:
        INFO = 0
        WARNING = 1
        ERROR = 2
        VERBOSE = 3

    @staticmethod
    def log(message: str, level: int = 0) -> None:
        if _stub is None:
            print(message, file=sys.stderr)
        else:
            _stub.log(level, str(message))

    @staticmethod
    def log_info(message: str) -> None:
        Logger.log(message, Logger.LogLevel.INFO)

    @staticmethod
    def log_warn(message: str) -> None:
        Logger.log(message, Logger.LogLevel.WARNING)

    @staticmethod
    def log_error(message: str) -> None:
        Logger.log(message, Logger.LogLevel.ERROR)

    @staticmethod
    def log_verbose(message: str) -> None:
        Logger.log(message, Logger.LogLevel.VERBOSE)


# ---------------------------------------------------------------------------------------------
# Auto-complete


class ModelConfig:
    """What a model's `auto_complete_config(auto_complete_model_config)` receives: the config as
    a dict (Triton's JSON form), with Triton's setters."""

    def __init__(self, model_config: dict[str, Any]) -> None:
        self._config = model_config

    def as_dict(self) -> dict[str, Any]:
        return self._config

    def set_max_batch_size(self, max_batch_size: int) -> None:
        if max_batch_size < 0:
            raise ValueError("max_batch_size must be >= 0")
        current = int(self._config.get("max_batch_size", 0) or 0)
        if current not in (0, max_batch_size):
            raise ValueError(
                f"configuration specified max_batch_size {current}, but in auto-complete-config "
                f"function for model '{self._config.get('name', '')}' specified "
                f"max_batch_size {max_batch_size}"
            )
        self._config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        if not self._config.get("dynamic_batching"):
            self._config["dynamic_batching"] = {}

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        policy = self._config.setdefault("model_transaction_policy", {})
        policy.update(transaction_policy_dict)

    def add_input(self, input: dict[str, Any]) -> None:
        self._add("input", input)

    def add_output(self, output: dict[str, Any]) -> None:
        self._add("output", output)

    def get_input(self, name: str) -> dict[str, Any] | None:
        return get_input_config_by_name(self._config, name)

    def get_output(self, name: str) -> dict[str, Any] | None:
        return get_output_config_by_name(self._config, name)

    def _add(self, kind: str, tensor: dict[str, Any]) -> None:
        if "name" not in tensor:
            raise ValueError(f"{kind} {tensor} has no 'name'")
        for key in tensor:
            if key not in ("name", "data_type", "dims", "optional", "is_shape_tensor"):
                raise ValueError(f"{kind} '{tensor['name']}' has an unknown property '{key}'")
        listed = self._config.setdefault(kind, [])
        for existing in listed:
            if existing.get("name") != tensor["name"]:
                continue
            for key, value in tensor.items():
                have = existing.get(key)
                if have in (None, "", [], "TYPE_INVALID"):
                    existing[key] = value
                elif key == "dims" and [int(d) for d in have] != [int(d) for d in value]:
                    raise ValueError(
                        f"model {kind} '{tensor['name']}' has dims {list(have)} in the config, "
                        f"but auto-complete gives {list(value)}"
                    )
                elif key == "data_type" and have != value:
                    raise ValueError(
                        f"model {kind} '{tensor['name']}' has data_type {have} in the config, "
                        f"but auto-complete gives {value}"
                    )
            return
        listed.append(dict(tensor))


def _require_stub(what: str) -> Any:
    if _stub is None:
        raise TritonModelException(f"{what} works only inside a model served by tritonactor")
    return _stub


def _ask_cancelled(key: int | None) -> bool:
    if key is None or _stub is None:
        return False
    return bool(_stub.is_cancelled(key))


def _error_code_name(code: int) -> str:
    return _CODE_NAMES.get(code, "INTERNAL")


def _error_code_number(name: str) -> int:
    return _CODE_NUMBERS.get(name, TritonError.INTERNAL)
