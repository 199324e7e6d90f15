"""The python backend: `model.py` files written for Triton's python backend, each instance in a
stub process of its own (`instance.PythonInstance`, `stub`).

`--backend-config=python,<setting>=<value>` settings are read when the first model loads
(`process.StubSettings`)."""

from __future__ import annotations

import json
import logging
import os
import sys
from functools import cached_property
from pathlib import Path

from tritonactor._proto.inference import ModelConfig
from tritonactor.backends.base import (
    Backend,
    BackendModel,
    InstanceContext,
    ModelContext,
    version_file,
)
from tritonactor.backends.python.instance import PythonInstance
from tritonactor.backends.python.process import StubProcess, StubSettings, exit_description
from tritonactor.config.model_config import ConfigError, config_from_json, config_to_json
from tritonactor.core.errors import TritonError, invalid_arg, unsupported

__all__ = ["PythonBackend", "PythonInstance", "PythonModel", "exit_description", "interpreter_for"]

log = logging.getLogger(__name__)

MODEL_FILENAME = "model.py"
EXECUTION_ENV_PATH = "EXECUTION_ENV_PATH"
FORCE_CPU_ONLY_INPUT_TENSORS = "FORCE_CPU_ONLY_INPUT_TENSORS"


def interpreter_for(config: ModelConfig, model_dir: Path) -> str:
    """The Python that runs the model: the config's EXECUTION_ENV_PATH parameter (a Python
    executable, or a virtual environment's folder), else the server's own."""
    parameter = config.parameters.get(EXECUTION_ENV_PATH)
    value = parameter.string_value.strip() if parameter is not None else ""
    if not value:
        return sys.executable
    path = Path(value.replace("$$TRITON_MODEL_DIRECTORY", str(model_dir)))
    if path.is_dir():
        for candidate in (path / "bin" / "python3", path / "bin" / "python"):
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
        raise invalid_arg(
            f"model '{config.name}': {EXECUTION_ENV_PATH} {path} is a folder without "
            "bin/python3 or bin/python"
        )
    if path.is_file() and os.access(path, os.X_OK):
        return str(path)
    if path.name.endswith((".tar.gz", ".tgz")):
        raise invalid_arg(
            f"model '{config.name}': {EXECUTION_ENV_PATH} {path} is a packed environment; "
            "tritonactor needs an unpacked one (a venv folder or a python executable)"
        )
    raise invalid_arg(
        f"model '{config.name}': {EXECUTION_ENV_PATH} {path} is neither a python executable "
        "nor a virtual environment"
    )


class PythonBackend(Backend):
    """Triton's python backend: `model.py` defining `TritonPythonModel`."""

    name = "python"
    default_model_filename = MODEL_FILENAME

    @cached_property
    def settings(self) -> StubSettings:
        """The `--backend-config=python,...` settings (read once, when first needed)."""
        return StubSettings.from_backend_config(getattr(self, "backend_config", {}))

    def initialize(self) -> None:
        self.settings  # noqa: B018 - a malformed setting fails the backend at once

    def auto_complete_config(self, config: ModelConfig, version_dir: Path) -> ModelConfig:
        path = version_file(version_dir, config.default_model_filename or MODEL_FILENAME)
        if not path.is_file():
            return config  # the load says the file is missing, in Triton's words
        if (config.input or config.output) and not _mentions_auto_complete(path):
            return config  # spare a process start for the common case
        try:
            stub = StubProcess(
                interpreter_for(config, version_dir.parent),
                f"{config.name}_auto_complete",
                self.settings,
            )
        except TritonError as exc:
            raise invalid_arg(
                f"model '{config.name}': auto_complete_config failed: {exc.message}"
            ) from None
        try:
            stub.channel.send(
                {"op": "auto_complete", "config": config_to_json(config), "model_file": str(path)}
            )
            reply = stub.wait_for("auto_completed")
        except TritonError as exc:
            raise invalid_arg(
                f"model '{config.name}': auto_complete_config failed: {exc.message}"
            ) from None
        finally:
            stub.stop(self.settings.start_timeout_s)
        if reply["config"] is None:
            return config
        try:
            return config_from_json(reply["config"])
        except ConfigError as exc:
            raise invalid_arg(
                f"model '{config.name}': auto_complete_config gave an invalid config: {exc}"
            ) from None

    def load_model(self, context: ModelContext) -> PythonModel:
        force_cpu = context.config.parameters.get(FORCE_CPU_ONLY_INPUT_TENSORS)
        if force_cpu is not None and force_cpu.string_value not in ("yes", "no"):
            # Triton's python backend's words, its stray quote mark included. Either value
            # means the same here: without GPUs a model's inputs are always in CPU memory.
            raise unsupported(
                f"Incorrect value for {FORCE_CPU_ONLY_INPUT_TENSORS}: {force_cpu.string_value}'"
            )
        if not context.model_path.is_file():
            raise invalid_arg(
                f"model '{context.name}' version {context.version}: no python model file at "
                f"{context.model_path}"
            )
        return PythonModel(
            context, interpreter_for(context.config, context.model_dir), self.settings
        )


class PythonModel(BackendModel):
    def __init__(
        self, context: ModelContext, interpreter: str, settings: StubSettings | None = None
    ) -> None:
        self.context = context
        self.interpreter = interpreter
        self.settings = settings or StubSettings()
        config = context.config
        self.config_json = json.dumps(config_to_json(config))
        policy = config.model_transaction_policy
        self.decoupled = bool(policy is not None and policy.decoupled)
        # A request that names no outputs asks for all of these (the model sees their names).
        self.output_names = [output.name for output in config.output]
        # The processes of the instances being created (`abort_create` kills one).
        self.starting: dict[str, StubProcess] = {}

    def create_instance(self, context: InstanceContext) -> PythonInstance:
        """Start a stub and initialize the model in it; may be called again for a new instance
        after one died."""
        return PythonInstance(self, context)

    def abort_create(self, context: InstanceContext) -> None:
        """Kill the process of the instance being created: its `initialize` is cut short, and
        the creation fails (a model whose `initialize` never returns held the server's exit)."""
        stub = self.starting.get(context.name)
        if stub is not None:
            stub.process.kill()

    def initialize_args(self, context: InstanceContext) -> dict[str, str]:
        """Triton's `args` for `TritonPythonModel.initialize`: every value a string."""
        return {
            "model_config": self.config_json,
            "model_instance_kind": context.kind.removeprefix("KIND_"),
            "model_instance_name": context.name,
            "model_instance_device_id": str(context.device_id),
            "model_repository": str(self.context.model_dir),
            "model_version": str(self.context.version),
            "model_name": self.context.name,
        }


def _mentions_auto_complete(model_file: Path) -> bool:
    """Whether model.py, or a python file of its model's folder (a base class it imports from
    beside it may define the method), names `auto_complete_config`: where none does, the model
    cannot have one but from an installed package (then its config names no input or output,
    and the process starts all the same: `auto_complete_config`). Hidden folders are skipped."""

    def names_it(file: Path) -> bool:
        try:
            return "auto_complete_config" in file.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return False

    if names_it(model_file):
        return True
    for folder, subfolders, files in os.walk(model_file.parent.parent):
        subfolders[:] = [name for name in subfolders if not name.startswith(".")]
        for name in files:
            file = Path(folder, name)
            if name.endswith(".py") and file != model_file and names_it(file):
                return True
    return False
