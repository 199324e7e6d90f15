"""Tensors in a client's system shared-memory region cross between a front end and the engine
as where they lie: both processes map the region, so the receiver views its own mapping and no
byte of the tensor is copied on the way (engine/wire.py, `SharedMemoryRegistry.locate`)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.utils.shared_memory as client_shm

from tests.unit.test_engine_wire import Transport
from tritonactor.actors import Reply
from tritonactor.core.errors import ErrorCode, TritonError
from tritonactor.core.types import InferenceRequest, InferenceResponse, RequestedOutput, Tensor
from tritonactor.engine import messages as m
from tritonactor.engine.frame_reader import FrameReader
from tritonactor.engine.host import _Connection
from tritonactor.engine.lanes import Lane, LaneReader
from tritonactor.engine.wire import OUT_OF_BAND, encode
from tritonactor.memory.lease import Lease
from tritonactor.memory.region import Kind
from tritonactor.memory.registry import SharedMemoryRegistry
from tritonactor.memory.system import SystemRegion, address_of

SIZE = 4 * OUT_OF_BAND  # bytes in the region: large tensors, which would go out of band
ELEMENTS = OUT_OF_BAND // 4  # an FP32 tensor of OUT_OF_BAND bytes


@pytest.fixture
def key() -> Iterator[str]:
    key = f"/tritonactor_test_{uuid.uuid4().hex[:12]}"
    handle = client_shm.create_shared_memory_region("test", key, SIZE)
    yield key
    client_shm.destroy_shared_memory_region(handle)


@pytest.fixture
def front(key: str) -> Iterator[SharedMemoryRegistry]:
    """A front end's registry, the region mapped as the engine told it."""
    registry = SharedMemoryRegistry()
    registry.register_system("r", key, 0, SIZE)
    yield registry
    registry.close()


@pytest.fixture
def engine(key: str) -> Iterator[SharedMemoryRegistry]:
    """The engine's registry: the same region, mapped again (another address)."""
    registry = SharedMemoryRegistry()
    registry.register_system("r", key, 0, SIZE)
    yield registry
    registry.close()


def region(registry: SharedMemoryRegistry) -> SystemRegion:
    [found] = registry.status(Kind.SYSTEM, "r")
    assert isinstance(found, SystemRegion)
    return found


def frame(message: object, regions: SharedMemoryRegistry) -> bytes:
    return b"".join(bytes(piece) for piece in encode(message, regions=regions))


def submit_reading(front: SharedMemoryRegistry, values: np.ndarray) -> tuple[m.Submit, Lease]:
    """A request whose input the front end read from the region at offset 4096."""
    region(front).write(4096, values.view(np.uint8))
    lease = Lease(front)
    data = np.frombuffer(lease.read("r", 4096, values.nbytes), np.float32).reshape(1, -1)
    request = InferenceRequest("m", inputs=[Tensor("IN", "FP32", data.shape, data)])
    return m.Submit(5, request), lease


def test_an_input_in_a_region_crosses_as_its_place_and_arrives_as_the_receivers_view(
    front: SharedMemoryRegistry, engine: SharedMemoryRegistry
) -> None:
    values = np.arange(ELEMENTS, dtype=np.float32)
    submit, lease = submit_reading(front, values)
    sent = frame(submit, front)
    assert len(sent) < 1024  # the tensor's 64 KiB are not in the frame

    [received] = FrameReader(regions=engine).feed(sent)
    assert isinstance(received, m.Submit) and received.id == 5
    data = received.request.inputs[0].data
    np.testing.assert_array_equal(data, values.reshape(1, -1))
    assert address_of(memoryview(data)) == region(engine).address + 4096  # engine's mapping
    assert not data.flags.writeable
    lease.release()


def test_a_large_tensor_outside_every_region_still_crosses_whole(
    front: SharedMemoryRegistry, engine: SharedMemoryRegistry
) -> None:
    values = np.arange(ELEMENTS, dtype=np.float32).reshape(1, -1)
    request = InferenceRequest("m", inputs=[Tensor("IN", "FP32", values.shape, values)])
    sent = frame(m.Submit(1, request), front)
    assert len(sent) > values.nbytes
    [received] = FrameReader(regions=engine).feed(sent)
    np.testing.assert_array_equal(received.request.inputs[0].data, values)  # type: ignore[attr-defined]


