"""Session settings for the ONNX Runtime backend: the thread counts, execution mode, graph
optimization level, memory arena and pattern and `session.*` entries a config asks of every
session, checked once at load, and the execution providers each instance asks for (CUDA,
TensorRT with its options in Triton's names, OpenVINO, the CPU).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import onnxruntime as ort

from tritonactor._proto.inference import ModelConfig
from tritonactor.core.errors import invalid_arg, unavailable

# The logger the backend had as one module, kept so that its log lines read the same.
log = logging.getLogger("tritonactor.backends.onnxruntime")

_CPU = "CPUExecutionProvider"
_CUDA = "CUDAExecutionProvider"
_TENSORRT = "TensorrtExecutionProvider"
_OPENVINO = "OpenVINOExecutionProvider"

# Triton's documented `optimization { graph { level } }` values for its onnxruntime backend;
# unset (0) leaves onnxruntime's own default, every optimization.
_GRAPH_LEVELS: dict[int, ort.GraphOptimizationLevel] = {
    -1: ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    0: ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    1: ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    2: ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
}

# Triton's names for TensorRT accelerator parameters -> the TensorRT provider's option names.
# Parameters already spelled `trt_*` pass through unchanged.
_TENSORRT_OPTIONS: dict[str, str] = {
    "max_workspace_size_bytes": "trt_max_workspace_size",
    "max_partition_iterations": "trt_max_partition_iterations",
    "minimum_segment_size": "trt_min_subgraph_size",
    "int8_calibration_table_name": "trt_int8_calibration_table_name",
    "int8_use_native_calibration_table": "trt_int8_use_native_calibration_table",
}


@dataclass(frozen=True, slots=True)
class _SessionSettings:
    """What the config asks of every session, parsed once at load so mistakes fail the load."""

    intra_op_threads: int
    inter_op_threads: int
    execution_mode: ort.ExecutionMode
    graph_level: ort.GraphOptimizationLevel
    enable_mem_arena: bool
    enable_mem_pattern: bool
    config_entries: tuple[tuple[str, str], ...]
    gpu_accelerators: tuple[tuple[str, dict[str, str]], ...]
    cpu_accelerators: tuple[tuple[str, dict[str, str]], ...]

    def session_options(self) -> ort.SessionOptions:
        options = ort.SessionOptions()
        options.intra_op_num_threads = self.intra_op_threads
        options.inter_op_num_threads = self.inter_op_threads
        options.execution_mode = self.execution_mode
        options.graph_optimization_level = self.graph_level
        options.enable_cpu_mem_arena = self.enable_mem_arena
        options.enable_mem_pattern = self.enable_mem_pattern
        for key, value in self.config_entries:
            options.add_session_config_entry(key, value)
        return options


def _int_parameter(model: str, parameters: Mapping[str, str], key: str, default: int) -> int:
    text = parameters.get(key)
    if text is None or text.strip() == "":
        return default
    try:
        return int(text)
    except ValueError:
        raise invalid_arg(
            f"model '{model}' parameter '{key}' must be an integer, not {text!r}"
        ) from None


def _session_settings(config: ModelConfig, model: str) -> _SessionSettings:
    parameters = {key: value.string_value for key, value in config.parameters.items()}
    intra = _int_parameter(model, parameters, "intra_op_thread_count", 0)
    inter = _int_parameter(model, parameters, "inter_op_thread_count", 0)
    if intra < 0 or inter < 0:
        raise invalid_arg(f"model '{model}' thread counts must be >= 0")
    mode = _int_parameter(model, parameters, "execution_mode", 0)
    if mode not in (0, 1):
        raise invalid_arg(
            f"model '{model}' parameter 'execution_mode' must be 0 (sequential) or 1 (parallel), "
            f"not {mode}"
        )
    level = 0
    gpu: tuple[tuple[str, dict[str, str]], ...] = ()
    cpu: tuple[tuple[str, dict[str, str]], ...] = ()
    optimization = config.optimization
    if optimization is not None:
        if optimization.graph is not None:
            level = optimization.graph.level
        accelerators = optimization.execution_accelerators
        if accelerators is not None:
            gpu = tuple(
                (a.name, dict(a.parameters)) for a in accelerators.gpu_execution_accelerator
            )
            cpu = tuple(
                (a.name, dict(a.parameters)) for a in accelerators.cpu_execution_accelerator
            )
    graph_level = _GRAPH_LEVELS.get(level)
    if graph_level is None:
        # Triton loads such a config with every optimization on; so do we, but say so.
        log.warning("model '%s': unknown optimization.graph.level %d; using all", model, level)
        graph_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    for name, options in gpu:
        if name == "tensorrt":
            _tensorrt_options(model, options)  # fail the load on a bad parameter
        elif name != "cuda":
            raise invalid_arg(
                f"model '{model}' names unknown gpu_execution_accelerator '{name}'; "
                "this backend knows 'tensorrt' and 'cuda'"
            )
    for name, _ in cpu:
        if name != "openvino":
            raise invalid_arg(
                f"model '{model}' names unknown cpu_execution_accelerator '{name}'; "
                "this backend knows 'openvino'"
            )
    return _SessionSettings(
        intra_op_threads=intra,
        inter_op_threads=inter,
        execution_mode=ort.ExecutionMode.ORT_PARALLEL if mode else ort.ExecutionMode.ORT_SEQUENTIAL,
        graph_level=graph_level,
        enable_mem_arena=_int_parameter(model, parameters, "enable_mem_arena", 1) != 0,
        enable_mem_pattern=_int_parameter(model, parameters, "enable_mem_pattern", 1) != 0,
        config_entries=_config_entries(parameters),
        gpu_accelerators=gpu,
        cpu_accelerators=cpu,
    )


# Unlike onnxruntime's default, idle intra-op threads sleep instead of spinning: spinning
# threads take a core the event loop and the other instances need, for no throughput gain when
# requests arrive one at a time. A model can turn spinning back on with this parameter.
_DEFAULT_ENTRIES = {"session.intra_op.allow_spinning": "0"}


def _config_entries(parameters: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """Triton hands `session.*` model parameters to onnxruntime as session config entries."""
    given = {key: value for key, value in parameters.items() if key.startswith("session.")}
    return tuple(sorted({**_DEFAULT_ENTRIES, **given}.items()))


def _tensorrt_options(model: str, parameters: Mapping[str, str]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for key, value in parameters.items():
        if key == "precision_mode":
            precision = value.upper()
            if precision == "FP16":
                options["trt_fp16_enable"] = True
            elif precision == "INT8":
                options["trt_int8_enable"] = True
            elif precision != "FP32":
                raise invalid_arg(
                    f"model '{model}' TensorRT precision_mode must be FP32, FP16 or INT8, "
                    f"not {value!r}"
                )
        elif key in _TENSORRT_OPTIONS:
            options[_TENSORRT_OPTIONS[key]] = value
        elif key.startswith("trt_"):
            options[key] = value
        else:
            raise invalid_arg(f"model '{model}' has unknown TensorRT accelerator parameter '{key}'")
    return options


def _providers(
    model: str, kind: str, device_id: int, settings: _SessionSettings
) -> tuple[list[tuple[str, dict[str, Any]]], str]:
    """The execution providers for an instance, and the one that must end up in the session."""
    available = ort.get_available_providers()
    if kind == "KIND_AUTO":
        kind = "KIND_GPU" if _CUDA in available else "KIND_CPU"
    if kind == "KIND_GPU":
        if _CUDA not in available:
            raise unavailable(
                f"model '{model}': instance group KIND_GPU needs the CUDA execution provider; "
                f"this onnxruntime offers {available} (install onnxruntime-gpu, or use KIND_CPU)"
            )
        providers: list[tuple[str, dict[str, Any]]] = []
        cuda_options: dict[str, Any] = {"device_id": device_id}
        for name, parameters in settings.gpu_accelerators:
            if name == "tensorrt":
                if _TENSORRT not in available:
                    raise unavailable(
                        f"model '{model}' asks for the TensorRT accelerator; "
                        f"this onnxruntime offers {available}"
                    )
                trt = {"device_id": device_id, **_tensorrt_options(model, parameters)}
                providers.append((_TENSORRT, trt))
            else:  # "cuda": its parameters are CUDA provider options
                cuda_options.update(parameters)
        providers.append((_CUDA, cuda_options))
        providers.append((_CPU, {}))
        return providers, _CUDA
    providers = []
    for _, parameters in settings.cpu_accelerators:  # only "openvino" survives validation
        if _OPENVINO not in available:
            raise unavailable(
                f"model '{model}' asks for the OpenVINO accelerator; "
                f"this onnxruntime offers {available}"
            )
        providers.append((_OPENVINO, dict(parameters)))
    providers.append((_CPU, {}))
    return providers, providers[0][0]
