"""Binding config names to a TorchScript module's `forward()` arguments and returned values.

TorchScript files carry no input or output names, so the config must list them; how a config name
binds to a `forward()` argument or to a returned value follows Triton's naming rules (see
docs/pytorch-backend.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from tritonactor._proto.inference import DataType, ModelConfig, ModelInput, ModelOutput
from tritonactor.core.datatypes import config_to_wire
from tritonactor.core.errors import invalid_arg

# Config data type -> the torch dtype's attribute name (TYPE_STRING travels as List[str]).
_TORCH_DTYPES: dict[DataType, str] = {
    DataType.TYPE_BOOL: "bool",
    DataType.TYPE_UINT8: "uint8",
    DataType.TYPE_UINT16: "uint16",
    DataType.TYPE_UINT32: "uint32",
    DataType.TYPE_UINT64: "uint64",
    DataType.TYPE_INT8: "int8",
    DataType.TYPE_INT16: "int16",
    DataType.TYPE_INT32: "int32",
    DataType.TYPE_INT64: "int64",
    DataType.TYPE_FP16: "float16",
    DataType.TYPE_FP32: "float32",
    DataType.TYPE_FP64: "float64",
    DataType.TYPE_BF16: "bfloat16",
}

# Triton's `<name>__<index>` convention.
_NAMED_INDEX = re.compile(r"^.+__(\d+)$")


@dataclass(frozen=True, slots=True)
class _Argument:
    name: str
    type: str  # as torch prints it: "Tensor", "List[str]", "Optional[Tensor]", ...
    has_default: bool


@dataclass(frozen=True, slots=True)
class _InputPlan:
    name: str  # the config's name
    argument: str  # the forward() argument it feeds ("" when inputs travel in one dict)
    optional: bool
    is_string: bool
    is_bf16: bool
    # The per-item shape the model wants when the config reshapes this input, and the
    # input's own (the client's).
    reshape: tuple[int, ...] | None
    dims: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class _OutputPlan:
    name: str
    index: int  # position in the returned tuple/list; -1 when the model returns a dict
    datatype: str  # wire name
    torch_dtype: str  # "" for BYTES
    # The per-item shape the client sees when the config reshapes this output, and the
    # model's.
    dims: tuple[int, ...] | None
    reshape: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class _Binding:
    inputs: tuple[_InputPlan, ...]
    outputs: dict[str, _OutputPlan]
    # forward() takes a single Dict[str, Tensor]: every input goes in it under its config name.
    dict_argument: str
    # The model returns one value (a Tensor, or a List[str]), not a tuple/list/dict of them.
    single_return: bool
    returns_dict: bool


def _forward_schema(model: str, module: Any) -> tuple[list[_Argument], Any]:
    try:
        schema = module.forward.schema
    except AttributeError:
        raise invalid_arg(
            f"model '{model}': the TorchScript module has no forward() method"
        ) from None
    arguments = [
        _Argument(a.name, str(a.type), a.has_default_value()) for a in schema.arguments[1:]
    ]
    return_type = schema.returns[0].type if len(schema.returns) == 1 else None
    return arguments, return_type


def _named_indices(names: list[str]) -> list[int] | None:
    """The indices of `<name>__<index>` names, or None unless every name follows it."""
    indices = []
    for name in names:
        match = _NAMED_INDEX.match(name)
        if match is None:
            return None
        indices.append(int(match.group(1)))
    return indices


def _bind_inputs(
    model: str, inputs: list[ModelInput], arguments: list[_Argument]
) -> tuple[tuple[_InputPlan, ...], str]:
    names = [t.name for t in inputs]
    shown = [a.name for a in arguments]
    if len(arguments) == 1 and arguments[0].type == "Dict[str, Tensor]":
        for tensor in inputs:
            if tensor.data_type == DataType.TYPE_STRING:
                raise invalid_arg(
                    f"model '{model}' input '{tensor.name}' is TYPE_STRING, but forward() takes "
                    "a Dict[str, Tensor], which holds only tensors"
                )
        return tuple(_input_plan(t, "") for t in inputs), arguments[0].name

    by_name = {a.name: a for a in arguments}
    if all(name in by_name for name in names):
        bound = [by_name[name] for name in names]  # Triton's first rule: the argument names
    else:
        indices = _named_indices(names)
        if indices is None:
            # Triton's last rule: neither convention holds for every input, so the config's
            # order is forward()'s order.
            indices = list(range(len(names)))
            how = "in config order"
        else:
            how = "by their <name>__<index> names"
        if len(set(indices)) != len(indices):
            raise invalid_arg(f"model '{model}': config inputs {names} repeat an index")
        for name, index in zip(names, indices, strict=True):
            if index >= len(arguments):
                raise invalid_arg(
                    f"model '{model}' input '{name}' binds {how} to forward() argument {index}, "
                    f"but forward() takes {len(arguments)} argument(s) {shown}"
                )
        bound = [arguments[index] for index in indices]

    fed = {a.name for a in bound}
    unfed = [a.name for a in arguments if not a.has_default and a.name not in fed]
    if unfed:
        raise invalid_arg(
            f"model '{model}': forward() arguments {unfed} have no default and no config input "
            f"feeds them (config inputs {names}, forward() arguments {shown})"
        )
    plans = []
    for tensor, argument in zip(inputs, bound, strict=True):
        where = f"model '{model}' input '{tensor.name}' (forward() argument '{argument.name}')"
        if tensor.optional and not argument.has_default:
            raise invalid_arg(f"{where} is optional in the config but has no default in forward()")
        if tensor.data_type == DataType.TYPE_STRING:
            if argument.type != "List[str]":
                raise invalid_arg(
                    f"{where} is TYPE_STRING, which the pytorch backend passes as List[str], "
                    f"but forward() declares it {argument.type}"
                )
            _check_string_dims(model, "input", tensor)
        elif argument.type not in ("Tensor", "Optional[Tensor]"):
            raise invalid_arg(
                f"{where} is {DataType(tensor.data_type).name}, passed as a Tensor, but forward() "
                f"declares it {argument.type}"
            )
        plans.append(_input_plan(tensor, argument.name))
    return tuple(plans), ""


def _input_plan(tensor: ModelInput, argument: str) -> _InputPlan:
    return _InputPlan(
        name=tensor.name,
        argument=argument,
        optional=tensor.optional,
        is_string=tensor.data_type == DataType.TYPE_STRING,
        is_bf16=tensor.data_type == DataType.TYPE_BF16,
        reshape=tuple(tensor.reshape.shape) if tensor.reshape is not None else None,
        dims=tuple(tensor.dims),
    )


def _check_string_dims(model: str, kind: str, tensor: ModelInput | ModelOutput) -> None:
    # A List[str] has one dimension; more would need a shape the list cannot carry.
    if len(tensor.dims) != 1 or tensor.reshape is not None:
        raise invalid_arg(
            f"model '{model}' {kind} '{tensor.name}' is TYPE_STRING with dims "
            f"{list(tensor.dims)}; the pytorch backend passes strings as one List[str], so "
            "TYPE_STRING tensors must have exactly one dim (plus the batch dim) and no reshape"
        )


def _return_arity(return_type: Any) -> tuple[bool, bool, int | None]:
    """(single value, dict, how many values when known) from forward()'s declared return."""
    if return_type is None:
        return False, False, None
    kind = return_type.kind()
    if kind == "TupleType":
        return False, False, len(return_type.elements())
    if kind == "DictType":
        return False, True, None
    if kind == "ListType" and str(return_type) != "List[str]":
        return False, False, None
    return True, False, 1


