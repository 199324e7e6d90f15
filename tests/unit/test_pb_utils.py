"""`triton_python_backend_utils` in-process, without a stub: Triton's argument checks, the
response sender's rules (with a stand-in stub), the decoupled BLS response iterator, and the
python backend's settings and shared-memory arenas."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from tritonactor.backends.python import _pb_runtime, ipc
from tritonactor.backends.python import triton_python_backend_utils as pb_utils
from tritonactor.backends.python.process import StubSettings
from tritonactor.backends.python.stub_calls import ResponseIterator
from tritonactor.core.errors import ErrorCode, TritonError

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class RecordingStub:
    """Stands in for the stub: records what a response sender passes on."""

    def __init__(self) -> None:
        self.sent: list[tuple[int, Any, int]] = []
        self.dropped: list[int] = []

    def send_response(self, key: int, response: Any, flags: int, requested: Any) -> None:
        self.sent.append((key, response, flags))

    def sender_dropped(self, key: int) -> None:
        self.dropped.append(key)


@pytest.fixture
def stub() -> Iterator[RecordingStub]:
    recording = RecordingStub()
    _pb_runtime.stub = recording
    yield recording
    _pb_runtime.stub = None


def response() -> pb_utils.InferenceResponse:
    return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([1], np.int32))])


# -- argument checks, as Triton's bindings make them -------------------------------------------


def test_using_decoupled_model_transaction_policy() -> None:
    decoupled = {"model_transaction_policy": {"decoupled": True}}
    assert pb_utils.using_decoupled_model_transaction_policy(decoupled) is True
    assert pb_utils.using_decoupled_model_transaction_policy({}) is False
    plain = {"model_transaction_policy": {"decoupled": False}}
    assert pb_utils.using_decoupled_model_transaction_policy(plain) is False


@pytest.mark.parametrize(
    "arguments",
    [
        {"inputs": None},
        {"model_name": None},
        {"requested_output_names": None},
        {"requested_output_names": [None]},
        {"correlation_id": None},
        {"request_id": None},
        {"model_version": None},
        {"flags": None},
    ],
)
def test_inference_request_wrong_types_are_type_errors(arguments: dict[str, Any]) -> None:
    given = {"model_name": "m", "inputs": [], "requested_output_names": ["OUT"], **arguments}
    with pytest.raises(TypeError):
        pb_utils.InferenceRequest(**given)


def test_inference_request_ids_and_flags_out_of_their_range_are_refused_as_triton_does() -> None:
    for number in (-1, 2**64):
        with pytest.raises(RuntimeError, match="Unable to cast Python instance to C"):
            pb_utils.InferenceRequest(model_name="m", correlation_id=number)
    with pytest.raises(pb_utils.TritonModelException, match="must be integer or string"):
        pb_utils.InferenceRequest(model_name="m", correlation_id=1.5)  # type: ignore[arg-type]
    for flags in (-1, 2**32):
        with pytest.raises(TypeError):
            pb_utils.InferenceRequest(model_name="m", flags=flags)
    assert pb_utils.InferenceRequest(model_name="m", correlation_id=2**64 - 1).correlation_id()
    # What an int can be made of is taken as that int, as Triton's bindings take it.
    assert pb_utils.InferenceRequest(model_name="m", correlation_id=True).correlation_id() == 1
    assert pb_utils.InferenceRequest(model_name="m", flags=np.uint32(1)).flags() == 1
    assert pb_utils.InferenceRequest(model_name="m", flags=True).flags() == 1
    assert pb_utils.InferenceRequest(model_name="m", flags=np.bool_(True)).flags() == 1
    assert pb_utils.InferenceRequest(model_name="m", model_version=np.int64(2)).model_version() == 2
    with pytest.raises(pb_utils.TritonModelException):  # Triton checks for an int or a str
        pb_utils.InferenceRequest(model_name="m", correlation_id=np.int64(5))


def test_inference_request_none_among_inputs_is_a_model_exception() -> None:
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.InferenceRequest(model_name="m", inputs=[None], requested_output_names=[])


def test_inference_request_correlation_id_keeps_its_type() -> None:
    assert pb_utils.InferenceRequest(model_name="m", correlation_id=5).correlation_id() == 5
    text = pb_utils.InferenceRequest(model_name="m", correlation_id="s-5").correlation_id()
    assert text == "s-5"
    assert pb_utils.InferenceRequest(model_name="m").correlation_id() == 0


def test_inference_response_and_tensor_arguments() -> None:
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.InferenceResponse(output_tensors=[None])
    with pytest.raises(TypeError):
        pb_utils.InferenceResponse(output_tensors=None)
    assert pb_utils.InferenceResponse().output_tensors() == []
    with pytest.raises(TypeError):
        pb_utils.Tensor(None, np.array([1]))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        pb_utils.Tensor("OUT", None)
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.Tensor.from_dlpack("OUT", None)
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.Tensor.from_dlpack("", None)


def test_logger_wants_a_level_and_a_string() -> None:
    with pytest.raises(TypeError):
        pb_utils.Logger.log("x", None)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        pb_utils.Logger.log("x", 1)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        pb_utils.Logger.log_info(None)  # type: ignore[arg-type]
    pb_utils.Logger.log("fine", pb_utils.Logger.LogLevel.WARNING)


def test_triton_error_codes_are_tritons_numbers() -> None:
    error = pb_utils.TritonError("m", pb_utils.TritonError.UNKNOWN)
    assert error.code() == pb_utils.TritonError.UNKNOWN == 0
    assert pb_utils.TritonError("m").code() == pb_utils.TritonError.INTERNAL == 1
    # The server's codes carry the same names and numbers.
    for name in ("UNKNOWN", "INTERNAL", "NOT_FOUND", "INVALID_ARG", "CANCELLED"):
        assert ErrorCode[name].value == getattr(pb_utils.TritonError, name)
    with pytest.raises(TypeError):
        pb_utils.TritonError(None)  # type: ignore[arg-type]


def test_requested_output_names_is_a_set() -> None:
    built = pb_utils.InferenceRequest(model_name="m", requested_output_names=["B", "A", "B"])
    assert built.requested_output_names() == {"A", "B"}


# -- the response sender's rules ------------------------------------------------------------


def test_decoupled_sender_takes_many_then_nothing_after_final(stub: RecordingStub) -> None:
    sender = pb_utils.ResponseSender(1, decoupled=True)
    sender.send(response())
    sender.send(response())
    sender.send(flags=FINAL)
    with pytest.raises(pb_utils.TritonModelException, match="has been closed"):
        sender.send(response())
    assert [flags for _, _, flags in stub.sent] == [0, 0, FINAL]


def test_sender_refuses_bad_flags_and_empty_responses(stub: RecordingStub) -> None:
    sender = pb_utils.ResponseSender(1, decoupled=True)
    with pytest.raises(pb_utils.TritonModelException, match="Unsupported flag"):
        sender.send(response(), flags=5)
    with pytest.raises(pb_utils.TritonModelException, match="must be provided"):
        sender.send()
    assert stub.sent == []


def test_non_decoupled_sender_takes_one_response(stub: RecordingStub) -> None:
    sender = pb_utils.ResponseSender(2, decoupled=False)
    with pytest.raises(pb_utils.TritonModelException, match="complete final before"):
        sender.send(flags=FINAL)
    sender.send(response())
    with pytest.raises(pb_utils.TritonModelException, match="more than one response"):
        sender.send(response())
    sender.send(flags=FINAL)
    assert [flags for _, _, flags in stub.sent] == [0, FINAL]


def test_unfinished_sender_let_go_is_reported(stub: RecordingStub) -> None:
    finished = pb_utils.ResponseSender(3, decoupled=True)
    finished.send(flags=FINAL)
    del finished
    forgotten = pb_utils.ResponseSender(4, decoupled=True)
    del forgotten
    assert stub.dropped == [4]


# -- the decoupled BLS iterator ---------------------------------------------------------------


def test_response_iterator_yields_as_they_come_and_again_from_the_start() -> None:
    iterator = ResponseIterator()
    feeder = threading.Thread(
        target=lambda: [iterator.put(n, final=n == 2) for n in range(3)], daemon=True
    )
    feeder.start()
    assert list(iterator) == [0, 1, 2]
    assert list(iterator) == [0, 1, 2]
    feeder.join()


def test_response_iterator_async_for_does_not_block_the_loop() -> None:
    async def main() -> list[int]:
        iterator = ResponseIterator()
        loop = asyncio.get_running_loop()
        seen: list[int] = []

        async def consume() -> None:
            async for value in iterator:
                seen.append(value)

        consumer = asyncio.create_task(consume())
        for n in range(3):
            await asyncio.sleep(0)  # the loop is free while the consumer waits
            await loop.run_in_executor(None, iterator.put, n, n == 2)
        await asyncio.wait_for(consumer, 60)
        return seen

    assert asyncio.run(main()) == [0, 1, 2]


# -- settings and arenas ----------------------------------------------------------------------


def test_backend_settings_from_backend_config() -> None:
    settings = StubSettings.from_backend_config(
        {
            "stub-timeout-seconds": "120",
            "shm-default-byte-size": "1048576",
            "shm-growth-byte-size": "65536",
            "shm-region-prefix-name": "prefix",  # accepted, means nothing here
            "default-max-batch-size": "4",
        }
    )
    assert settings == StubSettings(120.0, 1 << 20, 1 << 16)
    assert StubSettings.from_backend_config({}) == StubSettings()


@pytest.mark.parametrize("value", ["0", "-3", "lots"])
def test_backend_setting_that_is_not_a_positive_number_is_refused(value: str) -> None:
    with pytest.raises(TritonError, match="shm-default-byte-size must be a positive integer"):
        StubSettings.from_backend_config({"shm-default-byte-size": value})


def test_arena_starts_at_the_default_size_and_grows_by_the_step(tmp_path: Any) -> None:
    arena = ipc.Arena(f"test-arena-{id(tmp_path)}", default_size=4096, growth=1000)
    try:
        arena.reserve(10)
        assert arena.size == 4096
        arena.reserve(4097)
        assert arena.size == 5096
        arena.reserve(7000)
        assert arena.size == 7096
    finally:
        arena.close()
    doubling = ipc.Arena(f"test-arena2-{id(tmp_path)}", default_size=4096)
    try:
        doubling.reserve(5000)
        assert doubling.size == 8192
    finally:
        doubling.close()


def test_a_bf16_tensor_goes_to_dlpack_and_back_through_torch() -> None:
    """numpy has no DLPack type for BF16: Triton's models read BF16 through torch's DLPack,
    and so do ours (found by a differential fuzz: to_dlpack raised numpy's BufferError)."""
    torch = pytest.importorskip("torch")
    ml_dtypes = pytest.importorskip("ml_dtypes")
    data = np.array([[1.5, -2.0, 3.25]], dtype=ml_dtypes.bfloat16)
    tensor = pb_utils.Tensor("IN", data)
    as_torch = torch.utils.dlpack.from_dlpack(tensor.to_dlpack())
    assert as_torch.dtype == torch.bfloat16
    assert as_torch.float().tolist() == [[1.5, -2.0, 3.25]]
    for source in (tensor.to_dlpack(), as_torch, tensor):  # a capsule, a torch tensor, ours
        back = pb_utils.Tensor.from_dlpack("OUT", source).as_numpy()
        assert back.dtype == data.dtype
        assert back.tobytes() == data.tobytes()


def test_a_tensor_is_refused_as_triton_refuses_it_where_the_model_can_catch_it() -> None:
    with pytest.raises(pb_utils.TritonModelException, match=r"^NumPy dtype is not supported\.$"):
        pb_utils.Tensor("OUT", np.array([1 + 2j], dtype=np.complex64))
    with pytest.raises(pb_utils.TritonModelException, match=r"^Tensor name cannot be an empty"):
        pb_utils.Tensor("", np.zeros(2, dtype=np.float32))
    # Accepted, where Triton's are stricter (docs/python-backend.md): str arrays become BYTES.
    assert pb_utils.Tensor("S", np.array(["u"])).as_numpy().dtype == np.object_


def test_an_error_message_may_be_bytes_and_a_response_refuses_a_none_tensor() -> None:
    assert pb_utils.TritonError(b"as bytes").message() == "as bytes"
    with pytest.raises(pb_utils.TritonModelException) as caught:
        pb_utils.InferenceResponse([None])
    assert str(caught.value) == "Output tensor for inference response should not be empty."
