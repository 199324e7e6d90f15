"""PRODUCT = A * B: the second step of the ensemble tests."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "A").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "B").as_numpy()
            product = pb_utils.Tensor("PRODUCT", (a * b).astype(a.dtype))
            responses.append(pb_utils.InferenceResponse(output_tensors=[product]))
        return responses
