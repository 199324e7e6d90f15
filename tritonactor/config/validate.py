"""The checks a model config must pass before a model loads, with Triton's words.

Triton refuses a config whose tensors, batching or instance groups cannot mean anything (a
dimension of 0, a reshape of another element count, a preferred batch size past
`max_batch_size`, a default priority level outside the levels, GPUs listed for a CPU group...)
and the model never loads; its other versions and the models around it are untouched. These
are those checks, on the complete config (auto-completed, defaults filled), each raising a
`ConfigError` whose message is Triton's for the same config, so that a load answers as
Triton's does (docs/model-config.md, "What a config must satisfy").

`io=False` leaves the inputs and outputs out, for a config whose backend would still complete
them (the python backend's `auto_complete_config`, which `repository inspect` does not run):
Triton checks them only after its backend has completed the config.
"""

from __future__ import annotations

from collections.abc import Sequence

from tritonactor._proto.inference import (
    BatchInputKind,
    BatchOutputKind,
    DataType,
    ModelConfig,
    ModelInput,
    ModelInputFormat,
    ModelInstanceGroupKind,
    ModelOutput,
    ModelQueuePolicyTimeoutAction,
    ModelSequenceBatchingControl,
    ModelSequenceBatchingControlKind,
)
from tritonactor.config.model_config import ConfigError
from tritonactor.config.normalize import BACKEND_PLATFORMS, PLATFORM_BACKENDS
from tritonactor.config.validate_ensemble import check_ensemble
from tritonactor.core.tensors import MAX_DIMS

__all__ = ["check_runtime", "validate_config"]

TENSORRT_PLATFORM = BACKEND_PLATFORMS["tensorrt"]
_WILDCARD = -1
_INT64_MAX = 2**63 - 1
_CORRID_TYPES = frozenset(
    {
        DataType.TYPE_UINT64,
        DataType.TYPE_INT64,
        DataType.TYPE_UINT32,
        DataType.TYPE_INT32,
        DataType.TYPE_STRING,
    }
)


def validate_config(config: ModelConfig, *, io: bool = True) -> None:
    """ConfigError, with Triton's message, for the first check the config fails."""
    _check_model(config)
    _check_instance_groups(config)
    if io:
        _check_io(config)


def check_runtime(config: ModelConfig, backend: str) -> None:
    """The config's `runtime`, which in Triton names the library (or, for a Python-based
    backend, the file) a backend is loaded from: tritonactor's backends are Python packages
    (`tritonactor.backends` entry points), so only the name of the model's own backend's
    library, `libtriton_<backend>.so`, is taken, and means that backend; any other is refused
    with Triton's words for a runtime it cannot find."""
    runtime = config.runtime
    if runtime and runtime != f"libtriton_{backend}.so":
        raise ConfigError(
            f"unable to find backend library '{runtime}' for model '{config.name}': "
            f"tritonactor's backends are Python packages; the runtime 'libtriton_{backend}.so' "
            f"names backend '{backend}', another cannot be loaded"
        )


