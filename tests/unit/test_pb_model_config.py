"""`pb_utils.ModelConfig`, the object a python model's `auto_complete_config` works on: what it
accepts and refuses, in Triton 2.51's words (checked against its python backend)."""

from __future__ import annotations

from typing import Any

import pytest

from tritonactor.backends.python._pb_config import ModelConfig


def config(**fields: Any) -> ModelConfig:
    base: dict[str, Any] = {"name": "m", "max_batch_size": 0, "input": [], "output": []}
    return ModelConfig({**base, **fields})


def refused(call: Any, *args: Any) -> str:
    with pytest.raises(ValueError) as caught:
        call(*args)
    return str(caught.value)


def test_max_batch_size_may_grow_but_not_shrink() -> None:
    grown = config(max_batch_size=2)
    grown.set_max_batch_size(4)
    assert grown.as_dict()["max_batch_size"] == 4
    assert refused(config(max_batch_size=8).set_max_batch_size, 4) == (
        "configuration specified max_batch_size 8, but in auto-complete-config function for "
        "model 'm' specified max_batch_size 4"
    )
    assert "specified max_batch_size -3" in refused(config().set_max_batch_size, -3)


def test_dynamic_batching_beside_another_scheduler_is_refused() -> None:
    sequence = config(sequence_batching={})
    assert refused(sequence.set_dynamic_batching) == (
        "Configuration specified scheduling_choice as 'sequence_batching', but "
        "auto-complete-config function for model 'm' tries to set scheduling_choice as "
        "'dynamic_batching'"
    )
    plain = config()
    plain.set_dynamic_batching()
    assert plain.as_dict()["dynamic_batching"] == {}


def test_the_decoupled_property_may_not_change() -> None:
    set_false = config(model_transaction_policy={"decoupled": False})
    assert refused(set_false.set_model_transaction_policy, {"decoupled": True}) == (
        "trying to change decoupled property in auto-complete-config for model 'm', which is "
        "already set to 'False'."
    )
    assert refused(config().set_model_transaction_policy, {"other": 1}) == (
        "model transaction property in auto-complete-config function for model 'm' contains "
        "property other than 'decoupled'."
    )
    fresh = config()
    fresh.set_model_transaction_policy({"decoupled": True})
    assert fresh.as_dict()["model_transaction_policy"] == {"decoupled": True}


def test_a_tensor_is_checked_as_it_is_added() -> None:
    where = "in auto-complete-config function for model 'm'"
    model = config()
    assert refused(model.add_input, {"name": "X", "dims": [1]}) == (
        f"input 'X' {where} is missing 'data_type' property."
    )
    assert refused(model.add_output, {"name": "Y", "data_type": "TYPE_FP32"}) == (
        f"output 'Y' {where} is missing 'dims' property."
    )
    assert refused(model.add_input, {"name": "X", "bogus": 1}) == (
        f"input 'X' {where} contains property other than 'name', 'data_type', 'dims' and "
        "'optional'."
    )
    assert refused(model.add_output, {"name": "Y", "optional": True}) == (
        f"output 'Y' {where} contains property other than 'name', 'data_type' and 'dims'."
    )
    assert model.as_dict()["input"] == [] and model.as_dict()["output"] == []


def test_a_tensor_the_config_has_is_completed_unless_it_contradicts() -> None:
    given = {"name": "X", "data_type": "TYPE_INT32", "dims": [3], "optional": True}
    model = config(input=[dict(given)])
    assert refused(model.add_input, {**given, "data_type": "TYPE_FP32"}) == (
        "unable to load model 'm', configuration expects datatype TYPE_INT32 for input 'X', "
        "model provides TYPE_FP32"
    )
    assert refused(model.add_input, {**given, "dims": [-1]}) == (
        "model 'm', tensor 'X': the model expects dims [-1] but the model configuration "
        "specifies dims [3]"
    )
    assert refused(model.add_input, {**given, "optional": False}) == (
        "model 'm', tensor 'X': the model expects optional False but the model configuration "
        "specifies optional True"
    )
    partial = config(input=[{"name": "X", "data_type": "TYPE_INVALID", "dims": []}])
    partial.add_input({"name": "X", "data_type": "TYPE_FP32", "dims": [2]})
    assert partial.as_dict()["input"] == [{"name": "X", "data_type": "TYPE_FP32", "dims": [2]}]
