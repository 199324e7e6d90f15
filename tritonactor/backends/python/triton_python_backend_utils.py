"""`triton_python_backend_utils`, as model code imports it (`import triton_python_backend_utils as
pb_utils`): the classes and helpers Triton's python backend documents, with the same names and
behaviour. Inside a stub process the stub connects them to the server (`_pb_runtime`); imported
anywhere else, the data classes and helpers work and BLS, response senders and the logger's
server side do not.

The names live in modules of their own by subject (`_pb_tensors`, `_pb_inference`,
`_pb_config`, `_pb_logger`, `_pb_metrics`, `_pb_models`); this module is the one models see.
"""

from __future__ import annotations

from tritonactor.backends.python._pb_config import (
    ModelConfig,
    get_input_config_by_name,
    get_input_tensor_by_name,
    get_output_config_by_name,
    get_output_tensor_by_name,
    using_decoupled_model_transaction_policy,
)
from tritonactor.backends.python._pb_inference import (
    TRITONSERVER_MEMORY_CPU,
    TRITONSERVER_MEMORY_GPU,
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_END,
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
    TRITONSERVER_REQUEST_RELEASE_ALL,
    TRITONSERVER_REQUEST_RELEASE_RESCHEDULE,
    TRITONSERVER_RESPONSE_COMPLETE_FINAL,
    InferenceRequest,
    InferenceResponse,
    InferenceTrace,
    PreferredMemory,
    ResponseSender,
)
from tritonactor.backends.python._pb_logger import Logger
from tritonactor.backends.python._pb_metrics import Metric, MetricFamily
from tritonactor.backends.python._pb_models import (
    get_model_dir,
    is_model_ready,
    load_model,
    unload_model,
)
from tritonactor.backends.python._pb_tensors import (
    TRITON_STRING_TO_NUMPY,
    TYPE_INVALID,
    Tensor,
    TritonError,
    TritonModelException,
    deserialize_bytes_tensor,
    numpy_to_triton_type,
    serialize_byte_tensor,
    triton_string_to_numpy,
    triton_to_numpy_type,
)

# Triton's name for the sender class (`InferenceResponseSender` in c_python_backend_utils).
InferenceResponseSender = ResponseSender

__all__ = [
    "TRITONSERVER_MEMORY_CPU",
    "TRITONSERVER_MEMORY_GPU",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_REQUEST_RELEASE_ALL",
    "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
    "TRITON_STRING_TO_NUMPY",
    "TYPE_INVALID",
    "InferenceRequest",
    "InferenceResponse",
    "InferenceResponseSender",
    "InferenceTrace",
    "Logger",
    "Metric",
    "MetricFamily",
    "ModelConfig",
    "PreferredMemory",
    "ResponseSender",
    "Tensor",
    "TritonError",
    "TritonModelException",
    "deserialize_bytes_tensor",
    "get_input_config_by_name",
    "get_input_tensor_by_name",
    "get_model_dir",
    "get_output_config_by_name",
    "get_output_tensor_by_name",
    "is_model_ready",
    "load_model",
    "numpy_to_triton_type",
    "serialize_byte_tensor",
    "triton_string_to_numpy",
    "triton_to_numpy_type",
    "unload_model",
    "using_decoupled_model_transaction_policy",
]
