"""Answers with what it was given: initialize's args and the request's accessors (as JSON), and
its input round-tripped through DLPack."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.args = dict(args)

    def execute(self, requests):
        responses = []
        for request in requests:
            seen = {
                "request_id": request.request_id(),
                "correlation_id": request.correlation_id(),
                "flags": request.flags(),
                "timeout": request.timeout(),
                "parameters": json.loads(request.parameters()),
                "parameters_text": request.parameters(),
                "requested_output_names": sorted(request.requested_output_names()),
                "inputs": [tensor.name() for tensor in request.inputs()],
                "model_dir": pb_utils.get_model_dir(),
            }
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            copy = pb_utils.Tensor.from_dlpack("DLPACK", data.to_dlpack())
            outputs = [
                pb_utils.Tensor("ARGS", np.array([json.dumps(self.args).encode()], dtype=object)),
                pb_utils.Tensor("REQUEST", np.array([json.dumps(seen).encode()], dtype=object)),
                copy,
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
