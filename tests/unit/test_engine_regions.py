"""Tensors in a client's system shared-memory region cross between a front end and the engine
as where they lie: both processes map the region, so the receiver views its own mapping and no
byte of the tensor is copied on the way (engine/wire.py, `SharedMemoryRegistry.locate`)."""

from __future__ import annotations

import mmap
import uuid
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import tritonclient.utils.shared_memory as client_shm

from tests.unit.test_engine_wire import Transport
from tritonactor.actors import Reply
from tritonactor.core.errors import ErrorCode, TritonError
from tritonactor.core.types import (
    OUTPUT_BUFFERS,
    InferenceRequest,
    InferenceResponse,
    RequestedOutput,
    Tensor,
)
from tritonactor.engine import messages as m
from tritonactor.engine.frame_reader import FrameReader
from tritonactor.engine.host import _bytes_due, _Connection
from tritonactor.engine.lanes import Lane, LaneReader
from tritonactor.engine.wire import OUT_OF_BAND, encode
from tritonactor.memory.lease import Lease, attach, release
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
    crossing._transport = object()  # (its front end is connected)
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


def test_the_engine_offers_a_backend_the_places_outputs_are_due_in_and_leaves_what_it_wrote_there(
    front: SharedMemoryRegistry, engine: SharedMemoryRegistry
) -> None:
    lease = Lease(front)
    lease.reserve("OUT", "r", 8192, OUT_OF_BAND)
    lease.reserve("LATE", "r", 2 * OUT_OF_BAND, OUT_OF_BAND)
    targets = lease.places()
    request = InferenceRequest("m")
    buffers = connection(engine)._buffers(targets, request)
    assert set(buffers) == {"OUT", "LATE"}
    assert address_of(buffers["OUT"]) == region(engine).address + 8192
    assert buffers["OUT"].nbytes == OUT_OF_BAND and not buffers["OUT"].readonly
    # A backend wrote OUT where it is due (in the engine's mapping), LATE elsewhere.
    values = np.arange(ELEMENTS, dtype=np.float32).reshape(1, -1)
    written = np.frombuffer(buffers["OUT"], np.float32).reshape(1, -1)
    written[...] = values
    elsewhere = values + 1
    answer = InferenceResponse(
        "m",
        "1",
        outputs=[
            Tensor("OUT", "FP32", values.shape, written),
            Tensor("LATE", "FP32", values.shape, elsewhere),
        ],
    )
    assert _bytes_due(answer, targets, engine) == elsewhere.nbytes  # only LATE is copied
    longer = np.frombuffer(region(engine).read(8192, OUT_OF_BAND + 4), np.float32)
    assert not engine.lies_at(longer, targets[0][1])  # larger than its place: not "there"
    placed = connection(engine)._write_targets(answer, targets)
    assert placed.outputs[0].data is written  # left where it is: no copy onto itself
    assert (
        address_of(memoryview(placed.outputs[1].data)) == region(engine).address + 2 * OUT_OF_BAND
    )
    [received] = FrameReader(regions=front).feed(frame(m.Answer(5, placed), engine))
    response = received.value  # type: ignore[attr-defined]
    assert lease.copy_size(response) == 0  # both lie where they are due, seen from the front
    for offset, expected in ((8192, values), (2 * OUT_OF_BAND, elsewhere)):
        got = np.frombuffer(region(front).read(offset, OUT_OF_BAND), np.float32)
        np.testing.assert_array_equal(got, expected.reshape(-1))
    lease.release()


def test_a_submitted_request_reaches_its_model_with_the_places_its_outputs_are_due_in(
    front: SharedMemoryRegistry, engine: SharedMemoryRegistry
) -> None:
    lease = Lease(front)
    lease.reserve("OUT", "r", 8192, OUT_OF_BAND)
    submitted: list[InferenceRequest] = []

    class Router:
        loader = None

        def submit(self, request: InferenceRequest) -> Reply[InferenceResponse]:
            submitted.append(request)
            return Reply()

    crossing = connection(engine)
    crossing._host = SimpleNamespace(server=SimpleNamespace(router=Router()), continue_trace=None)
    crossing._requests, crossing._targets = {}, {}
    request = InferenceRequest("m", outputs=[RequestedOutput("OUT")])
    crossing._dispatch(m.Submit(3, request, targets=lease.places()))
    [reached] = submitted
    [buffer] = reached.context[OUTPUT_BUFFERS](reached).values()
    assert address_of(buffer) == region(engine).address + 8192
    assert crossing._targets == {3: lease.places()}
    crossing._transport = None  # the front end has gone: nothing is offered any more
    assert reached.context[OUTPUT_BUFFERS](reached) == {}
    lease.release()