@pytest.mark.parametrize("change", ["unregistered", "registered anew", "no regions"])
def test_a_tensor_in_a_region_the_receiver_lacks_fails_its_request_and_the_reader_goes_on(
    front: SharedMemoryRegistry, engine: SharedMemoryRegistry, key: str, change: str
) -> None:
    submit, lease = submit_reading(front, np.ones(ELEMENTS, np.float32))
    sent = frame(submit, front)
    engine.unregister(Kind.SYSTEM, "r")
    reader = FrameReader(regions=engine)
    if change == "registered anew":
        engine.register_system("r", key, 512, SIZE - 512)  # same name, another place
    elif change == "no regions":
        reader = FrameReader()
    following = frame(m.Cancel(6), front)

    failed, cancel = reader.feed(sent + following)
    assert isinstance(failed, m.Failed) and failed.id == 5
    assert failed.error.code is (
        ErrorCode.INTERNAL if change == "no regions" else ErrorCode.UNAVAILABLE
    )
    if change != "no regions":
        assert failed.error.message == (
            "shared memory region 'r' was unregistered while a request using it was in flight"
        )
    assert cancel == m.Cancel(6)
    lease.release()


def connection(regions: SharedMemoryRegistry) -> Any:
    crossing = _Connection.__new__(_Connection)
    crossing._regions = regions
    crossing._lanes = LaneReader()  # (what it took from the front end's lane: nothing)
    return crossing


def test_outputs_due_in_a_region_are_written_there_by_the_engine_and_not_copied_again(
    front: SharedMemoryRegistry, engine: SharedMemoryRegistry, key: str
) -> None:
    lease = Lease(front)
    lease.reserve("OUT", "r", 8192, OUT_OF_BAND)
    lease.reserve("TEXT", "r", 0, 64)
    targets = lease.places()
    assert dict(targets)["OUT"] == ("r", key, 0, 8192, OUT_OF_BAND)
    values = np.arange(ELEMENTS, dtype=np.float32).reshape(1, -1)
    words = np.array([b"ab"], dtype=object)
    answer = InferenceResponse(
        "m",
        "1",
        outputs=[
            Tensor("OUT", "FP32", values.shape, values),
            Tensor("TEXT", "BYTES", (1,), words),  # not numbers: the front end writes it
            Tensor("OTHER", "FP32", (1,), np.ones(1, np.float32)),
        ],
    )

    written = connection(engine)._write_targets(answer, targets)
    out = written.outputs[0].data
    assert address_of(memoryview(out)) == region(engine).address + 8192
    assert written.outputs[1].data is words and answer.outputs[0].data is values  # unchanged
    sent = frame(m.Answer(5, written), engine)
    assert len(sent) < 1024  # the output crosses as its place

    [received] = FrameReader(regions=front).feed(sent)
    response = received.value  # type: ignore[attr-defined]
    assert lease.copy_size(response) == response.outputs[1].data.nbytes  # only TEXT
    assert lease.write(response) == {"OUT", "TEXT"}
    got = np.frombuffer(region(front).read(8192, OUT_OF_BAND), np.float32)
    np.testing.assert_array_equal(got, values.reshape(-1))
    lease.release()


def test_an_output_larger_than_its_place_fails_as_the_front_end_would_fail_it(
    front: SharedMemoryRegistry, engine: SharedMemoryRegistry
) -> None:
    lease = Lease(front)
    lease.reserve("OUT", "r", 0, 8)
    data = np.ones(ELEMENTS, np.float32)
    answer = InferenceResponse("m", "1", outputs=[Tensor("OUT", "FP32", data.shape, data)])
    with pytest.raises(TritonError) as caught:
        connection(engine)._write_targets(answer, lease.places())
    assert (caught.value.code, caught.value.message) == (
        ErrorCode.INTERNAL,
        "shared memory size specified with the request for output 'OUT' (8 bytes) should be at "
        f"least {OUT_OF_BAND} bytes to hold the results",
    )
    lease.release()


def test_a_small_output_is_left_to_the_front_end_which_writes_it_once(
    front: SharedMemoryRegistry, engine: SharedMemoryRegistry
) -> None:
    # It crosses inside the frame anyway: writing it in the engine too would copy it twice.
    lease = Lease(front)
    lease.reserve("OUT", "r", 0, 16)
    small = np.arange(4, dtype=np.int32)
    answer = InferenceResponse("m", "1", outputs=[Tensor("OUT", "INT32", (4,), small)])
    assert connection(engine)._write_targets(answer, lease.places()).outputs[0].data is small
    assert lease.write(answer) == {"OUT"}
    assert np.frombuffer(region(front).read(0, 16), np.int32).tolist() == [0, 1, 2, 3]
    lease.release()


