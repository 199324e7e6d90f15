"""Releases each request with RESCHEDULE the first time it sees it (by request id) and answers it
the second time, with how many times it ran. MODE "wrong" also returns a response for the
rescheduled request, which Triton refuses."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.runs = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            mode = pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0].decode()
            value = pb_utils.get_input_tensor_by_name(request, "VALUE").as_numpy()
            runs = self.runs[request.request_id()] = self.runs.get(request.request_id(), 0) + 1
            answer = pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", value), pb_utils.Tensor("RUNS", np.array([runs], np.int32))]
            )
            if runs == 1:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                responses.append(answer if mode == "wrong" else None)
            else:
                responses.append(answer)
        return responses
