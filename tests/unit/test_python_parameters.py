"""The python backend's own config parameters, checked as Triton's python backend checks them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tritonactor.backends.base import ModelContext
from tritonactor.backends.python import PythonBackend
from tritonactor.config.model_config import parse_pbtxt
from tritonactor.core.errors import ErrorCode, TritonError


def context(tmp_path: Path, value: str) -> ModelContext:
    config = parse_pbtxt(
        f'name: "m" backend: "python" parameters {{ key: "FORCE_CPU_ONLY_INPUT_TENSORS" '
        f'value: {{ string_value: "{value}" }} }}'
    )
    model = tmp_path / "1" / "model.py"
    model.parent.mkdir(parents=True, exist_ok=True)
    model.write_text("class TritonPythonModel:\n    pass\n")
    return ModelContext("m", 1, config, tmp_path, model.parent, model)


@pytest.mark.parametrize("value", ["yes", "no"])
def test_force_cpu_only_input_tensors_takes_yes_or_no(tmp_path: Path, value: str) -> None:
    PythonBackend().load_model(context(tmp_path, value))


def test_force_cpu_only_input_tensors_refuses_anything_else(tmp_path: Path) -> None:
    with pytest.raises(TritonError) as caught:
        PythonBackend().load_model(context(tmp_path, "maybe"))
    assert caught.value.code is ErrorCode.UNSUPPORTED
    assert caught.value.message == "Incorrect value for FORCE_CPU_ONLY_INPUT_TENSORS: maybe'"
