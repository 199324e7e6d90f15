"""A grpclib client generated from our own protos/ (betterproto2) against the real server, and
the user-facing example docs/examples/grpclib_client.py run as a script."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpclib
import grpclib.const
import numpy as np
import pytest
from grpclib.client import Channel

from tests.server_process import ServerProcess, wait_for
from tritonactor._proto import inference as pb
from tritonactor._proto.grpc.health import v1 as health

# grpc_server, shared by every module that names this plugin.
pytest_plugins = ["tests.e2e.grpc_fixtures"]

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "grpclib_client.py"


@pytest.fixture
async def service(grpc_server: ServerProcess) -> AsyncIterator[pb.GrpcInferenceServiceStub]:
    channel = Channel("127.0.0.1", grpc_server.grpc_port)
    try:
        yield pb.GrpcInferenceServiceStub(channel, timeout=10)
    finally:
        channel.close()


def simple_request(request_id: str, offset: int = 0, inputs: int = 2) -> pb.ModelInferRequest:
    a = (np.arange(16, dtype=np.int32) + offset).reshape(1, 16)
    b = np.full((1, 16), 10, dtype=np.int32)
    names = ["INPUT0", "INPUT1"][:inputs]
    return pb.ModelInferRequest(
        model_name="simple",
        id=request_id,
        inputs=[
            pb.ModelInferRequestInferInputTensor(name=name, datatype="INT32", shape=[1, 16])
            for name in names
        ],
        raw_input_contents=[a.tobytes(), b.tobytes()][:inputs],
    )


def check_simple(response: pb.ModelInferResponse, offset: int = 0) -> None:
    assert [(o.name, o.datatype, o.shape) for o in response.outputs] == [
        ("OUTPUT0", "INT32", [1, 16]),
        ("OUTPUT1", "INT32", [1, 16]),
    ]
    total, difference = (np.frombuffer(raw, dtype="<i4") for raw in response.raw_output_contents)
    a = np.arange(16, dtype=np.int32) + offset
    np.testing.assert_array_equal(total, a + 10)
    np.testing.assert_array_equal(difference, a - 10)


async def test_infer(service: pb.GrpcInferenceServiceStub) -> None:
    response = await service.model_infer(simple_request("one", offset=100))
    assert (response.model_name, response.model_version, response.id) == ("simple", "1", "one")
    check_simple(response, offset=100)


@pytest.mark.parametrize(
    ("request_", "status", "message"),
    [
        (
            pb.ModelInferRequest(model_name="nosuch"),
            grpclib.const.Status.NOT_FOUND,
            "Request for unknown model: 'nosuch' is not found",
        ),
        (
            simple_request("short", inputs=1),
            grpclib.const.Status.INVALID_ARGUMENT,
            "[request id: short] expected 2 inputs but got 1 inputs for model 'simple'.",
        ),
    ],
    ids=["unknown-model", "missing-input"],
)
async def test_infer_error(
    service: pb.GrpcInferenceServiceStub,
    request_: pb.ModelInferRequest,
    status: grpclib.const.Status,
    message: str,
) -> None:
    with pytest.raises(grpclib.GRPCError) as caught:
        await service.model_infer(request_)
    assert caught.value.status is status
    assert caught.value.message.startswith(message)


async def test_stream_infer_with_an_error_in_the_middle(
    service: pb.GrpcInferenceServiceStub,
) -> None:
    requests = [
        simple_request("a", offset=1),
        simple_request("bad", inputs=1),
        simple_request("c", offset=3),
    ]
    answers = [answer async for answer in service.model_stream_infer(requests)]
    assert len(answers) == 3
    by_id = {answer.infer_response.id: answer for answer in answers}
    assert sorted(by_id) == ["a", "bad", "c"]
    check_simple(by_id["a"].infer_response, offset=1)
    check_simple(by_id["c"].infer_response, offset=3)
    bad = by_id["bad"]
    assert bad.error_message.startswith(
        "[request id: bad] expected 2 inputs but got 1 inputs for model 'simple'."
    )
    # As in Triton, a failed request's answer carries its id and nothing else.
    assert bad.infer_response.outputs == []
    assert bad.infer_response.raw_output_contents == []


async def test_stream_burst_beyond_the_scheduler_mailbox(
    service: pb.GrpcInferenceServiceStub,
) -> None:
    """More requests at once than a scheduler's mailbox holds (1024): the stream waits for
    room rather than refusing them."""
    count = 1500
    requests = [simple_request(str(i), offset=i) for i in range(count)]
    errors = []
    answered = set()
    async for answer in service.model_stream_infer(requests):
        if answer.error_message:
            errors.append(answer.error_message)
        else:
            answered.add(answer.infer_response.id)
    assert errors == []
    assert answered == {str(i) for i in range(count)}


def slow_request(x: float) -> pb.ModelInferRequest:
    return pb.ModelInferRequest(
        model_name="slow",
        inputs=[pb.ModelInferRequestInferInputTensor(name="X", datatype="FP32", shape=[1])],
        raw_input_contents=[np.array([x], dtype="<f4").tobytes()],
    )


async def test_client_leaving_mid_stream_does_not_hurt_the_model(
    grpc_server: ServerProcess, service: pb.GrpcInferenceServiceStub
) -> None:
    """The client goes away with requests still queued: their answers have nowhere to go, and
    the model must carry on regardless."""

    async def requests() -> AsyncIterator[pb.ModelInferRequest]:
        for x in range(30):  # tens of milliseconds each: they queue up behind each other
            yield slow_request(x)
        await asyncio.sleep(30)  # the client leaves long before this

    channel = Channel("127.0.0.1", grpc_server.grpc_port)
    answers = pb.GrpcInferenceServiceStub(channel).model_stream_infer(requests())
    first = await answers.__anext__()
    assert not first.error_message
    # The server holds several of the stream's requests, not answered yet, when we leave.
    await asyncio.to_thread(
        wait_for,
        lambda: grpc_server.pending("slow") >= 2,
        60,
        lambda: f"pending for slow: {grpc_server.pending('slow')}",
    )
    await answers.aclose()
    channel.close()

    # Queued behind what the departed client left: answered once the model has run all that.
    one = await service.model_infer(slow_request(1.0))
    two = await service.model_infer(slow_request(2.0))
    y1, y2 = (np.frombuffer(r.raw_output_contents[0], dtype="<f4")[0] for r in (one, two))
    assert y1 > 1 and y2 == pytest.approx(2 * y1, rel=1e-4)  # Y = X + X * constant
    assert (await service.model_ready(pb.ModelReadyRequest(name="slow"))).ready


async def test_health_watch_is_not_served(grpc_server: ServerProcess) -> None:
    channel = Channel("127.0.0.1", grpc_server.grpc_port)
    try:
        with pytest.raises(grpclib.GRPCError) as caught:
            async for _ in health.HealthStub(channel).watch(health.HealthCheckRequest()):
                pass
    finally:
        channel.close()
    assert caught.value.status is grpclib.const.Status.UNIMPLEMENTED


def test_example_script(grpc_server: ServerProcess) -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "127.0.0.1", str(grpc_server.grpc_port)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    a = list(range(16))
    assert lines[:5] == [
        "server ready: True",
        "input INPUT0: INT32 [-1, 16]",
        "input INPUT1: INT32 [-1, 16]",
        "output OUTPUT0: INT32 [-1, 16]",
        "output OUTPUT1: INT32 [-1, 16]",
    ]
    assert lines[5:7] == [
        f"infer unary: OUTPUT0 {[x + 1 for x in a]}",
        f"infer unary: OUTPUT1 {[x - 1 for x in a]}",
    ]
    # Stream answers come in completion order: compare them as a set.
    assert sorted(lines[7:]) == [
        f"stream first: OUTPUT0 {[2 * x for x in a]}",
        f"stream second: OUTPUT0 {[x + 2 for x in a]}",
    ]
