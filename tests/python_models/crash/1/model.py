"""Answers with its process id; INPUT0 = 1 exits the process, 2 kills it with SIGKILL. PAD
(8 KiB of zeros) makes the answer too big to travel inside the message: it goes through the
instance's results arena."""

import os
import signal

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()[0]
            if value == 1:
                os._exit(1)
            if value == 2:
                os.kill(os.getpid(), signal.SIGKILL)
            pid = pb_utils.Tensor("PID", np.array([os.getpid()], dtype=np.int64))
            pad = pb_utils.Tensor("PAD", np.zeros(2048, dtype=np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[pid, pad]))
        return responses
