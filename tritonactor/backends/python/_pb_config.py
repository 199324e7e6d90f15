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

    @property
    def _name(self) -> str:
        return str(self._config.get("name", ""))

    def set_max_batch_size(self, max_batch_size: int) -> None:
        """Raise the config's max_batch_size to `max_batch_size`; a config that gives a larger
        one refuses it (Triton's rule and words)."""
        current = int(self._config.get("max_batch_size", 0) or 0)
        if current > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {current}, but in auto-complete-config "
                f"function for model '{self._name}' specified max_batch_size {max_batch_size}"
            )
        self._config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        for scheduler in ("sequence_batching", "ensemble_scheduling"):
            if scheduler in self._config:
                raise ValueError(
                    f"Configuration specified scheduling_choice as '{scheduler}', but "
                    f"auto-complete-config function for model '{self._name}' tries to set "
                    "scheduling_choice as 'dynamic_batching'"
                )
        self._config.setdefault("dynamic_batching", {})

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        if any(key != "decoupled" for key in transaction_policy_dict):
            raise ValueError(
                "model transaction property in auto-complete-config function for model "
                f"'{self._name}' contains property other than 'decoupled'."
            )
        policy = self._config.setdefault("model_transaction_policy", {})
        if "decoupled" not in transaction_policy_dict:
            return
        wanted = transaction_policy_dict["decoupled"]
        if "decoupled" in policy and policy["decoupled"] != wanted:
            raise ValueError(
                "trying to change decoupled property in auto-complete-config for model "
                f"'{self._name}', which is already set to '{policy['decoupled']}'."
            )
        policy["decoupled"] = wanted

    def add_input(self, input: dict[str, Any]) -> None:
        self._add("input", input, ("name", "data_type", "dims", "optional"))

    def add_output(self, output: dict[str, Any]) -> None:
        self._add("output", output, ("name", "data_type", "dims"))

    def get_input(self, name: str) -> dict[str, Any] | None:
        return get_input_config_by_name(self._config, name)

    def get_output(self, name: str) -> dict[str, Any] | None:
        return get_output_config_by_name(self._config, name)

    def _add(self, kind: str, tensor: dict[str, Any], properties: tuple[str, ...]) -> None:
        """Add `tensor` to the config's inputs or outputs, or complete the one of its name,
        with Triton's checks and words: only `properties`, all of them but `optional`, and
        nothing that contradicts what the config says."""
        where = f"in auto-complete-config function for model '{self._name}'"
        if any(key not in properties for key in tensor):
            allowed = ", ".join(f"'{key}'" for key in properties[:-1])
            raise ValueError(
                f"{kind} '{tensor.get('name')}' {where} contains property other than "
                f"{allowed} and '{properties[-1]}'."
            )
        if "name" not in tensor:
            raise ValueError(f"{kind} {where} is missing 'name' property.")
        name = tensor["name"]
        for required in ("data_type", "dims"):
            if required not in tensor:
                raise ValueError(f"{kind} '{name}' {where} is missing '{required}' property.")
        listed = self._config.setdefault(kind, [])
        existing = next((entry for entry in listed if entry.get("name") == name), None)
        if existing is None:
            listed.append(tensor)
            return
        have_type = existing.get("data_type", "TYPE_INVALID")
        if have_type not in ("TYPE_INVALID", "", None) and have_type != tensor["data_type"]:
            raise ValueError(
                f"unable to load model '{self._name}', configuration expects datatype "
                f"{have_type} for {kind} '{name}', model provides {tensor['data_type']}"
            )
        have_dims = [int(dim) for dim in existing.get("dims") or ()]
        dims = [int(dim) for dim in tensor["dims"]]
        if have_dims and have_dims != dims:
            raise ValueError(
                f"model '{self._name}', tensor '{name}': the model expects dims {dims} but the "
                f"model configuration specifies dims {have_dims}"
            )
        optional = tensor.get("optional")
        if "optional" in tensor and "optional" in existing and existing["optional"] != optional:
            raise ValueError(
                f"model '{self._name}', tensor '{name}': the model expects optional "
                f"{optional} but the model configuration specifies optional "
                f"{existing['optional']}"
            )
        existing["data_type"] = tensor["data_type"]
        existing["dims"] = tensor["dims"]
        if "optional" in tensor:
            existing["optional"] = tensor["optional"]
