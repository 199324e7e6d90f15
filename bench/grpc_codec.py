"""The gRPC inference codec alone: betterproto2 (pure Python) against protobuf's C runtime (upb).

    python bench/grpc_codec.py [--seconds 1.0]

For a ModelInfer request of one FP32 input (16 elements, then 1 MiB) and its response, each
way parses the request's wire bytes, reads what the server reads (names, datatypes, shapes,
parameters, the raw bytes as a numpy view), builds the response (one output, raw contents, a
parameter) and serializes it. Microseconds per request:

- betterproto2: its generated messages (tritonactor._proto), as the server used before;
- upb message: protobuf's messages (tritonactor._proto_c) holding the tensor bytes too;
- upb wire: as the server does now (frontends/grpc/wire.py): upb without the tensor bytes,
  which stay views of the request and are joined once into the reply;
- server codec: the server's own `decode_infer_request` + `encode_infer_response` +
  serialization, on the wire classes.

The ratio is betterproto2 / upb wire.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

from tritonactor._proto import inference as bp
from tritonactor._proto_c import grpc_service_pb2 as upb
from tritonactor.core.types import InferenceResponse, Tensor
from tritonactor.frontends.grpc.codec import decode_infer_request, encode_infer_response
from tritonactor.frontends.grpc.wire import InferRequestMessage, InferResponseMessage


def request_bytes(elements: int) -> bytes:
    message = upb.ModelInferRequest(model_name="identity_fp32", id="42")
    tensor = message.inputs.add(name="INPUT0", datatype="FP32", shape=[1, elements])
    tensor.parameters["binary_data_size"].int64_param = 4 * elements
    message.outputs.add(name="OUTPUT0")
    message.raw_input_contents.append(np.ones(elements, dtype=np.float32).tobytes())
    return message.SerializeToString()


def with_betterproto2(data: bytes) -> bytes:
    message = bp.ModelInferRequest.parse(data)
    arrays = []
    for index, tensor in enumerate(message.inputs):
        shape = tuple(tensor.shape)
        parameters = {key: value for key, value in tensor.parameters.items()}
        arrays.append((tensor.name, tensor.datatype, shape, parameters))
        array = np.frombuffer(memoryview(message.raw_input_contents[index]), dtype=np.float32)
    names = [output.name for output in message.outputs]
    response = bp.ModelInferResponse(
        model_name=message.model_name,
        model_version="1",
        id=message.id,
        parameters={"sequence": bp.InferParameter(bool_param=True)},
        outputs=[
            bp.ModelInferResponseInferOutputTensor(
                name=names[0], datatype="FP32", shape=list(arrays[0][2])
            )
        ],
        raw_output_contents=[bytes(array.view(np.uint8))],
    )
    return bytes(response)


def with_upb(data: bytes) -> bytes:
    message = upb.ModelInferRequest.FromString(data)
    arrays = []
    raw = message.raw_input_contents
    for index, tensor in enumerate(message.inputs):
        shape = tuple(tensor.shape)
        parameters = {key: value for key, value in tensor.parameters.items()}
        arrays.append((tensor.name, tensor.datatype, shape, parameters))
        array = np.frombuffer(memoryview(raw[index]), dtype=np.float32)
    names = [output.name for output in message.outputs]
    response = upb.ModelInferResponse(model_name=message.model_name, model_version="1")
    response.id = message.id
    response.parameters["sequence"].bool_param = True
    response.outputs.add(name=names[0], datatype="FP32", shape=arrays[0][2])
    response.raw_output_contents.append(bytes(array.view(np.uint8)))
    return response.SerializeToString()


def with_upb_wire(data: bytes) -> bytes:
    wire = InferRequestMessage.FromString(data)
    message = wire.message
    arrays = []
    for index, tensor in enumerate(message.inputs):
        shape = tuple(tensor.shape)
        parameters = {key: value for key, value in tensor.parameters.items()}
        arrays.append((tensor.name, tensor.datatype, shape, parameters))
        array = np.frombuffer(wire.raw[index], dtype=np.float32)
    names = [output.name for output in message.outputs]
    response = upb.ModelInferResponse(model_name=message.model_name, model_version="1")
    response.id = message.id
    response.parameters["sequence"].bool_param = True
    response.outputs.add(name=names[0], datatype="FP32", shape=arrays[0][2])
    return InferResponseMessage(response, [array.view(np.uint8)]).SerializeToString()


def with_server_codec(data: bytes) -> bytes:
    request = decode_infer_request(InferRequestMessage.FromString(data))
    tensor = request.inputs[0]
    response = InferenceResponse(
        request.model_name,
        "1",
        id=request.id,
        outputs=[Tensor("OUTPUT0", tensor.datatype, tensor.shape, tensor.data)],
    )
    return encode_infer_response(response, request=request).SerializeToString()


def per_call_us(function: Callable[[bytes], bytes], data: bytes, seconds: float) -> float:
    function(data)  # warm up
    calls, start = 0, time.perf_counter()
    deadline = start + seconds
    while True:
        for _ in range(50):
            function(data)
        calls += 50
        now = time.perf_counter()
        if now >= deadline:
            return (now - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="time per measurement")
    args = parser.parse_args()
    # The same answer from both, byte for byte modulo field order: compare parsed messages.
    for elements in (16, 262144):
        data = request_bytes(elements)
        expected = upb.ModelInferResponse.FromString(with_betterproto2(data))
        for way in (with_upb, with_upb_wire):
            assert upb.ModelInferResponse.FromString(way(data)) == expected
        old = per_call_us(with_betterproto2, data, args.seconds)
        whole = per_call_us(with_upb, data, args.seconds)
        wire = per_call_us(with_upb_wire, data, args.seconds)
        codec = per_call_us(with_server_codec, data, args.seconds)
        size = f"{elements * 4} B" if elements < 1024 else f"{elements * 4 >> 20} MiB"
        print(
            f"FP32 {size:>6}: betterproto2 {old:7.1f} us | upb message {whole:7.1f} us | "
            f"upb wire {wire:7.1f} us | ratio {old / wire:5.1f}x | server codec {codec:7.1f} us"
        )


if __name__ == "__main__":
    main()
