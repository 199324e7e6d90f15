"""The sequence batcher behind the real server: a stateful python model driven by tritonclient
with sequence_id / sequence_start / sequence_end."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.server_process import ServerProcess, start_server

pytestmark = pytest.mark.e2e

MODELS = Path(__file__).resolve().parent.parent / "python_models"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("sequence_repo")
    shutil.copytree(MODELS / "sequence_accumulate", repo / "sequence_accumulate")
    process = start_server([repo], tmp_path_factory.mktemp("sequence_server"))
    yield process
    process.stop()


def http_send(
    client: httpclient.InferenceServerClient, value: int, sequence_id: int, **flags: bool
) -> int:
    tensor = httpclient.InferInput("INPUT", [1], "INT32")
    tensor.set_data_from_numpy(np.array([value], dtype=np.int32))
    result = client.infer("sequence_accumulate", [tensor], sequence_id=sequence_id, **flags)
    return int(result.as_numpy("OUTPUT")[0])


def test_two_interleaved_sequences_over_http(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.url)
    sums = [
        http_send(client, 1, 1001, sequence_start=True),
        http_send(client, 10, 1002, sequence_start=True),
        http_send(client, 2, 1001),
        http_send(client, 20, 1002),
        http_send(client, 3, 1001, sequence_end=True),
        http_send(client, 30, 1002, sequence_end=True),
    ]
    assert sums == [1, 10, 3, 30, 6, 60]


def test_sequence_errors_over_http(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.url)
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        http_send(client, 1, 2001)
    with pytest.raises(InferenceServerException, match="non-zero or non-empty correlation ID"):
        http_send(client, 1, 0)


def test_a_sequence_over_grpc(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        sums = []
        for step, value in enumerate((4, 5, 6)):
            tensor = grpcclient.InferInput("INPUT", [1], "INT32")
            tensor.set_data_from_numpy(np.array([value], dtype=np.int32))
            result = client.infer(
                "sequence_accumulate",
                [tensor],
                sequence_id=3001,
                sequence_start=step == 0,
                sequence_end=step == 2,
            )
            sums.append(int(result.as_numpy("OUTPUT")[0]))
        assert sums == [4, 9, 15]
    finally:
        client.close()
