"""The foundation end to end: tritonclient.http against `hypercorn tritonactor.app:app`."""

from __future__ import annotations

import numpy as np
import tritonclient.http as httpclient

from tests.server_process import ServerProcess


def simple_inputs(batch: int = 1, binary: bool = True) -> list[httpclient.InferInput]:
    a = np.arange(16 * batch, dtype=np.int32).reshape(batch, 16)
    b = np.full((batch, 16), 3, dtype=np.int32)
    inputs = [
        httpclient.InferInput("INPUT0", [batch, 16], "INT32"),
        httpclient.InferInput("INPUT1", [batch, 16], "INT32"),
    ]
    inputs[0].set_data_from_numpy(a, binary_data=binary)
    inputs[1].set_data_from_numpy(b, binary_data=binary)
    return inputs


def test_simple_add_sub_json_and_binary(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.url)
    for binary in (False, True):
        result = client.infer("simple", simple_inputs(2, binary), request_id="abc")
        a = np.arange(32, dtype=np.int32).reshape(2, 16)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + 3)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - 3)
        assert result.get_response()["id"] == "abc"
        assert result.get_response()["model_version"] == "1"


def test_metadata_and_config(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.url)
    assert client.is_server_live()
    assert not client.is_server_ready()  # the broken model keeps strict readiness off
    assert client.is_model_ready("simple")
    assert not client.is_model_ready("broken")
    metadata = client.get_model_metadata("simple")
    assert metadata["platform"] == "onnxruntime_onnx"
    assert metadata["inputs"][0] == {"name": "INPUT0", "datatype": "INT32", "shape": [-1, 16]}
    config = client.get_model_config("autocomplete")
    assert config["max_batch_size"] == 4
    assert [i["name"] for i in config["input"]] == ["INPUT0", "INPUT1"]
