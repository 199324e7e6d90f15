"""A decoupled iterative model: each execute of a request sends one response (how many are left)
and releases the request with RESCHEDULE until none are; the last one is final."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.left = {}

    def execute(self, requests):
        for request in requests:
            key = request.request_id()
            if key not in self.left:
                count = pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()
                self.left[key] = int(count[0])
            self.left[key] -= 1
            left = self.left[key]
            out = pb_utils.InferenceResponse([pb_utils.Tensor("LEFT", np.array([left], np.int32))])
            sender = request.get_response_sender()
            if left > 0:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                sender.send(out)
            else:
                del self.left[key]
                sender.send(out, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
