"""From a model folder's config to the config its versions load with: the versions to load, the
backend, auto-complete and Triton's defaults, and the model file each version must hold.

Plain functions, so that the manager (which goes on to load) and `repository inspect` (which
only reports) hit the same errors with the same reason texts. Every file a config names is
checked here, before anything reads it: it must stay inside the model folder
(`core.paths.inside`; `confine_config` lists the names, see docs/confinement.md).
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from tritonactor._proto.inference import (
    ModelConfig,
    ModelInstanceGroup,
    ModelInstanceGroupKind,
    ModelOptimizationPolicy,
    ModelOptimizationPolicyPinnedMemoryBuffer,
)
from tritonactor.backends.base import Backend, ModelContext, version_file
from tritonactor.backends.python.backend import EXECUTION_ENV_PATH
from tritonactor.backends.registry import BackendRegistry
from tritonactor.config.model_config import ConfigError
from tritonactor.config.normalize import fill_defaults
from tritonactor.config.validate import check_runtime, validate_config
from tritonactor.control.repository import ModelSource, VersionSelection, version_path
from tritonactor.core.errors import TritonError
from tritonactor.core.paths import inside, outside_error
from tritonactor.scheduling.sequence_state import INITIAL_STATE_FOLDER
from tritonactor.scheduling.signature import label_description
from tritonactor.scheduling.warmup import WARMUP_FOLDER

__all__ = [
    "OperatorNames",
    "confine_config",
    "failure_reason",
    "missing_model_file",
    "missing_version_reason",
    "operator_names",
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
    caller_config: bool = False,
    repository_config: ModelConfig | None = None,
) -> tuple[Backend, ModelConfig]:
    """The backend and the complete config (auto-completed, Triton's defaults filled).

    `latest` is the version whose model file auto-complete reads. Backends named in
    `skip_auto_complete` keep the config as written, for callers that must not run what a
    backend's auto-complete runs (the python backend starts the model's own code).
    `caller_config`: the config came from an API caller (a load's config override), so every
    file name it changes must stay inside the model folder after resolving symlinks too.
    `repository_config`: the config it overrides, the repository's own (None for a file
    override, whose folder is the caller's): a name the caller's config gives as that one does
    keeps the operator's trust in links (`operator_names`). The names are checked before
    auto-complete reads (or runs) the model file, and again after.
    """
    trusted = None
    if caller_config and repository_config is not None:
        trusted = operator_names(model, repository_config, registry)
    confine_config(model, config, caller_config=caller_config, trusted=trusted)
    if caller_config:
        config = _without_old_ensemble_defaults(config)
    if strict and not model.has_config_file:
        raise ConfigError(
            f"model '{model.name}' has no config.pbtxt, and strict model configuration "
            "is on (TRITONACTOR_STRICT_MODEL_CONFIG) so it cannot be auto-completed"
        )
    name = registry.backend_name(config, model.path, list(model.versions))
    backend = registry.get(name)
    if not strict and name not in skip_auto_complete:
        config = backend.auto_complete_config(config, version_path(model, latest))
    config = fill_defaults(config, gpus, config.backend or name)
    # Triton checks the inputs and outputs once the backend has completed them.
    validate_config(config, io=strict or name not in skip_auto_complete)
    check_runtime(config, name)
    if config.ensemble_scheduling is None:  # an ensemble's backend stays "", as in Triton
        config.backend = config.backend or name
    config.default_model_filename = config.default_model_filename or backend.default_model_filename
    confine_config(model, config, caller_config=caller_config, trusted=trusted)
    return backend, config


def _without_old_ensemble_defaults(config: ModelConfig) -> ModelConfig:
    """An ensemble's config as tritonactor served it before 2026-12-07 (its `/config`, posted
    back as a load's override, and so kept in journals): without the backend name, the
    instance group and the optimization defaults it then filled in, which Triton, and now
    tritonactor, refuse in an ensemble's config. Only those exact values are dropped."""
    if config.ensemble_scheduling is None:
        return config
    config = ModelConfig.parse(bytes(config))
    if config.backend == "ensemble":
        config.backend = ""
    old_group = ModelInstanceGroup(
        name=f"{config.name}_0", count=1, kind=ModelInstanceGroupKind.CPU
    )
    if config.instance_group == [old_group]:
        config.instance_group = []
    pinned = ModelOptimizationPolicyPinnedMemoryBuffer(enable=True)
    old_optimization = ModelOptimizationPolicy(
        input_pinned_memory=pinned, output_pinned_memory=pinned
    )
    if config.optimization == old_optimization:
        config.optimization = None
    return config


@dataclass(frozen=True, slots=True)
class OperatorNames:
    """The file names a repository's own config gives, by kind of file. A caller's config
    that gives one of them for the same kind (restating the operator's config, or part of it)
    goes through the links the operator placed, as the repository's config does; any other
    name a caller gives is held to the strict rule (docs/confinement.md)."""

    model_files: frozenset[str] = frozenset()
    labels: frozenset[str] = frozenset()
    warmup_files: frozenset[str] = frozenset()
    state_files: frozenset[str] = frozenset()


def operator_names(
    model: ModelSource, config: ModelConfig, registry: BackendRegistry
) -> OperatorNames:
    """The names the repository's own `config` of `model` gives: its model file (the default
    of its backend when it names none), `cc_model_filenames`, label files, warmup data files
    and initial-state files."""
    model_files = {config.default_model_filename, *config.cc_model_filenames.values()}
    if not config.default_model_filename:
        try:
            name = registry.backend_name(config, model.path, list(model.versions))
            model_files.add(registry.get(name).default_model_filename)
        except TritonError:
            pass  # no backend of its own: no default name to trust
    sequence = config.sequence_batching
    return OperatorNames(
        model_files=frozenset(filter(None, model_files)),
        labels=frozenset(o.label_filename for o in config.output if o.label_filename),
        warmup_files=frozenset(
            spec.input_data_file
            for warmup in config.model_warmup
            for spec in warmup.inputs.values()
            if spec.input_data_file
        ),
        state_files=frozenset(
            initial.data_file
            for state in (sequence.state if sequence is not None else ())
            for initial in state.initial_state
            if initial.data_file
        ),
    )


_MODEL_DIRECTORY_VARIABLE = "$$TRITON_MODEL_DIRECTORY"


def confine_config(
    model: ModelSource,
    config: ModelConfig,
    *,
    caller_config: bool,
    trusted: OperatorNames | None = None,
) -> None:
    """Refuse (INVALID_ARG, one wording) a config that names a file outside the model folder:
    the model file of each version (and `cc_model_filenames`), output label files, warmup
    input files, initial sequence-state files; and, for a config an API caller supplied, the
    python backend's EXECUTION_ENV_PATH and accelerator or session parameters that name files.
    Names from the repository's own config.pbtxt may go through symlinks an operator placed
    in the repository, and so may a caller's name that the repository's config gives too
    (`trusted`); any other name of a caller's may not leave the folder even that way."""
    folder = model.path
    names = trusted if trusted is not None else OperatorNames()

    def trust(name: str, given: frozenset[str]) -> bool:
        return not caller_config or name in given

    filenames = [config.default_model_filename, *config.cc_model_filenames.values()]
    for filename in filter(None, filenames):
        for version in model.versions:
            inside(
                folder,
                f"{version}/{filename.lstrip('/')}",
                what=f"default_model_filename {_quoted(filename)}",
                trust_links=trust(filename, names.model_files),
            )
    for output in config.output:
        if output.label_filename:
            inside(
                folder,
                output.label_filename,
                what=label_description(output.name, output.label_filename),
                trust_links=trust(output.label_filename, names.labels),
            )
    for warmup in config.model_warmup:
        for input_name, spec in warmup.inputs.items():
            if spec.input_data_file:
                inside(
                    folder / WARMUP_FOLDER,
                    spec.input_data_file,
                    what=f"warmup {_quoted(warmup.name)}, input {_quoted(input_name)}: "
                    f"input_data_file {_quoted(spec.input_data_file)}",
                    where=f"the model's {WARMUP_FOLDER} folder",
                    trust_links=trust(spec.input_data_file, names.warmup_files),
                )
    sequence = config.sequence_batching
    for state in sequence.state if sequence is not None else ():
        for initial in state.initial_state:
            if initial.data_file:
                inside(
                    folder / INITIAL_STATE_FOLDER,
                    initial.data_file,
                    what=f"state {_quoted(state.input_name)}: initial_state data_file "
                    f"{_quoted(initial.data_file)}",
                    where=f"the model's {INITIAL_STATE_FOLDER} folder",
                    trust_links=trust(initial.data_file, names.state_files),
                )
    if caller_config:
        _confine_caller_parameters(folder, config)


def _confine_caller_parameters(folder: Path, config: ModelConfig) -> None:
    """What only a caller's config is held to: parameters a backend reads as a file or folder
    (an operator's config.pbtxt may name shared environments and caches anywhere)."""
    parameter = config.parameters.get(EXECUTION_ENV_PATH)
    value = parameter.string_value.strip() if parameter is not None else ""
    if value:
        value = value.replace(_MODEL_DIRECTORY_VARIABLE, str(folder))
        _absolute_inside(folder, value, f"{EXECUTION_ENV_PATH} {_quoted(value)}")
    optimization = config.optimization
    accelerators = optimization.execution_accelerators if optimization is not None else None
    if accelerators is not None:
        for accelerator in (
            *accelerators.gpu_execution_accelerator,
            *accelerators.cpu_execution_accelerator,
        ):
            for key, text in accelerator.parameters.items():
                if key.endswith("table_name"):
                    # A file name in the engine cache folder (trt_int8_calibration_table_name).
                    if "/" in text or text in ("", ".", ".."):
                        raise outside_error(f"accelerator parameter '{key}' {_quoted(text)}")
                elif _names_a_file(key):
                    what = f"accelerator parameter '{key}' {_quoted(text)}"
                    _absolute_inside(folder, text, what)
    for key, parameter in config.parameters.items():
        if key.startswith("session.") and _names_a_file(key):
            what = f"parameter '{key}' {_quoted(parameter.string_value)}"
            _absolute_inside(folder, parameter.string_value, what)


def _names_a_file(key: str) -> bool:
    # onnxruntime's TensorRT options (trt_engine_cache_path, trt_timing_cache_path,
    # trt_ep_context_file_path) and session entries such as
    # session.optimized_model_external_initializers_file_name; `trt_profile_*` are shapes.
    words = set(re.split(r"[_.]", key.lower()))
    return bool(words & {"path", "file", "filename", "dir", "directory"})


def _absolute_inside(folder: Path, value: str, what: str) -> None:
    """A backend reads `value` as a path of its own (absolute, or relative to the server's
    working directory): it must be an absolute path inside `folder`, links resolved."""
    if not value or not os.path.isabs(value):
        raise outside_error(what)
    relative = os.path.relpath(os.path.normpath(value), os.path.normpath(folder))
    if relative == ".." or relative.startswith("../"):
        raise outside_error(what)
    inside(folder, relative, what=what)


def _quoted(text: str) -> str:
    return f"'{text}'" if text.isprintable() else repr(text)


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
        model_path=model_file(model, config.default_model_filename, version),
    )


def model_file(model: ModelSource, filename: str, version: int) -> Path:
    """Where `version`'s model file `filename` is (`backends.base.version_file`)."""
    return version_file(version_path(model, version), filename)


def missing_model_file(model: ModelSource, config: ModelConfig, version: int) -> str | None:
    """Why `version` cannot load because its model file is absent, or None when it is there.

    `config` is the prepared one: its default_model_filename is set unless the backend reads no
    file (an ensemble).
    """
    filename = config.default_model_filename
    if not filename:
        return None
    path = model_file(model, filename, version)
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
