"""Config helpers of `triton_python_backend_utils` (re-exported there): lookups in the model
config `initialize` receives, and the object `auto_complete_config` works on."""

from __future__ import annotations

import json
from typing import Any

from tritonactor.backends.python._pb_inference import InferenceRequest, InferenceResponse
from tritonactor.backends.python._pb_tensors import Tensor


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


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    """Whether the config (the dict `json.loads(args["model_config"])` gives) makes the model
    decoupled."""
    policy = model_config.get("model_transaction_policy") or {}
    return bool(policy.get("decoupled", False))


# ---------------------------------------------------------------------------------------------
# Auto-complete


class ModelConfig:
    """What a model's `auto_complete_config(auto_complete_model_config)` receives: the config as
    a dict (Triton's JSON form), with Triton's setters."""

    def __init__(self, model_config: dict[str, Any] | str) -> None:
        if isinstance(model_config, str):  # Triton hands it over as JSON text
            model_config = json.loads(model_config)
        self._config = model_config

    @property
    def _model_config(self) -> dict[str, Any]:  # Triton's attribute name, which models peek at
        return self._config

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
