"""Data types, errors and tensors of `triton_python_backend_utils` (re-exported there; models
never import this module by its own name). Runs in the stub process: standard library and numpy
only, besides tritonactor's own datatypes.

Argument checks follow Triton's bindings: a wrong type (None for a name, a list...) raises
TypeError, as pybind11 does; a value Triton's C++ side refuses raises TritonModelException."""

from __future__ import annotations

from typing import Any

import numpy as np

from tritonactor.core.datatypes import (
    deserialize_bytes,
    from_numpy_dtype,
    serialize_bytes,
    to_numpy_dtype,
)
from tritonactor.core.errors import ErrorCode

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


def triton_to_numpy_type(data_type: int) -> Any:
    """TRITONSERVER_DataType number -> numpy type (None for BF16 and unknown numbers)."""
    if 1 <= data_type <= len(_TRITON_TYPES):
        return _TRITON_TYPES[data_type - 1][1]
    return None


def numpy_to_triton_type(data_type: Any) -> int | None:
    """A numpy type (or dtype equal to one) -> TRITONSERVER_DataType number; None for anything
    else (Python's `bool`, `str`, a dtype's name, `U` and sized `S` dtypes), as Triton's: the
    type is compared with each numpy type, BYTES being `np.object_` or `np.bytes_`."""
    for number, (name, numpy_type) in enumerate(_TRITON_TYPES, start=1):
        if numpy_type is None:
            continue
        if data_type == numpy_type or (name == "BYTES" and data_type == np.bytes_):
            return number
    return None


# A config's data type -> the numpy type Triton's pb_utils gives for it (its TYPE_BOOL: Python's
# bool); a name not here is a KeyError, as in Triton.
TRITON_STRING_TO_NUMPY: dict[str, Any] = {
    "TYPE_BOOL": bool,
    **{
        f"TYPE_{name}": numpy_type
        for name, numpy_type in _TRITON_TYPES
        if name not in ("BOOL", "BYTES", "BF16")
    },
    "TYPE_STRING": np.object_,
}


def triton_string_to_numpy(triton_type_string: str) -> Any:
    """A config data type ("TYPE_FP32", "TYPE_STRING") -> numpy type."""
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def serialize_byte_tensor(input_tensor: np.ndarray) -> bytes | tuple[()] | None:
    """An object (bytes, or anything str() can render) or `S` array -> Triton's BYTES wire form
    as `bytes`: each element length-prefixed (4-byte little-endian), in C order. As Triton's:
    an empty array gives `()`, an array of any other type None."""
    if input_tensor.size == 0:
        return ()
    if input_tensor.dtype.kind not in ("O", "S"):
        return None
    return serialize_bytes(input_tensor)


def deserialize_bytes_tensor(encoded_tensor: bytes) -> np.ndarray:
    """Triton's BYTES wire form -> a 1-D object array of bytes."""
    return deserialize_bytes(encoded_tensor)


# ---------------------------------------------------------------------------------------------
# Errors


class TritonModelException(Exception):
    """Raised by this module when model code asks for something that cannot be done."""


class TritonError(Exception):
    """An error a response carries: TritonError(message, code=TritonError.INTERNAL)."""

    UNKNOWN = ErrorCode.UNKNOWN
    INTERNAL = ErrorCode.INTERNAL
    NOT_FOUND = ErrorCode.NOT_FOUND
    INVALID_ARG = ErrorCode.INVALID_ARG
    UNAVAILABLE = ErrorCode.UNAVAILABLE
    UNSUPPORTED = ErrorCode.UNSUPPORTED
    ALREADY_EXISTS = ErrorCode.ALREADY_EXISTS
    CANCELLED = ErrorCode.CANCELLED

    def __init__(self, message: str, code: int = ErrorCode.INTERNAL) -> None:
        if isinstance(message, bytes):  # Triton's bindings take bytes as the text they hold
            message = message.decode("utf-8", errors="replace")
        if not isinstance(message, str):
            raise TypeError(f"TritonError message must be a str, not {type(message).__name__}")
        if code is None or isinstance(code, bool) or not isinstance(code, int):
            raise TypeError(f"TritonError code must be a TritonError code, not {code!r}")
        try:
            code = ErrorCode(code)
        except ValueError:
            raise TypeError(f"{code} is not a TritonError code") from None
        super().__init__(message)
        self._message = message
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> ErrorCode:
        return self._code

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, code={self._code.name})"


