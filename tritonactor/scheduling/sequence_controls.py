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


def parse_controls(config: ModelConfig) -> list[Control]:
    """The config's control inputs, one per control (a control input without a control
    holds nothing). The config passed config/validate.py, which refuses, as Triton, a kind
    given twice, a boolean control without its two values, a CORRID of a type Triton cannot
    carry an ID in; and, where Triton does not, a tensor with two controls or a control that
    names a model input."""
    batching = config.sequence_batching
    assert batching is not None
    controls: list[Control] = []
    for control_input in batching.control_input:
        for control in control_input.control:
            kind = control.kind
            if kind == _KIND.CONTROL_SEQUENCE_CORRID:
                datatype = config_to_wire(str(control.data_type.name))
                controls.append(Control(control_input.name, kind, datatype))
                continue
            if control.int32_false_true:
                datatype, values = "INT32", list(control.int32_false_true)
            elif control.fp32_false_true:
                datatype, values = "FP32", list(control.fp32_false_true)
            else:
                datatype, values = "BOOL", list(control.bool_false_true)
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
