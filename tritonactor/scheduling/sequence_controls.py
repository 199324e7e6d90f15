"""The sequence batcher's control inputs: the tensors named by `sequence_batching.control_input`
through which each batch row tells the model whether it starts or ends its sequence, whether it
holds a request at all (READY), and which sequence it belongs to (CORRID)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tritonactor._proto.inference import ModelConfig, ModelSequenceBatchingControlKind
from tritonactor.core.datatypes import config_to_wire, to_numpy_dtype
from tritonactor.core.errors import invalid_arg
from tritonactor.core.types import Tensor

__all__ = ["NULL_ROW", "Control", "CorrelationId", "Row", "check_correlation_id", "parse_controls"]

CorrelationId = int | str

_KIND = ModelSequenceBatchingControlKind
_CORRID_TYPES = ("UINT64", "INT64", "UINT32", "INT32", "BYTES")


@dataclass(frozen=True, slots=True)
class Control:
    """One control input: its tensor's wire data type and the values for false and true (for
    CORRID, `values` is empty: the tensor holds the correlation ID)."""

    name: str
    kind: ModelSequenceBatchingControlKind
    datatype: str
    values: tuple[Any, Any] | tuple[()] = field(default=())


@dataclass(frozen=True, slots=True)
class Row:
    """What one batch row says through the controls. A null row (a slot without a request)
    is not ready, neither starts nor ends, and has CORRID 0 (empty for a string CORRID)."""

    start: bool
    end: bool
    ready: bool
    correlation_id: CorrelationId

    def tensors(self, controls: list[Control], shape: tuple[int, ...]) -> list[Tensor]:
        """One tensor of `shape` per control input, holding this row's value."""
        return [self._tensor(control, shape) for control in controls]

    def _tensor(self, control: Control, shape: tuple[int, ...]) -> Tensor:
        kind = control.kind
        if kind == _KIND.CONTROL_SEQUENCE_CORRID:
            value: Any = self.correlation_id
            if control.datatype == "BYTES":
                text = "" if value == 0 else str(value)
                data = np.full(shape, text.encode(), dtype=object)
                return Tensor(control.name, "BYTES", shape, data)
        else:
            if kind == _KIND.CONTROL_SEQUENCE_START:
                flag = self.start
            elif kind == _KIND.CONTROL_SEQUENCE_END:
                flag = self.end
            else:
                flag = self.ready
            value = control.values[1 if flag else 0]
        data = np.full(shape, value, dtype=to_numpy_dtype(control.datatype))
        return Tensor(control.name, control.datatype, shape, data)


NULL_ROW = Row(start=False, end=False, ready=False, correlation_id=0)


def parse_controls(name: str, config: ModelConfig) -> list[Control]:
    """The config's control inputs; INVALID_ARG for one that names a model input, has other
    than one control, lacks its two values or has a CORRID type Triton does not take."""
    batching = config.sequence_batching
    assert batching is not None
    inputs = {tensor.name for tensor in config.input}
    controls: list[Control] = []
    for control_input in batching.control_input:
        if control_input.name in inputs:
            raise invalid_arg(
                f"model '{name}': control input '{control_input.name}' is also a model input"
            )
        if len(control_input.control) != 1:
            raise invalid_arg(
                f"model '{name}': control input '{control_input.name}' must have exactly one "
                f"control, not {len(control_input.control)}"
            )
        control = control_input.control[0]
        kind = control.kind
        if kind == _KIND.CONTROL_SEQUENCE_CORRID:
            if control.data_type.name in ("TYPE_INVALID", None):
                raise invalid_arg(
                    f"model '{name}': CORRID control input '{control_input.name}' must "
                    "specify a data_type"
                )
            datatype = config_to_wire(str(control.data_type.name))
            if datatype not in _CORRID_TYPES:
                raise invalid_arg(
                    f"model '{name}': CORRID control input '{control_input.name}' has "
                    f"unsupported data_type {control.data_type.name}"
                )
            controls.append(Control(control_input.name, kind, datatype))
            continue
        options = [
            ("INT32", list(control.int32_false_true)),
            ("FP32", list(control.fp32_false_true)),
            ("BOOL", list(control.bool_false_true)),
        ]
        given = [(datatype, values) for datatype, values in options if values]
        if len(given) != 1 or len(given[0][1]) != 2:
            raise invalid_arg(
                f"model '{name}': control input '{control_input.name}' must give exactly two "
                "values (false, true) in one of int32_false_true, fp32_false_true, "
                "bool_false_true"
            )
        datatype, values = given[0]
        controls.append(Control(control_input.name, kind, datatype, (values[0], values[1])))
    return controls


def check_correlation_id(
    model: str, controls: list[Control], correlation_id: CorrelationId
) -> None:
    """INVALID_ARG when the ID cannot travel in the model's CORRID control."""
    for control in controls:
        if control.kind != _KIND.CONTROL_SEQUENCE_CORRID or control.datatype == "BYTES":
            continue
        if isinstance(correlation_id, str):
            raise invalid_arg(
                f"inference request to model '{model}' has the string correlation ID "
                f"'{correlation_id}', but the model expects a {control.datatype} one"
            )
        info = np.iinfo(to_numpy_dtype(control.datatype))
        if not info.min <= correlation_id <= info.max:
            raise invalid_arg(
                f"inference request to model '{model}': correlation ID {correlation_id} does "
                f"not fit the model's {control.datatype} CORRID control"
            )
