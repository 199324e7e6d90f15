"""Echoes a BYTES tensor, checking on the way that it holds bytes objects."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            assert data.dtype == np.object_, data.dtype
            assert all(isinstance(item, bytes) for item in data.reshape(-1))
            responses.append(
                pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", data)])
            )
        return responses
