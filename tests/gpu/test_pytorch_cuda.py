"""KIND_GPU instances of the pytorch backend. Runs only where torch sees a CUDA device:
`pip install -e '.[gpu,test]' && python -m pytest tests/gpu` on a CUDA machine."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import tritonclient.http as httpclient

from tests import torch_models
from tests.server_process import start_server
from tritonactor.backends.base import InstanceContext, ModelContext
from tritonactor.backends.pytorch import PyTorchBackend
from tritonactor.config.model_config import parse_pbtxt
from tritonactor.core.devices import gpu_count
from tritonactor.core.types import InferenceRequest, InferenceResponse, Tensor

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.filterwarnings("ignore::DeprecationWarning:torch.*"),
    pytest.mark.skipif(gpu_count() == 0, reason="no CUDA device visible on this machine"),
    pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason="this torch has no CUDA (install a CUDA build of torch, the gpu extra)",
    ),
]

CONFIG = """
name: "{name}"
platform: "pytorch_libtorch"
max_batch_size: 8
input [
  {{ name: "INPUT__0" data_type: TYPE_FP32 dims: [ 16 ] }},
  {{ name: "INPUT__1" data_type: TYPE_FP32 dims: [ 16 ] }}
]
output [
  {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 16 ] }},
  {{ name: "OUTPUT__1" data_type: TYPE_FP32 dims: [ 16 ] }}
]
instance_group [ {{ count: 2 kind: KIND_GPU gpus: [ 0 ] }} ]
parameters {{ key: "ENABLE_CACHE_CLEANING" value: {{ string_value: "true" }} }}
"""


def test_instance_runs_on_the_gpu(tmp_path: Path) -> None:
    path = torch_models.add_sub_model(tmp_path / "m" / "1" / "model.pt")
    config = parse_pbtxt(CONFIG.format(name="m"))
    context = ModelContext("m", 1, config, path.parent.parent, path.parent, path)
    model = PyTorchBackend().load_model(context)
    instance = model.create_instance(
        InstanceContext(name="m_0", kind="KIND_GPU", device_id=0, index=0)
    )
    assert instance.device == torch.device("cuda", 0)
    a = np.random.rand(4, 16).astype(np.float32)
    inputs = [Tensor(n, "FP32", a.shape, a) for n in ("INPUT__0", "INPUT__1")]
    [result] = instance.execute([InferenceRequest(model_name="m", inputs=inputs)])
    assert isinstance(result, InferenceResponse), result
    np.testing.assert_allclose(result.outputs[0].data, a + a, rtol=1e-6)
    np.testing.assert_allclose(result.outputs[1].data, np.zeros_like(a))
    instance.finalize()


def test_kind_gpu_instances_serve(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    torch_models.add_sub_model(repo / "gpu_torch" / "1" / "model.pt")
    (repo / "gpu_torch" / "config.pbtxt").write_text(CONFIG.format(name="gpu_torch"))
    server = start_server([repo], tmp_path)
    try:
        client = httpclient.InferenceServerClient(server.url)
        config = client.get_model_config("gpu_torch")
        assert config["instance_group"][0]["kind"] == "KIND_GPU"
        a = np.random.rand(4, 16).astype(np.float32)
        inputs = [httpclient.InferInput(n, [4, 16], "FP32") for n in ("INPUT__0", "INPUT__1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(a)
        result = client.infer("gpu_torch", inputs)
        np.testing.assert_allclose(result.as_numpy("OUTPUT__0"), a + a, rtol=1e-6)
    finally:
        server.stop()
