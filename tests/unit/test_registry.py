"""Backends resolve by `backend:`, by `platform:`, or by the model file present."""

from __future__ import annotations

from pathlib import Path

import pytest

from tritonactor.backends.onnxruntime import OnnxRuntimeBackend
from tritonactor.backends.registry import BackendRegistry
from tritonactor.config.model_config import parse_pbtxt
from tritonactor.core.errors import ErrorCode, TritonError


def test_entry_point_registry_finds_onnxruntime() -> None:
    registry = BackendRegistry()
    assert "onnxruntime" in registry.names
    backend = registry.get("onnxruntime")
    assert isinstance(backend, OnnxRuntimeBackend)
    assert registry.get("onnxruntime") is backend  # created once


def test_backend_name_resolution(tmp_path: Path) -> None:
    registry = BackendRegistry({})
    assert registry.backend_name(parse_pbtxt('backend: "python"'), tmp_path, []) == "python"
    assert (
        registry.backend_name(parse_pbtxt('platform: "onnxruntime_onnx"'), tmp_path, [])
        == "onnxruntime"
    )
    assert (
        registry.backend_name(parse_pbtxt('platform: "pytorch_libtorch"'), tmp_path, [])
        == "pytorch"
    )
    (tmp_path / "2").mkdir()
    (tmp_path / "2" / "model.plan").write_bytes(b"")
    assert registry.backend_name(parse_pbtxt('name: "m"'), tmp_path, [2]) == "tensorrt"


def test_unknown_platform_and_missing_backend_are_clear(tmp_path: Path) -> None:
    registry = BackendRegistry({})
    with pytest.raises(TritonError, match="unexpected platform type 'caffe2'"):
        registry.backend_name(parse_pbtxt('name: "m" platform: "caffe2"'), tmp_path, [])
    with pytest.raises(TritonError, match="unable to find a backend for model 'm'"):
        registry.backend_name(parse_pbtxt('name: "m"'), tmp_path, [1])
    with pytest.raises(TritonError) as caught:
        registry.get("pytorch")
    assert caught.value.code is ErrorCode.UNAVAILABLE
    assert "unable to find backend library for backend 'pytorch'" in caught.value.message