def test_an_output_place_of_a_negative_grpc_size_is_left_to_the_front_end(
    front: SharedMemoryRegistry, engine: SharedMemoryRegistry
) -> None:
    """A negative gRPC byte size passes the unsigned bounds check as a huge one: the engine
    does not write there (it raised a ValueError); the front end's lease refuses it."""
    lease = Lease(front)
    lease.reserve("OUT", "r", 4096, -4)
    [(_, place)] = lease.places()
    with pytest.raises(TritonError):
        engine.write_at(place, np.zeros(8, np.uint8))
    answer = InferenceResponse(
        "m", "1", outputs=[Tensor("OUT", "FP32", (SIZE,), np.zeros(SIZE, np.float32))]
    )
    with pytest.raises(TritonError, match="too few for output 'OUT'"):
        lease.write(answer)
    lease.release()


def test_no_place_is_offered_in_a_region_the_engine_lacks(
    front: SharedMemoryRegistry, engine: SharedMemoryRegistry
) -> None:
    lease = Lease(front)
    lease.reserve("OUT", "r", 0, 64)
    engine.unregister(Kind.SYSTEM, "r")
    assert connection(engine)._buffers(lease.places(), InferenceRequest("m")) == {}
    lease.release()


def test_a_lease_tells_a_backend_in_its_process_where_outputs_go_until_it_is_released(
    front: SharedMemoryRegistry,
) -> None:
    lease = Lease(front)
    lease.reserve("OUT", "r", 4096, 64)
    request = InferenceRequest("m")
    attach(request, lease)
    [buffer] = request.context[OUTPUT_BUFFERS](request).values()
    assert address_of(buffer) == region(front).address + 4096 and buffer.nbytes == 64
    in_place = np.frombuffer(buffer, np.float32)
    in_place[...] = 7
    answer = InferenceResponse("m", "1", outputs=[Tensor("OUT", "FP32", (16,), in_place)])
    assert lease.copy_size(answer) == 0 and lease.write(answer) == {"OUT"}
    release(request)
    assert OUTPUT_BUFFERS not in request.context
    del buffer, in_place, answer


def test_no_place_is_offered_that_overlaps_an_input_or_another_output_in_the_same_object(
    key: str, front: SharedMemoryRegistry
) -> None:
    # The same object registered twice, under another spelling of its key: two regions, two
    # mappings, two addresses, two keys.
    front.register_system("again", key.lstrip("/"), 0, SIZE)
    values = np.arange(16, dtype=np.float32)
    region(front).write(0, values.view(np.uint8))
    lease = Lease(front)
    data = np.frombuffer(lease.read("r", 0, values.nbytes), np.float32)  # read at 0..64 of r
    lease.reserve("CLASH", "again", 32, 64)  # bytes 32..96 of the object: the input's too
    lease.reserve("APART", "again", 4096, 64)
    lease.reserve("TWIN", "r", 8192, 64)
    lease.reserve("TWIN2", "again", 8192 + 32, 64)  # the object's bytes 8224..8288: TWIN's too
    request = InferenceRequest("m", inputs=[Tensor("IN", "FP32", (16,), data)])
    assert set(lease.buffers(request)) == {"APART"}
    assert set(lease.buffers(InferenceRequest("m"))) == {"CLASH", "APART"}
    # An input in shared memory no region here holds (unregistered while its request ran):
    # where it lies cannot be told, so nothing is offered.
    stray = mmap.mmap(-1, 4096)
    unknown = np.frombuffer(memoryview(stray), np.float32)
    elsewhere = InferenceRequest("m", inputs=[Tensor("IN", "FP32", unknown.shape, unknown)])
    assert lease.buffers(elsewhere) == {}
    plain = np.zeros(4, np.float32)  # ordinary memory: no shared memory to overlap
    ordinary = InferenceRequest("m", inputs=[Tensor("IN", "FP32", (4,), plain)])
    assert set(lease.buffers(ordinary)) == {"CLASH", "APART"}
    del unknown, elsewhere
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