def _check_model(config: ModelConfig) -> None:
    name = config.name
    if not name:
        raise ConfigError("model configuration must specify 'name'")
    # A platform with another of Triton's backends named is refused; any platform goes with a
    # backend Triton does not know (python, or one of the user's).
    known = config.backend in PLATFORM_BACKENDS.values()
    if known and config.platform and PLATFORM_BACKENDS.get(config.platform) != config.backend:
        raise ConfigError(
            f"unexpected 'platform' and 'backend' pair, got:{config.platform}, {config.backend}"
        )
    if config.max_batch_size < 0:
        raise ConfigError(f"'max_batch_size' must be non-negative value for {name}")
    dynamic = config.dynamic_batching
    if dynamic is not None:
        for size in dynamic.preferred_batch_size:
            if size <= 0:
                raise ConfigError(f"dynamic batching preferred size must be positive for {name}")
            if size > config.max_batch_size:
                raise ConfigError(
                    f"dynamic batching preferred size must be <= max batch size for {name}"
                )
        levels = dynamic.priority_levels
        if levels:
            if not 1 <= dynamic.default_priority_level <= levels:
                raise ConfigError(
                    f"default priority level must be in range [1, {levels}] for {name}"
                )
            for level in dynamic.priority_queue_policy:
                if not 1 <= level <= levels:
                    raise ConfigError(
                        "priority queue policy must have priority level in range "
                        f"[1, {levels}] for {name}"
                    )
        if dynamic.preserve_ordering:
            if levels > 1:
                raise ConfigError(
                    "Only one priority level is allowed when 'preserve_ordering' is true for "
                    + name
                )
            policies = [dynamic.default_queue_policy, *dynamic.priority_queue_policy.values()]
            for policy in policies:
                if (
                    policy is not None
                    and policy.default_timeout_microseconds
                    and policy.timeout_action == ModelQueuePolicyTimeoutAction.DELAY
                ):
                    raise ConfigError(
                        "Queue policy can not have DELAY as timeout action when "
                        f"'preserve_ordering' is true for {name}"
                    )
    sequence = config.sequence_batching
    if sequence is not None:
        _check_controls(config)
        if sequence.oldest is not None:
            for size in sequence.oldest.preferred_batch_size:
                if size <= 0:
                    raise ConfigError(
                        f"sequence batching preferred batch size must be positive for {name}"
                    )
                if size > config.max_batch_size:
                    raise ConfigError(
                        "sequence batching preferred batch size must be <= max batch size "
                        f"for {name}"
                    )
        if sequence.direct is not None:
            utilization = sequence.direct.minimum_slot_utilization
            if not 0.0 <= utilization <= 1.0:
                raise ConfigError(
                    "sequence batching minimum slot utilization must be in range (0.0, 1.0] "
                    f"for {name}"
                )
    # The response cache's rules (not with the sequence batcher, nor decoupled) are
    # cache/config.py's, which also knows an ensemble's steps.
    check_ensemble(config)
    agents = config.model_repository_agents
    if agents is not None and agents.agents:
        # Triton's words, where its agent library is missing; tritonactor has none (a model
        # meant to be checked or decrypted by one must not load without it).
        agent = agents.agents[0]
        raise ConfigError(
            f"unable to find 'libtritonrepoagent_{agent.name}.so' for repo agent "
            f"'{agent.name}': tritonactor has no repository agents"
        )
    if config.model_metrics is not None:
        for control in config.model_metrics.metric_control:
            if control.metric_identifier is None:
                raise ConfigError("metric control must specify 'metric_identifier'")
            if not control.metric_identifier.family:
                raise ConfigError("metric identifier must specify non-empty 'family'")
            if control.histogram_options is None:
                raise ConfigError("metric control must specify 'histogram_options'")
            if not control.histogram_options.buckets:
                raise ConfigError("histogram options must specify non-empty 'buckets'")


_BOOLEAN_KINDS = (
    ModelSequenceBatchingControlKind.CONTROL_SEQUENCE_START,
    ModelSequenceBatchingControlKind.CONTROL_SEQUENCE_END,
    ModelSequenceBatchingControlKind.CONTROL_SEQUENCE_READY,
)
_CORRID = ModelSequenceBatchingControlKind.CONTROL_SEQUENCE_CORRID


def _check_controls(config: ModelConfig) -> None:
    """The sequence batcher's control inputs, kind by kind as Triton takes them: named, each
    tensor once, each kind at most once; START, END and READY with their two values of one
    type, CORRID with none and of a type that can hold a correlation ID."""
    assert config.sequence_batching is not None
    name = config.name
    control_inputs = config.sequence_batching.control_input
    for kind in (*_BOOLEAN_KINDS, _CORRID):
        kind_name = kind.name
        seen: set[str] = set()
        found = False
        for control_input in control_inputs:
            if not control_input.name:
                raise ConfigError(f"sequence batching control tensor must have a name for {name}")
            if control_input.name in seen:
                raise ConfigError(
                    f"sequence batching control tensor '{control_input.name}' is specified for "
                    f"multiple control kinds for {name}"
                )
            seen.add(control_input.name)
            for control in control_input.control:
                if control.kind != kind:
                    continue
                if found:
                    raise ConfigError(
                        f"sequence batching specifies multiple {kind_name} tensors for {name}"
                    )
                found = True
                _check_control_values(control, kind_name, name)
    # Stricter than Triton, which takes these and then feeds the model one tensor twice:
    inputs = {tensor.name for tensor in config.input}
    for control_input in control_inputs:
        if len(control_input.control) > 1:
            raise ConfigError(
                f"sequence batching control tensor '{control_input.name}' has "
                f"{len(control_input.control)} controls for {name}; a tensor carries one"
            )
        if control_input.control and control_input.name in inputs:
            raise ConfigError(
                f"sequence batching control tensor '{control_input.name}' is also a model "
                f"input for {name}"
            )


