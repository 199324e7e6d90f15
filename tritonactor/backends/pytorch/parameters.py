"""The model parameters the PyTorch backend reads (`INFERENCE_MODE`, thread counts, ...) and
those of Triton's pytorch backend it accepts but does not act on."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from tritonactor._proto.inference import ModelConfig
from tritonactor.core.errors import invalid_arg

# The package's name, as before the split: log lines keep naming the backend the same way.
log = logging.getLogger("tritonactor.backends.pytorch")

# Model parameters Triton's pytorch backend knows that this one does not act on.
_IGNORED_PARAMETERS = (
    "ENABLE_NVFUSER",
    "ENABLE_JIT_EXECUTOR",
    "ENABLE_JIT_PROFILING",
    "ENABLE_TENSOR_FUSER",
)


@dataclass(frozen=True, slots=True)
class _Settings:
    inference_mode: bool = True
    disable_optimized_execution: bool = False
    intra_op_threads: int = 0  # 0: leave torch's choice
    inter_op_threads: int = 0
    cache_cleaning: bool = False
    weight_sharing: bool = False


def _bool_parameter(model: str, parameters: Mapping[str, str], key: str, default: bool) -> bool:
    text = parameters.get(key)
    if text is None:
        return default
    value = text.strip().lower()
    if value in ("true", "1", "yes", "on"):
        return True
    if value in ("false", "0", "no", "off"):
        return False
    raise invalid_arg(f"model '{model}' parameter {key} must be true or false, not {text!r}")


def _int_parameter(model: str, parameters: Mapping[str, str], key: str) -> int:
    text = parameters.get(key)
    if text is None:
        return 0
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise invalid_arg(f"model '{model}' parameter {key} must be an integer >= 0, not {text!r}")
    return value


def _settings(config: ModelConfig, model: str) -> _Settings:
    parameters = {key: value.string_value for key, value in config.parameters.items()}
    for key in _IGNORED_PARAMETERS:
        if key in parameters:
            log.warning("model '%s': parameter %s is not supported and is ignored", model, key)
    return _Settings(
        inference_mode=_bool_parameter(model, parameters, "INFERENCE_MODE", True),
        disable_optimized_execution=_bool_parameter(
            model, parameters, "DISABLE_OPTIMIZED_EXECUTION", False
        ),
        intra_op_threads=_int_parameter(model, parameters, "INTRA_OP_THREAD_COUNT"),
        inter_op_threads=_int_parameter(model, parameters, "INTER_OP_THREAD_COUNT"),
        cache_cleaning=_bool_parameter(model, parameters, "ENABLE_CACHE_CLEANING", False),
        weight_sharing=_bool_parameter(model, parameters, "ENABLE_WEIGHT_SHARING", False),
    )
