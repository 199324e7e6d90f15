"""Calls `introspect` through BLS with the keyword arguments its request parameter "call"
gives (JSON: `parameters`, `timeout`, `correlation_id`, `flags`), and answers with what
`introspect` saw of that call (its REQUEST output)."""

import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            call = json.loads(json.loads(request.parameters())["call"])
            answer = pb_utils.InferenceRequest(
                model_name="introspect",
                inputs=[pb_utils.get_input_tensor_by_name(request, "INPUT0")],
                requested_output_names=["REQUEST"],
                **call,
            ).exec()
            if answer.has_error():
                responses.append(pb_utils.InferenceResponse(error=answer.error()))
                continue
            seen = pb_utils.get_output_tensor_by_name(answer, "REQUEST")
            responses.append(pb_utils.InferenceResponse(output_tensors=[seen]))
        return responses
