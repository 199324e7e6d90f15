"""A backend from another package, as the README says ("a backend is a package away: the
`tritonactor.backends` entry-point group"): a distribution installed on the server's path that
declares the entry point, found and served with nothing else configured."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.server_process import start_server

pytestmark = pytest.mark.e2e

BACKEND = '''
"""A backend of another package: doubles its INT32 input."""

from tritonactor.backends.base import Backend, BackendInstance, BackendModel
from tritonactor.core.types import InferenceResponse, Tensor


class Doubler(BackendInstance):
    def execute(self, requests):
        results = []
        for request in requests:
            data = request.input("IN").data * 2
            out = Tensor("OUT", "INT32", data.shape, data)
            results.append(InferenceResponse(request.model_name, "1", request.id, [out]))
        return results


class DoublerModel(BackendModel):
    def create_instance(self, context):
        return Doubler()


class DoublerBackend(Backend):
    name = "doubler"
    default_model_filename = "weights.txt"

    def load_model(self, context):
        return DoublerModel()
'''


def install(site: Path) -> None:
    """What `pip install` of a package declaring the entry point leaves on a path: the module
    and its dist-info with `entry_points.txt`."""
    site.mkdir(parents=True)
    (site / "doubler_backend.py").write_text(BACKEND)
    info = site / "doubler_backend-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: doubler-backend\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[tritonactor.backends]\ndoubler = doubler_backend:DoublerBackend\n"
    )


def test_a_backend_registered_by_entry_point_serves(tmp_path: Path) -> None:
    site = tmp_path / "site"
    install(site)
    repo = tmp_path / "repo"
    (repo / "twice" / "1").mkdir(parents=True)
    (repo / "twice" / "1" / "weights.txt").write_text("none needed\n")
    (repo / "twice" / "config.pbtxt").write_text(
        textwrap.dedent(
            """
            backend: "doubler"
            max_batch_size: 0
            input [ { name: "IN" data_type: TYPE_INT32 dims: [ 4 ] } ]
            output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 4 ] } ]
            """
        )
    )
    server = start_server([repo], tmp_path, {"PYTHONPATH": str(site)})
    try:
        client = httpclient.InferenceServerClient(server.url)
        data = httpclient.InferInput("IN", [4], "INT32")
        data.set_data_from_numpy(np.arange(4, dtype=np.int32))
        result = client.infer("twice", [data])
        assert result.as_numpy("OUT").tolist() == [0, 2, 4, 6]
        assert client.get_model_config("twice")["backend"] == "doubler"
    finally:
        server.stop()
