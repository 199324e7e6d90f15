"""KIND_GPU instances on the CUDA execution provider. Runs only where onnxruntime-gpu sees a GPU:
`pip install -e '.[gpu,test]' && python -m pytest tests/gpu` on a CUDA machine."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime
import pytest
import tritonclient.http as httpclient

from tests.onnx_models import add_sub_model
from tests.server_process import start_server
from tritonactor.core.devices import gpu_count

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(gpu_count() == 0, reason="no CUDA device visible on this machine"),
    pytest.mark.skipif(
        "CUDAExecutionProvider" not in onnxruntime.get_available_providers(),
        reason="this onnxruntime has no CUDA execution provider (install the gpu extra)",
    ),
]


def test_kind_gpu_instance_serves(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    add_sub_model(repo / "gpu_simple" / "1" / "model.onnx", datatype="FP32")
    (repo / "gpu_simple" / "config.pbtxt").write_text(
        'name: "gpu_simple"\nplatform: "onnxruntime_onnx"\n'
        "instance_group [ { count: 2 kind: KIND_GPU gpus: [ 0 ] } ]\n"
    )
    server = start_server([repo], tmp_path)
    try:
        client = httpclient.InferenceServerClient(server.url)
        config = client.get_model_config("gpu_simple")
        assert config["instance_group"][0]["kind"] == "KIND_GPU"
        a = np.random.rand(4, 16).astype(np.float32)
        inputs = [httpclient.InferInput(n, [4, 16], "FP32") for n in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(a)
        result = client.infer("gpu_simple", inputs)
        np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + a, rtol=1e-6)
    finally:
        server.stop()
