"""A decoupled model: COUNT responses, the i-th holding SCORES rotated right by i, then a bare
final flag."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            scores = pb_utils.get_input_tensor_by_name(request, "SCORES").as_numpy()
            count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()[0])
            sender = request.get_response_sender()
            for index in range(count):
                probs = pb_utils.Tensor("PROBS", np.roll(scores, index).astype(np.float32))
                sender.send(pb_utils.InferenceResponse(output_tensors=[probs]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