def error_code_name(code: int) -> str:
    """The name the wire carries for a code (the server's ErrorCode has the same names)."""
    try:
        return ErrorCode(code).name
    except ValueError:
        return ErrorCode.INTERNAL.name


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

    def __init__(self, name: str, data: Any, dtype: Any = None) -> None:
        if isinstance(name, bytes):  # Triton's bindings take bytes as the text they hold
            name = name.decode("utf-8", errors="replace")
        if not isinstance(name, str):
            raise TypeError(f"Tensor name must be a str, not {type(name).__name__}")
        if not name:
            raise TritonModelException("Tensor name cannot be an empty string.")
        if data is None:
            raise TypeError(f"tensor '{name}': the data must be a numpy array, not None")
        if not isinstance(data, np.ndarray):
            try:
                data = np.asarray(data)
            except Exception as exc:
                raise TypeError(
                    f"tensor '{name}': cannot make a numpy array of it: {exc}"
                ) from None
        if data.dtype.kind in ("S", "U"):
            data = data.astype(np.object_)
        elif data.dtype.kind != "O":
            try:
                from_numpy_dtype(data.dtype)
            except ValueError:  # raised here, where the model can catch it (Triton's words)
                raise TritonModelException("NumPy dtype is not supported.") from None
        self._name = name
        self._array = data

    @classmethod
    def _wrap(cls, name: str, array: np.ndarray) -> Tensor:
        """A tensor the server sent (a numpy array of a wire datatype): nothing to check."""
        self = cls.__new__(cls)
        self._name = name
        self._array = array
        return self

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def triton_dtype(self) -> int | None:
        """The tensor's TRITONSERVER_DataType number (BF16 included)."""
        try:
            return _NUMBER_OF_WIRE[from_numpy_dtype(self._array.dtype)]
        except ValueError:
            return None

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self) -> Any:
        array = self._array
        if array.dtype == np.object_:
            raise TritonModelException("a BYTES tensor cannot be exported as DLPack")
        if array.dtype.name == "bfloat16":
            # numpy has no DLPack type for it: torch's bfloat16 tensor over the same memory
            # (how Triton's python models read BF16).
            torch = _torch(self._name, "numpy has no DLPack type for BF16")
            return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16).__dlpack__()
        return array.__dlpack__()

    def __dlpack__(self, stream: Any = None) -> Any:
        return self.to_dlpack()

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)

    @staticmethod
    def from_dlpack(name: str, dlpack_tensor: Any) -> Tensor:
        """From a DLPack capsule or any object with `__dlpack__` (a torch tensor, a numpy
        array...). GPU tensors are copied to the CPU through torch when it is installed."""
        if not isinstance(name, str) or not name:
            raise TritonModelException("Tensor.from_dlpack needs a non-empty tensor name")
        if dlpack_tensor is None:
            raise TritonModelException(f"tensor '{name}': from_dlpack was given None")
        if hasattr(dlpack_tensor, "__dlpack__"):
            device = getattr(dlpack_tensor, "__dlpack_device__", lambda: (1, 0))()
            if device[0] == 1:
                try:
                    return Tensor(name, np.from_dlpack(dlpack_tensor))
                except (BufferError, RuntimeError):  # a type numpy has none for (BF16)
                    pass
            # A GPU tensor, or a BF16 one: through torch, to the host.
            torch = _torch(name, "not a DLPack tensor numpy can read")
            return Tensor(name, _host_array(torch, torch.from_dlpack(dlpack_tensor)))
        try:
            return Tensor(name, np.from_dlpack(_Capsule(dlpack_tensor)))
        except Exception:
            torch = _torch(name, "not a DLPack tensor numpy can read")
            return Tensor(name, _host_array(torch, torch.utils.dlpack.from_dlpack(dlpack_tensor)))

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, shape={self.shape()}, dtype={self._array.dtype})"


def _torch(name: str, what: str) -> Any:
    try:
        import torch
    except ImportError:
        raise TritonModelException(f"tensor '{name}': {what}, and torch is not installed") from None
    return torch


def _host_array(torch: Any, tensor: Any) -> np.ndarray:
    """A torch tensor's data on the host as numpy (BF16 as ml_dtypes' bfloat16, viewed)."""
    tensor = tensor.cpu()
    if tensor.dtype == torch.bfloat16:
        bfloat16 = to_numpy_dtype("BF16")  # a KeyError without ml_dtypes: BF16 is unreadable
        return tensor.view(torch.int16).numpy().view(bfloat16)
    return tensor.numpy()


def check_tensors(tensors: Any, what: str, none_inside: str = "") -> list[Tensor]:
    """A list of Tensors as Triton's bindings take it: None itself is a TypeError, a None
    inside a TritonModelException (`none_inside`: its words, where Triton's are known)."""
    if tensors is None or isinstance(tensors, str | bytes) or not hasattr(tensors, "__iter__"):
        raise TypeError(f"{what} must be a list of pb_utils.Tensor, not {type(tensors).__name__}")
    checked = list(tensors)
    for tensor in checked:
        if tensor is None:
            raise TritonModelException(
                none_inside or f"{what} holds None where a pb_utils.Tensor is expected"
            )
        if not isinstance(tensor, Tensor):
            raise TypeError(
                f"{what} must hold pb_utils.Tensor objects, not {type(tensor).__name__}"
            )
    return checked
