"""An accumulator with implicit state: the server keeps the running sum between the requests of
a sequence. OUTPUT_STATE = INPUT_STATE + INPUT, and OUTPUT repeats it; the model itself
remembers nothing."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            state = pb_utils.get_input_tensor_by_name(request, "INPUT_STATE").as_numpy()
            total = (state + value).astype(np.int32)
            outputs = [pb_utils.Tensor("OUTPUT", total), pb_utils.Tensor("OUTPUT_STATE", total)]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