def _check_control_values(control: ModelSequenceBatchingControl, kind: str, name: str) -> None:
    given = [
        (field, len(values))
        for field, values in (
            ("int32_false_true", control.int32_false_true),
            ("fp32_false_true", control.fp32_false_true),
            ("bool_false_true", control.bool_false_true),
        )
        if values
    ]
    if control.kind == _CORRID:
        if given:
            raise ConfigError(
                "sequence batching must not specify either 'int32_false_true', "
                f"'fp32_false_true' or 'bool_false_true' for {kind} for {name}"
            )
        if control.data_type not in _CORRID_TYPES:
            raise ConfigError(
                f"unexpected data type for control {kind} for {name}. Allowed data types are "
                "TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING"
            )
        return
    if not given:
        raise ConfigError(
            "sequence batching must specify either 'int32_false_true', 'fp32_false_true' or "
            f"'bool_false_true' for {kind} for {name}"
        )
    if len(given) > 1:
        raise ConfigError(
            "sequence batching specifies more than one from 'int32_false_true', "
            f"'fp32_false_true' and 'bool_false_true' for {kind} for {name}"
        )
    field, count = given[0]
    if count != 2:
        raise ConfigError(
            f"sequence batching control '{field}' must have exactly 2 entries for {kind} for {name}"
        )


def _check_io(config: ModelConfig) -> None:
    try:
        for tensor in config.input:
            _check_tensor(tensor, config.max_batch_size, "model input ")
            if tensor.format in (ModelInputFormat.NHWC, ModelInputFormat.NCHW) and (
                len(tensor.dims) != 3
            ):
                raise ConfigError("model input NHWC/NCHW require 3 dims")
            _check_platform_only(config, tensor, "input")
        for tensor in config.output:
            _check_tensor(tensor, config.max_batch_size, "model output ")
            _check_platform_only(config, tensor, "output")
        _check_batch_io(config)
    except ConfigError as error:
        raise ConfigError(f"{error} for {config.name}") from None


def _check_platform_only(config: ModelConfig, tensor: ModelInput | ModelOutput, kind: str) -> None:
    if config.platform == TENSORRT_PLATFORM:
        if tensor.is_non_linear_format_io and len(tensor.dims) != 3:
            raise ConfigError(f"Non-linear IO format {kind} requires 3 dims")
        return
    if tensor.is_shape_tensor:
        raise ConfigError("shape tensors are only supported for TensorRT platform")
    if tensor.is_non_linear_format_io:
        raise ConfigError("Non-linear IO format is only supported for the TensorRT platform")


def _check_tensor(tensor: ModelInput | ModelOutput, max_batch_size: int, prefix: str) -> None:
    """Triton's rules for a tensor's name, type, dims and reshape."""
    if not tensor.name:
        raise ConfigError(f"{prefix}must specify 'name'")
    where = f"{prefix}'{tensor.name}' "
    if tensor.data_type == DataType.TYPE_INVALID:
        raise ConfigError(f"{where}must specify 'data_type'")
    if not tensor.dims:
        raise ConfigError(f"{where}must specify 'dims'")
    reshape = tensor.reshape
    if reshape is not None and not reshape.shape and max_batch_size == 0:
        raise ConfigError(
            f"{where}cannot have empty reshape for non-batching model as scalar tensors are "
            "not supported"
        )
    for dim in tensor.dims:
        if dim < 1 and dim != _WILDCARD:
            raise ConfigError(
                f"{where}dimension must be integer >= 1, or -1 to indicate a variable-size "
                "dimension"
            )
    rank = max(len(tensor.dims), len(reshape.shape) if reshape is not None else 0)
    if rank + (max_batch_size > 0) > MAX_DIMS:
        # (Triton 2.51 loads such a python model, whose process then dies on its first request.)
        raise ConfigError(
            f"{where}has {rank} dimensions{' and the batch dimension' if max_batch_size else ''}"
            f": a tensor has at most {MAX_DIMS}"
        )
    if reshape is None:
        return
    for dim in reshape.shape:
        if dim < 1 and dim != _WILDCARD:
            raise ConfigError(
                f"{where}reshape dimensions must be integer >= 1, or -1 to indicate a "
                "variable-size dimension"
            )
    dims_count = _element_count(tensor.dims, f"{tensor.name} dims")
    reshape_count = _element_count(reshape.shape, f"{tensor.name} reshape")
    # An empty reshape (a scalar of a batching model) stands for dims of one element.
    if dims_count != reshape_count and (reshape_count != 0 or dims_count != 1):
        raise ConfigError(f"{where}has different size for dims and reshape")
    if dims_count == _WILDCARD:
        # Between (and around) the variable dimensions, the fixed ones must hold as many
        # elements in both: [2, 4, -1, 6] reshapes to [8, -1, 1, 6].
        dims_runs, reshape_runs = _runs(tensor.dims), _runs(reshape.shape)
        if len(dims_runs) != len(reshape_runs):
            raise ConfigError(
                f"{where}has different number of variable-size dimensions for dims and reshape"
            )
        if dims_runs != reshape_runs:
            raise ConfigError(f"{where}has different size for dims and reshape")


