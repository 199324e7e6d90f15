"""Model control from a model (Triton's BLS model loading): `pb_utils.load_model`,
`unload_model` and `is_model_ready`, answered by the server's model manager; and
`get_model_dir`, the model's own folder."""

from __future__ import annotations

from typing import Any

from tritonactor.backends.python import _pb_runtime as runtime


def load_model(model_name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
    """Load (or reload) `model_name`, as the repository API's load does; `config` (JSON) and
    `files` ({"file:<version>/<name>": bytes}) override the repository's. Raises
    TritonModelException when the load fails."""
    _check_name(model_name)
    if not isinstance(config, str):
        raise TypeError(f"load_model config must be a JSON str, not {type(config).__name__}")
    runtime.require("load_model").control(
        "load", model_name, config=config, files=dict(files or {})
    )


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    _check_name(model_name)
    runtime.require("unload_model").control(
        "unload", model_name, unload_dependents=bool(unload_dependents)
    )


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    _check_name(model_name)
    if not isinstance(model_version, str):
        raise TypeError("is_model_ready model_version must be a str")
    answer: Any = runtime.require("is_model_ready").control(
        "ready", model_name, version=model_version
    )
    return bool(answer)


def get_model_dir() -> str:
    """The folder of the model's version, which holds its model.py (from `initialize`, and from
    `auto_complete_config`, as in Triton)."""
    return str(runtime.require("get_model_dir").model_dir)


def _check_name(model_name: Any) -> None:
    if not isinstance(model_name, str):
        raise TypeError(f"a model name must be a str, not {type(model_name).__name__}")
