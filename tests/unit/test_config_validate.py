"""The checks a config must pass to load (config/validate.py), each against the message real
Triton 2.51 gave for the same config: every case below was loaded on `tritonserver` (explicit
mode, a python model) and on tritonactor, and the messages compared (docs/model-config.md).
"""

from __future__ import annotations

import pytest

from tritonactor.config.model_config import ConfigError, config_from_json, parse_pbtxt
from tritonactor.config.normalize import fill_defaults
from tritonactor.config.validate import check_runtime, validate_config
from tritonactor.control.prepare import _without_old_ensemble_defaults

FIXED = "data_type: TYPE_FP32 dims: [ 16 ]"


def io(inp: str = FIXED, out: str = FIXED) -> str:
    return f'input [ {{ name: "INPUT0" {inp} }} ]\noutput [ {{ name: "OUTPUT0" {out} }} ]\n'


IO = io()
FOR_DIMS = "dimension must be integer >= 1, or -1 to indicate a variable-size dimension"
RESHAPE = "has different size for dims and reshape"

# (model name, what follows `max_batch_size`, Triton's message less its " for <model>")
REFUSED = [
    ("dims_zero", io(inp="data_type: TYPE_FP32 dims: [ 0 ]"), f"model input 'INPUT0' {FOR_DIMS}"),
    (
        "dims_neg2",
        io(out="data_type: TYPE_FP32 dims: [ 4, -2 ]"),
        f"model output 'OUTPUT0' {FOR_DIMS}",
    ),
    ("dims_none", io(inp="data_type: TYPE_FP32"), "model input 'INPUT0' must specify 'dims'"),
    ("no_dtype", io(out="dims: [ 16 ]"), "model output 'OUTPUT0' must specify 'data_type'"),
    (
        "no_name",
        "input [ { data_type: TYPE_FP32 dims: [ 16 ] } ]\n"
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]\n',
        "model input must specify 'name'",
    ),
    (
        "reshape_count",
        io(inp=f"{FIXED} reshape: {{ shape: [ 3 ] }}"),
        f"model input 'INPUT0' {RESHAPE}",
    ),
    (
        "reshape_zero",
        io(inp=f"{FIXED} reshape: {{ shape: [ 0 ] }}"),
        "model input 'INPUT0' reshape dimensions must be integer >= 1, or -1 to indicate a "
        "variable-size dimension",
    ),
    (
        "reshape_empty_batch_bad",
        io(inp="data_type: TYPE_FP32 dims: [ 2 ] reshape: { shape: [ ] }"),
        f"model input 'INPUT0' {RESHAPE}",
    ),
    (
        "reshape_wild_count",
        io(inp="data_type: TYPE_FP32 dims: [ 2, -1, -1 ] reshape: { shape: [ 2, -1 ] }"),
        "model input 'INPUT0' has different number of variable-size dimensions for dims and "
        "reshape",
    ),
    (
        "reshape_wild_size",
        io(inp="data_type: TYPE_FP32 dims: [ 2, -1, 3 ] reshape: { shape: [ 3, -1, 2 ] }"),
        f"model input 'INPUT0' {RESHAPE}",
    ),
    (
        "reshape_wild_vs_fixed",
        io(inp="data_type: TYPE_FP32 dims: [ -1 ] reshape: { shape: [ 16 ] }"),
        f"model input 'INPUT0' {RESHAPE}",
    ),
    (
        "pref_gt_max",
        IO + "dynamic_batching { preferred_batch_size: [ 16 ] }",
        "dynamic batching preferred size must be <= max batch size",
    ),
    (
        "pref_zero",
        IO + "dynamic_batching { preferred_batch_size: [ 0 ] }",
        "dynamic batching preferred size must be positive",
    ),
    (
        "prio_default_out",
        IO + "dynamic_batching { priority_levels: 2 default_priority_level: 3 }",
        "default priority level must be in range [1, 2]",
    ),
    (
        "prio_default_zero",
        IO + "dynamic_batching { priority_levels: 2 }",
        "default priority level must be in range [1, 2]",
    ),
    (
        "prio_policy_out",
        IO + "dynamic_batching { priority_levels: 2 default_priority_level: 1 "
        "priority_queue_policy { key: 3 value: { max_queue_size: 1 } } }",
        "priority queue policy must have priority level in range [1, 2]",
    ),
    (
        "order_levels",
        IO + "dynamic_batching { preserve_ordering: true priority_levels: 2 "
        "default_priority_level: 1 }",
        "Only one priority level is allowed when 'preserve_ordering' is true",
    ),
    (
        "order_delay",
        IO + "dynamic_batching { preserve_ordering: true default_queue_policy "
        "{ timeout_action: DELAY default_timeout_microseconds: 100 } }",
        "Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true",
    ),
    (
        "seq_oldest_pref",
        IO + "sequence_batching { oldest { max_candidate_sequences: 4 "
        "preferred_batch_size: [ 9 ] } }",
        "sequence batching preferred batch size must be <= max batch size",
    ),
    (
        "seq_direct_util",
        IO + "sequence_batching { direct { minimum_slot_utilization: 1.5 } }",
        "sequence batching minimum slot utilization must be in range (0.0, 1.0]",
    ),
    (
        "group_cpu_gpus",
        IO + "instance_group [ { kind: KIND_CPU gpus: [ 0 ] } ]",
        "instance group group_cpu_gpus_0 of model group_cpu_gpus has kind KIND_CPU but "
        "specifies one or more GPUs",
    ),
    (
        "group_model_gpus",
        IO + "instance_group [ { kind: KIND_MODEL gpus: [ 0 ] } ]",
        "instance group group_model_gpus_0 of model group_model_gpus has kind KIND_MODEL but "
        "specifies one or more GPUs",
    ),
    (
        "group_profile",
        IO + 'instance_group [ { kind: KIND_CPU profile: [ "0" ] } ]',
        "instance group group_profile_0 of model group_profile and platform specifies profile "
        "field which is only supported for TensorRT models",
    ),
    (
        "shape_tensor",
        io(inp="data_type: TYPE_INT32 dims: [ 1 ] is_shape_tensor: true"),
        "shape tensors are only supported for TensorRT platform",
    ),
    (
        "nhwc_dims",
        io(inp=f"{FIXED} format: FORMAT_NHWC"),
        "model input NHWC/NCHW require 3 dims",
    ),
    (
        "batch_input_sources",
        IO + 'batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "X" data_type: TYPE_INT32 } ]',
        "batch input kind 'BATCH_ELEMENT_COUNT' expects 1 source input, got 0",
    ),
    (
        "batch_input_type",
        IO + 'batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "X" '
        'data_type: TYPE_INT64 source_input: "INPUT0" } ]',
        "batch input data type must be TYPE_INT32 or TYPE_FP32",
    ),
    (
        "batch_input_unknown",
        IO + 'batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "X" '
        'data_type: TYPE_INT32 source_input: "NOPE" } ]',
        "unknown source input name 'NOPE'",
    ),
    (
        "batch_output_target",
        IO + "batch_output [ { kind: BATCH_SCATTER_WITH_INPUT_SHAPE "
        'target_name: "NOPE" source_input: "INPUT0" } ]',
        "unknown target output name 'NOPE'",
    ),
    (
        "batch_output_twice",
        IO + "batch_output [ { kind: BATCH_SCATTER_WITH_INPUT_SHAPE "
        'target_name: [ "OUTPUT0", "OUTPUT0" ] source_input: "INPUT0" } ]',
        "target output name 'OUTPUT0' can only be specified once",
    ),
]


