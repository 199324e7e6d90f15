"""Answers with the trace context the server propagated to it (`request.trace().get_context()`,
"" when the request is not traced). With a request parameter `bls_model`, it first calls that
model with its inputs, passing its trace on, so that the call joins the request's trace."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            target = json.loads(request.parameters()).get("bls_model")
            if target:
                call = pb_utils.InferenceRequest(
                    model_name=target,
                    inputs=request.inputs(),
                    requested_output_names=["OUTPUT0"],
                    trace=request.trace(),
                )
                answer = call.exec()
                if answer.has_error():
                    raise pb_utils.TritonModelException(answer.error().message())
            context = request.trace().get_context() or ""
            output = pb_utils.Tensor("CONTEXT", np.array([context.encode()], dtype=object))
            responses.append(pb_utils.InferenceResponse(output_tensors=[output]))
        return responses