def test_data_at_the_targets_place_in_another_dtype_is_still_converted(
    front: SharedMemoryRegistry,
) -> None:
    lease = Lease(front)
    lease.reserve("OUT", "r", 0, 64)
    doubles = np.frombuffer(region(front).read(0, 32), np.float64)  # FP64 data, FP32 output
    assert not lease.outputs["OUT"].holds(Tensor("OUT", "FP32", (4,), doubles))
    same = np.frombuffer(region(front).read(0, 16), np.float32)
    assert lease.outputs["OUT"].holds(Tensor("OUT", "FP32", (4,), same))
    lease.release()


def test_a_request_with_outputs_in_a_region_crosses_with_their_places(
    front: SharedMemoryRegistry, engine: SharedMemoryRegistry
) -> None:
    lease = Lease(front)
    lease.reserve("OUT", "r", 0, 16)
    request = InferenceRequest("m", outputs=[RequestedOutput("OUT")])
    [received] = FrameReader(regions=engine).feed(
        frame(m.Submit(2, request, targets=lease.places()), front)
    )
    assert received.targets == lease.places()  # type: ignore[attr-defined]
    lease.release()


def test_the_engine_fails_back_a_request_it_could_not_read(engine: SharedMemoryRegistry) -> None:
    crossing = connection(engine)
    crossing._lane = Lane()
    crossing._transport = transport = Transport()
    gone = TritonError(ErrorCode.UNAVAILABLE, "shared memory region 'r' was unregistered")
    crossing._dispatch(m.Failed(5, gone))  # what the reader made of the request
    [failed] = FrameReader().feed(b"".join(transport.written))
    assert isinstance(failed, m.Failed)
    assert (failed.id, failed.error.code, failed.error.message) == (5, gone.code, gone.message)


def test_a_write_that_fails_oddly_still_answers_its_request(
    front: SharedMemoryRegistry, engine: SharedMemoryRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Else the front end would wait for ever, holding its lease on the region.
    def broken(*_: object) -> None:
        raise ValueError("not what anyone expected")

    monkeypatch.setattr(engine, "write_at", broken)
    lease = Lease(front)
    lease.reserve("OUT", "r", 0, OUT_OF_BAND)
    crossing = connection(engine)
    crossing._lane = Lane()
    crossing._transport = transport = Transport()
    request = InferenceRequest("m")
    crossing._requests = {4: request}
    crossing._targets = {4: lease.places()}
    data = np.ones(ELEMENTS, np.float32)
    answered: Reply[InferenceResponse] = Reply()
    answered.set(InferenceResponse("m", "1", outputs=[Tensor("OUT", "FP32", data.shape, data)]))
    crossing._answer(4, answered)
    [failed] = FrameReader().feed(b"".join(transport.written))
    assert isinstance(failed, m.Failed) and failed.id == 4
    assert failed.error.code is ErrorCode.INTERNAL
    assert "not what anyone expected" in failed.error.message
    lease.release()


def test_a_part_whose_tensor_cannot_be_seen_ends_its_stream(
    front: SharedMemoryRegistry, engine: SharedMemoryRegistry
) -> None:
    lease = Lease(front)
    data = np.frombuffer(lease.read("r", 0, OUT_OF_BAND), np.float32)
    part = m.Part(
        3, InferenceResponse("m", "1", outputs=[Tensor("O", "FP32", data.shape, data)]), None, False
    )
    sent = frame(part, front)
    engine.unregister(Kind.SYSTEM, "r")
    [ended] = FrameReader(regions=engine).feed(sent)
    assert isinstance(ended, m.Part)
    assert (ended.id, ended.response, ended.final) == (3, None, True)
    assert ended.error is not None and ended.error.code is ErrorCode.UNAVAILABLE
    lease.release()


def test_a_region_retired_while_held_frees_its_name_and_closes_when_let_go(
    front: SharedMemoryRegistry, key: str
) -> None:
    # A front end following the engine's unregistration while one of its requests holds it.
    lease = Lease(front)
    data = np.frombuffer(lease.read("r", 0, 16), np.uint8)
    old = region(front)
    front.retire(Kind.SYSTEM, "r")
    assert front.status(Kind.SYSTEM) == []
    front.register_system("r", key, 0, 4096)  # the engine's new registration under the name
    assert region(front) is not old and front.locate(memoryview(data)) is None
    assert data.tolist() == [0] * 16  # the held request still reads its memory
    del data
    lease.release()
    with pytest.raises(TritonError, match="is unregistered"):  # closed at the last release
        old.read(0, 16)
