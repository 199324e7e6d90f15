"""ModelInfer / ModelStreamInfer messages on the wire, in protobuf's C runtime (upb).

grpclib hands each method's request type the message's bytes (`FromString`) and asks its reply
type for bytes (`SerializeToString`): these classes are those types. Everything but the tensor
data is parsed and serialized by upb (`tritonactor._proto_c`); the tensor data never enter a
upb message:

- `InferRequestMessage.FromString` finds the `raw_input_contents` entries in the request's bytes
  and keeps them as memoryviews of those bytes (no copy); upb parses the rest.
- `InferResponseMessage.SerializeToString` lets upb serialize the response without its
  `raw_output_contents` and appends each entry after it, copied once into the reply. (upb's
  encoder handles a 1 MiB bytes field at ~1 ms; a message may carry a repeated field anywhere
  and in pieces, so the reply is the same message.)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from tritonactor._proto_c.grpc_service_pb2 import ModelInferRequest, ModelInferResponse

# A tensor's bytes: bytes, or any C-contiguous buffer (a memoryview, a uint8 numpy array).
Buffer = Any

_RAW_INPUT_CONTENTS = 7  # ModelInferRequest.raw_input_contents
_RAW_OUTPUT_CONTENTS_TAG = b"\x32"  # ModelInferResponse.raw_output_contents (6), length-delimited
_ERROR_MESSAGE_TAG = b"\x0a"  # ModelStreamInferResponse.error_message (1)
_INFER_RESPONSE_TAG = b"\x12"  # ModelStreamInferResponse.infer_response (2)
# Below this size the request goes to upb whole: finding the raw entries costs more than the
# copies it saves.
_SPLIT_FROM = 16 * 1024


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _read_varint(data: memoryview, position: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, position
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _split_raw(data: bytes) -> tuple[bytes, list[memoryview]]:
    """`data` without its raw_input_contents fields, and those fields' values (views of
    `data`). Raises ValueError or IndexError on bytes that are not a well-formed message."""
    view = memoryview(data)
    size = len(view)
    rest: list[memoryview] = []
    raw: list[memoryview] = []
    position = 0
    while position < size:
        start = position
        tag, position = _read_varint(view, position)
        # As protobuf reads a tag: at most 5 bytes, 32 bits, a field number from 1.
        if position - start > 5 or tag > 0xFFFFFFFF or tag < 8:
            raise ValueError("malformed tag")
        wire_type = tag & 7
        if wire_type == 2:
            length, position = _read_varint(view, position)
            end = position + length
            if end > size:
                raise ValueError("truncated message")
            if tag >> 3 == _RAW_INPUT_CONTENTS:
                raw.append(view[position:end])
                position = end
                continue
            position = end
        elif wire_type == 0:
            _, position = _read_varint(view, position)
        elif wire_type == 1:
            position += 8
        elif wire_type == 5:
            position += 4
        else:
            raise ValueError(f"unexpected wire type {wire_type}")
        if position > size:
            raise ValueError("truncated message")
        rest.append(view[start:position])
    return b"".join(rest), raw


class InferRequestMessage:
    """A ModelInferRequest: `message` (upb) with its raw_input_contents in `raw`."""

    __slots__ = ("message", "raw")

    def __init__(self, message: ModelInferRequest, raw: Sequence[Buffer]) -> None:
        self.message = message
        self.raw = raw

    @classmethod
    def FromString(cls, data: bytes) -> InferRequestMessage:
        if len(data) >= _SPLIT_FROM:
            try:
                rest, raw = _split_raw(data)
            except (ValueError, IndexError):
                pass  # upb has the last word: protobuf's DecodeError, or a message after all
            else:
                return cls(ModelInferRequest.FromString(rest), raw)
        message = ModelInferRequest.FromString(data)
        return cls(message, [memoryview(entry) for entry in message.raw_input_contents])

    @property
    def model_name(self) -> str:
        return self.message.model_name

    @property
    def model_version(self) -> str:
        return self.message.model_version

    @property
    def id(self) -> str:
        return self.message.id


class InferResponseMessage:
    """A ModelInferResponse: `message` (upb, without tensor data) and the raw_output_contents
    entries in `raw`, joined to it when serialized."""

    __slots__ = ("message", "raw")

    def __init__(self, message: ModelInferResponse, raw: list[Buffer]) -> None:
        self.message = message
        self.raw = raw

    @property
    def outputs(self) -> Any:
        return self.message.outputs

    @property
    def parameters(self) -> Any:
        return self.message.parameters

    @property
    def raw_output_contents(self) -> list[bytes]:
        return [bytes(entry) for entry in self.raw]

    def pieces(self) -> tuple[list[Buffer], int]:
        """The serialized message as pieces to join, and its size."""
        head = self.message.SerializeToString()
        pieces: list[Buffer] = [head]
        size = len(head)
        for entry in self.raw:
            length = memoryview(entry).nbytes
            prefix = _RAW_OUTPUT_CONTENTS_TAG + _varint(length)
            pieces.append(prefix)
            pieces.append(entry)
            size += len(prefix) + length
        return pieces, size

    def SerializeToString(self) -> bytes:
        return b"".join(self.pieces()[0])

    def to_message(self) -> ModelInferResponse:
        """The whole response as one upb message (tests and tools; the server never needs it)."""
        message = ModelInferResponse()
        message.CopyFrom(self.message)
        message.raw_output_contents.extend(self.raw_output_contents)
        return message


class StreamInferResponse:
    """A ModelStreamInferResponse: an error message and/or an infer response."""

    __slots__ = ("_data", "error_message", "infer_response")

    def __init__(
        self, error_message: str = "", infer_response: InferResponseMessage | None = None
    ) -> None:
        self.error_message = error_message
        self.infer_response = infer_response
        self._data: bytes | None = None

    def freeze(self) -> StreamInferResponse:
        """Serialize now: the answer then holds no view of the model's output, which a
        decoupled model may reuse before the stream's writer sends it."""
        self._data = b"".join(self._pieces())
        return self

    def SerializeToString(self) -> bytes:  # grpclib's name for it
        if self._data is not None:
            return self._data
        return b"".join(self._pieces())

    def _pieces(self) -> Iterator[Buffer]:
        if self.error_message:
            text = self.error_message.encode()
            yield _ERROR_MESSAGE_TAG + _varint(len(text))
            yield text
        if self.infer_response is not None:
            pieces, size = self.infer_response.pieces()
            yield _INFER_RESPONSE_TAG + _varint(size)
            yield from pieces