def _element_count(dims: Sequence[int], name: str) -> int:
    """Elements in `dims`: 0 for none, -1 where one is variable."""
    if _WILDCARD in dims:
        return _WILDCARD
    count = 0
    for index, dim in enumerate(dims):
        count = dim if index == 0 else count * dim
    if count > _INT64_MAX:
        raise ConfigError(f"element count for tensor '{name}' exceeds maximum size of {_INT64_MAX}")
    return count


def _runs(dims: Sequence[int]) -> list[int]:
    """The element counts of the fixed dimensions between the variable ones."""
    runs, current = [], 1
    for dim in dims:
        if dim == _WILDCARD:
            runs.append(current)
            current = 1
        else:
            current *= dim
    runs.append(current)
    return runs


def _check_batch_io(config: ModelConfig) -> None:
    inputs = {tensor.name for tensor in config.input}
    outputs = {tensor.name for tensor in config.output}
    for batch_input in config.batch_input:
        kind = BatchInputKind(batch_input.kind).name
        _check_source("input", kind, batch_input.source_input, inputs, batch_input.data_type)
    for batch_output in config.batch_output:
        kind = BatchOutputKind(batch_output.kind).name
        _check_source("output", kind, batch_output.source_input, inputs)
        targets: set[str] = set()
        for target in batch_output.target_name:
            if target not in outputs:
                raise ConfigError(f"unknown target output name '{target}'")
            if target in targets:
                raise ConfigError(f"target output name '{target}' can only be specified once")
            targets.add(target)


def _check_source(
    what: str,
    kind: str,
    sources: Sequence[str],
    inputs: set[str],
    datatype: DataType | None = None,
) -> None:
    """A batch input's or output's one source, a model input; a batch input's type."""
    if len(sources) != 1:
        raise ConfigError(f"batch {what} kind '{kind}' expects 1 source input, got {len(sources)}")
    if datatype is not None and datatype not in (DataType.TYPE_INT32, DataType.TYPE_FP32):
        raise ConfigError("batch input data type must be TYPE_INT32 or TYPE_FP32")
    for source in sources:
        if source not in inputs:
            raise ConfigError(f"unknown source input name '{source}'")


def _check_instance_groups(config: ModelConfig) -> None:
    """GPUs listed only where the kind uses them; profiles only for TensorRT (the GPU kinds'
    own checks, which need the count of GPUs, are normalize.py's; an ensemble has none:
    validate_ensemble.py refuses them)."""
    for group in config.instance_group:
        where = f"instance group {group.name} of model {config.name}"
        if group.kind == ModelInstanceGroupKind.MODEL and group.gpus:
            raise ConfigError(f"{where} has kind KIND_MODEL but specifies one or more GPUs")
        if group.kind == ModelInstanceGroupKind.CPU and group.gpus:
            raise ConfigError(f"{where} has kind KIND_CPU but specifies one or more GPUs")
        if group.profile and config.platform != TENSORRT_PLATFORM:
            raise ConfigError(
                f"{where} and platform {config.platform}specifies profile field which is only "
                "supported for TensorRT models"
            )
        for profile in group.profile:
            if not profile.isdigit():
                raise ConfigError(
                    f"{where} and platform {config.platform} specifies invalid profile "
                    f"{profile}. The field should contain the string representation of a "
                    "non-negative integer."
                )
    if config.instance_group and all(group.passive for group in config.instance_group):
        # Passive instances take no requests: nothing would serve the model's (Triton 2.51
        # loads such a model and crashes on its first request).
        raise ConfigError(
            f"every instance group of model {config.name} is passive: no instance would serve "
            "its requests"
        )
