"""From a model folder's config to the config its versions load with: the versions to load, the
backend, auto-complete and Triton's defaults, and the model file each version must hold.

Plain functions, so that the manager (which goes on to load) and `repository inspect` (which
only reports) hit the same errors with the same reason texts.
"""

from __future__ import annotations

from collections.abc import Collection

from tritonactor._proto.inference import ModelConfig
from tritonactor.backends.base import Backend, ModelContext
from tritonactor.backends.registry import BackendRegistry
from tritonactor.config.model_config import ConfigError
from tritonactor.config.normalize import fill_defaults
from tritonactor.control.repository import ModelSource, VersionSelection, version_path
from tritonactor.core.errors import TritonError

__all__ = [
    "failure_reason",
    "missing_model_file",
    "missing_version_reason",
    "prepare_config",
    "require_versions",
]


def require_versions(name: str, selection: VersionSelection) -> tuple[int, ...]:
    """The selected versions; a policy that selects none fails the load, as in Triton."""
    if not selection.versions:
        raise ConfigError(
            f"at least one version must be available under the version policy of model '{name}'"
        )
    return selection.versions


def missing_version_reason(name: str, version: int) -> str:
    """What to warn about for a `specific` version with no folder (the others still load)."""
    return f"version {version} is specified for model '{name}', but its folder is not present"


def prepare_config(
    model: ModelSource,
    config: ModelConfig,
    registry: BackendRegistry,
    *,
    strict: bool,
    latest: int,
    gpus: int,
    skip_auto_complete: Collection[str] = (),
) -> tuple[Backend, ModelConfig]:
    """The backend and the complete config (auto-completed, Triton's defaults filled).

    `latest` is the version whose model file auto-complete reads. Backends named in
    `skip_auto_complete` keep the config as written, for callers that must not run what a
    backend's auto-complete runs (the python backend starts the model's own code).
    """
    if strict and not model.has_config_file:
        raise ConfigError(
            f"model '{model.name}' has no config.pbtxt, and strict model configuration "
            "is on (TRITONACTOR_STRICT_MODEL_CONFIG) so it cannot be auto-completed"
        )
    name = registry.backend_name(config, model.path, list(model.versions))
    backend = registry.get(name)
    if not strict and name not in skip_auto_complete:
        config = backend.auto_complete_config(config, version_path(model, latest))
    config = fill_defaults(config, gpus)
    config.backend = config.backend or name
    config.default_model_filename = config.default_model_filename or backend.default_model_filename
    return backend, config


def model_context(model: ModelSource, config: ModelConfig, version: int) -> ModelContext:
    """What a backend is given to load (or check) `version` of `model` with its prepared
    `config`."""
    directory = version_path(model, version)
    return ModelContext(
        name=model.name,
        version=version,
        config=config,
        model_dir=model.path,
        version_dir=directory,
        model_path=directory / config.default_model_filename,
    )


def missing_model_file(model: ModelSource, config: ModelConfig, version: int) -> str | None:
    """Why `version` cannot load because its model file is absent, or None when it is there.

    `config` is the prepared one: its default_model_filename is set unless the backend reads no
    file (an ensemble).
    """
    filename = config.default_model_filename
    if not filename:
        return None
    path = version_path(model, version) / filename
    if path.exists():
        return None
    return f"unable to find '{path}' for model '{model.name}'"


def failure_reason(error: BaseException) -> str:
    """The text a failed load reports: a TritonError's or ConfigError's own message, otherwise
    the exception's type too, since a bare message from an unexpected error rarely says enough."""
    if isinstance(error, TritonError):
        return error.message
    if isinstance(error, ConfigError):
        return str(error)
    return f"{type(error).__name__}: {error}"
