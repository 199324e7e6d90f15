"""Fails each request with the pb_utils.TritonError code its CODE input names (UNKNOWN...)."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            name = pb_utils.get_input_tensor_by_name(request, "CODE").as_numpy()[0].decode()
            error = pb_utils.TritonError(f"failed with {name}", getattr(pb_utils.TritonError, name))
            responses.append(pb_utils.InferenceResponse(error=error))
        return responses