def seq(controls: str) -> str:
    return IO + f"sequence_batching {{ control_input [ {controls} ] }}"


START = "control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ]"
CORRID = "control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ]"
VALUES = "'int32_false_true', 'fp32_false_true'"
REFUSED += [
    ("sq_noname", seq(f"{{ {START} }}"), "sequence batching control tensor must have a name"),
    (
        "sq_twostart",
        seq(f'{{ name: "S" {START} }}, {{ name: "S2" {START} }}'),
        "sequence batching specifies multiple CONTROL_SEQUENCE_START tensors",
    ),
    (
        "sq_novalues",
        seq('{ name: "S" control [ { kind: CONTROL_SEQUENCE_START } ] }'),
        f"sequence batching must specify either {VALUES} or 'bool_false_true' for "
        "CONTROL_SEQUENCE_START",
    ),
    (
        "sq_bothvalues",
        seq(
            '{ name: "S" control [ { kind: CONTROL_SEQUENCE_START '
            "int32_false_true: [ 0, 1 ] fp32_false_true: [ 0, 1 ] } ] }"
        ),
        "sequence batching specifies more than one from 'int32_false_true', 'fp32_false_true' "
        "and 'bool_false_true' for CONTROL_SEQUENCE_START",
    ),
    (
        "sq_three",
        seq(
            '{ name: "S" control [ { kind: CONTROL_SEQUENCE_START '
            "int32_false_true: [ 0, 1, 2 ] } ] }"
        ),
        "sequence batching control 'int32_false_true' must have exactly 2 entries for "
        "CONTROL_SEQUENCE_START",
    ),
    (
        "sq_fp32_one",
        seq('{ name: "S" control [ { kind: CONTROL_SEQUENCE_READY fp32_false_true: [ 1 ] } ] }'),
        "sequence batching control 'fp32_false_true' must have exactly 2 entries for "
        "CONTROL_SEQUENCE_READY",
    ),
    (
        "sq_bool_three",
        seq(
            '{ name: "S" control [ { kind: CONTROL_SEQUENCE_END '
            "bool_false_true: [ false, true, true ] } ] }"
        ),
        "sequence batching control 'bool_false_true' must have exactly 2 entries for "
        "CONTROL_SEQUENCE_END",
    ),
    (
        "sq_corrid_values",
        seq(
            '{ name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 '
            "int32_false_true: [ 0, 1 ] } ] }"
        ),
        f"sequence batching must not specify either {VALUES} or 'bool_false_true' for "
        "CONTROL_SEQUENCE_CORRID",
    ),
    (
        "sq_twocorrid",
        seq(f'{{ name: "C" {CORRID} }}, {{ name: "C2" {CORRID} }}'),
        "sequence batching specifies multiple CONTROL_SEQUENCE_CORRID tensors",
    ),
    (
        "sq_corrid_noname",
        seq(f"{{ {CORRID} }}"),
        "sequence batching control tensor must have a name",
    ),
    (
        "sq_start_and_corrid_same",
        seq(f'{{ name: "S" {START} }}, {{ name: "S" {CORRID} }}'),
        "sequence batching control tensor 'S' is specified for multiple control kinds",
    ),
    # Stricter than Triton, which serves these: one tensor given two controls (the model sees
    # one of the two values), and a control named as a model input, which Triton then feeds
    # the control's value in place of the client's tensor.
    (
        "sq_twokinds",
        seq(
            '{ name: "S" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }, '
            "{ kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] }"
        ),
        "sequence batching control tensor 'S' has 2 controls for sq_twokinds; a tensor carries one",
    ),
    (
        "sq_is_input",
        seq(f'{{ name: "INPUT0" {START} }}'),
        "sequence batching control tensor 'INPUT0' is also a model input",
    ),
]