def _bind_outputs(
    model: str, outputs: list[ModelOutput], return_type: Any
) -> tuple[dict[str, _OutputPlan], bool, bool]:
    single, returns_dict, arity = _return_arity(return_type)
    names = [t.name for t in outputs]
    if returns_dict:
        indices = [-1] * len(names)
    else:
        indices = _named_indices(names)
        how = "by their <name>__<index> names"
        if indices is None:
            indices = list(range(len(names)))
            how = "in config order"
        if len(set(indices)) != len(indices):
            raise invalid_arg(f"model '{model}': config outputs {names} repeat an index")
        for name, index in zip(names, indices, strict=True):
            if arity is not None and index >= arity:
                raise invalid_arg(
                    f"model '{model}' output '{name}' binds {how} to returned value {index}, "
                    f"but forward() returns {arity} value(s) ({return_type})"
                )
    plans = {}
    for tensor, index in zip(outputs, indices, strict=True):
        data_type = DataType(tensor.data_type)
        if data_type == DataType.TYPE_STRING:
            _check_string_dims(model, "output", tensor)
        elif data_type not in _TORCH_DTYPES:
            raise invalid_arg(
                f"model '{model}' output '{tensor.name}' has data type {data_type.name}, "
                "which the pytorch backend cannot return"
            )
        plans[tensor.name] = _OutputPlan(
            name=tensor.name,
            index=index,
            datatype=config_to_wire(data_type.name),
            torch_dtype=_TORCH_DTYPES.get(data_type, ""),
            dims=tuple(tensor.dims) if tensor.reshape is not None else None,
            reshape=tuple(tensor.reshape.shape) if tensor.reshape is not None else (),
        )
    return plans, single, returns_dict


def _bind(model: str, config: ModelConfig, module: Any) -> _Binding:
    if config.max_batch_size < 0:
        raise invalid_arg(
            f"model '{model}' has max_batch_size {config.max_batch_size}; it must be >= 0"
        )
    arguments, return_type = _forward_schema(model, module)
    if not config.output:
        raise invalid_arg(
            f"model '{model}': a TorchScript model does not name its outputs, so the config must "
            'list them (output [ { name: "OUTPUT__0" data_type: ... dims: [...] } ])'
        )
    if not config.input and arguments:
        raise invalid_arg(
            f"model '{model}': a TorchScript model does not name its inputs, so the config must "
            f"list them; forward() takes {[a.name for a in arguments]}"
        )
    for tensor in config.input:
        if tensor.data_type not in _TORCH_DTYPES and tensor.data_type != DataType.TYPE_STRING:
            raise invalid_arg(
                f"model '{model}' input '{tensor.name}' has data type "
                f"{DataType(tensor.data_type).name}, which the pytorch backend cannot pass"
            )
    inputs, dict_argument = _bind_inputs(model, list(config.input), arguments)
    outputs, single, returns_dict = _bind_outputs(model, list(config.output), return_type)
    return _Binding(inputs, outputs, dict_argument, single, returns_dict)