# Triton's words for these end with no " for <model>".
WHOLE = {"group_cpu_gpus", "group_model_gpus", "group_profile", "sq_twokinds"}


def config(name: str, body: str, max_batch_size: int = 8) -> str:
    return f'name: "{name}"\nbackend: "python"\nmax_batch_size: {max_batch_size}\n{body}\n'


def check(text: str) -> None:
    validate_config(fill_defaults(parse_pbtxt(text), gpus=0))


@pytest.mark.parametrize(("name", "body", "message"), REFUSED, ids=[c[0] for c in REFUSED])
def test_refused_with_tritons_message(name: str, body: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        check(config(name, body))
    assert str(caught.value) == (message if name in WHOLE else f"{message} for {name}")


def test_refused_with_tritons_message_whole() -> None:
    corrid = (
        'sequence_batching { control_input [ { name: "CORRID" control [ '
        "{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_FP32 } ] } ] }"
    )
    with pytest.raises(ConfigError) as caught:
        check(config("seq_corrid_fp32", IO + corrid))
    assert str(caught.value) == (
        "unexpected data type for control CONTROL_SEQUENCE_CORRID for seq_corrid_fp32. "
        "Allowed data types are TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and "
        "TYPE_STRING"
    )
    with pytest.raises(ConfigError) as caught:
        check(config("mbs_negative", IO, max_batch_size=-1))
    assert str(caught.value) == "'max_batch_size' must be non-negative value for mbs_negative"
    empty = io(inp="data_type: TYPE_FP32 dims: [ 1 ] reshape: { shape: [ ] }")
    with pytest.raises(ConfigError) as caught:
        check(config("reshape_empty_nobatch", empty, max_batch_size=0))
    assert str(caught.value) == (
        "model input 'INPUT0' cannot have empty reshape for non-batching model as scalar "
        "tensors are not supported for reshape_empty_nobatch"
    )


@pytest.mark.parametrize(
    "body",
    [
        IO,
        # a scalar of a batching model: dims [1] reshaped to nothing
        io(inp="data_type: TYPE_FP32 dims: [ 1 ] reshape: { shape: [ ] }"),
        # the runs between the variable dimensions hold as many elements: 2*4 = 8, 6 = 1*6
        io(inp="data_type: TYPE_FP32 dims: [ 2, 4, -1, 6 ] reshape: { shape: [ 8, -1, 1, 6 ] }"),
        IO + "dynamic_batching { preferred_batch_size: [ 4, 8 ] priority_levels: 2 "
        "default_priority_level: 2 priority_queue_policy { key: 1 value: { } } }",
        IO + "sequence_batching { direct { minimum_slot_utilization: 1.0 } }",
        IO + "instance_group [ { kind: KIND_MODEL } ]",
    ],
)
def test_accepted_as_triton_accepts(body: str) -> None:
    check(config("ok", body))


def test_io_left_for_the_backend_to_complete() -> None:
    """`io=False` (a python model whose auto_complete_config has not run) checks the rest."""
    no_dims = config("m", io(inp="data_type: TYPE_FP32"))
    validate_config(fill_defaults(parse_pbtxt(no_dims), gpus=0), io=False)
    with pytest.raises(ConfigError, match="must specify 'dims'"):
        validate_config(fill_defaults(parse_pbtxt(no_dims), gpus=0))
    bad_batching = config(
        "m", io(inp="data_type: TYPE_FP32") + "dynamic_batching { preferred_batch_size: 9 }"
    )
    with pytest.raises(ConfigError, match="preferred size must be <= max batch size"):
        validate_config(fill_defaults(parse_pbtxt(bad_batching), gpus=0), io=False)


def test_a_platform_of_another_of_tritons_backends_is_refused() -> None:
    """Triton's pair check: a platform with one of its own backends must be that backend's;
    any platform goes with one it does not know (python, or a user's)."""
    mismatched = 'name: "m" platform: "onnxruntime_onnx" backend: "pytorch"'
    with pytest.raises(ConfigError) as caught:
        check(mismatched)
    assert str(caught.value) == (
        "unexpected 'platform' and 'backend' pair, got:onnxruntime_onnx, pytorch"
    )
    check('name: "m" platform: "onnxruntime_onnx" backend: "python"')
    check('name: "m" platform: "pytorch_libtorch" backend: "pytorch"')


def test_a_runtime_names_the_models_own_backend_or_is_refused() -> None:
    config = parse_pbtxt('name: "m" runtime: "libtriton_python.so"')
    check_runtime(config, "python")
    with pytest.raises(ConfigError) as caught:
        check_runtime(parse_pbtxt('name: "m" runtime: "nope.py"'), "python")
    assert str(caught.value).startswith("unable to find backend library 'nope.py' for model 'm'")


def test_repository_agents_are_refused() -> None:
    agents = IO + 'model_repository_agents { agents [ { name: "checksum" } ] }'
    with pytest.raises(ConfigError) as caught:
        check(config("m", agents))
    assert str(caught.value) == (
        "unable to find 'libtritonrepoagent_checksum.so' for repo agent 'checksum': "
        "tritonactor has no repository agents"
    )


def test_an_ensemble_with_a_backend_is_refused() -> None:
    with pytest.raises(ConfigError) as caught:
        check('name: "e" platform: "ensemble" backend: "python"')
    assert str(caught.value) == (
        "Ensemble model 'e' must have platform type 'ensemble' and empty backend type"
    )


# An ensemble's /config as tritonactor served it before 2026-12-07, posted back as a load's
# override (and so kept in journals): what it filled in then is dropped, not refused.
OLD_SERVED_ENSEMBLE = {
    "name": "e",
    "platform": "ensemble",
    "backend": "ensemble",
    "max_batch_size": 8,
    "input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [16]}],
    "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [16]}],
    "instance_group": [
        {"name": "e_0", "count": 1, "kind": "KIND_CPU", "gpus": [], "profile": [], "passive": False}
    ],
    "optimization": {
        "input_pinned_memory": {"enable": True},
        "output_pinned_memory": {"enable": True},
        "priority": "PRIORITY_DEFAULT",
        "gather_kernel_buffer_threshold": 0,
        "eager_batching": False,
    },
    "ensemble_scheduling": {
        "step": [
            {
                "model_name": "id",
                "model_version": -1,
                "input_map": {"INPUT0": "IN"},
                "output_map": {"OUTPUT0": "OUT"},
            }
        ]
    },
}


def test_an_ensemble_config_served_before_loads_as_an_override() -> None:
    old = config_from_json(OLD_SERVED_ENSEMBLE)
    with pytest.raises(ConfigError, match="must have platform type 'ensemble' and empty backend"):
        validate_config(fill_defaults(old, gpus=0))
    cleaned = _without_old_ensemble_defaults(old)
    validate_config(fill_defaults(cleaned, gpus=0))
    assert (cleaned.backend, cleaned.instance_group, cleaned.optimization) == ("", [], None)
    other = dict(OLD_SERVED_ENSEMBLE, instance_group=[{"name": "g", "count": 2}])
    assert _without_old_ensemble_defaults(config_from_json(other)).instance_group  # kept


def test_more_dimensions_than_a_tensor_has_are_refused_at_load() -> None:
    """A request's tensor past 64 dimensions is kept flat until the signature refuses it
    (core/tensors.py `shaped`): no config may take one, the batch dimension counted."""
    sixty_four = ", ".join(["1"] * 64)
    with pytest.raises(ConfigError, match="has 64 dimensions and the batch dimension: a tensor"):
        check(config("deep", io(inp=f"data_type: TYPE_FP32 dims: [ {sixty_four} ]")))
    check(config("deep", io(inp=f"data_type: TYPE_FP32 dims: [ {sixty_four} ]"), 0))
    with pytest.raises(ConfigError, match="has 65 dimensions: a tensor has at most 64"):
        check(config("deep", io(out=f"data_type: TYPE_FP32 dims: [ {sixty_four}, 1 ]"), 0))
