"""A stateful model that reports how the sequence batcher batched it: for each request, the
running sum of INPUT over its sequence (kept per CORRID, reset by START), its row in the batch
(SLOT), and the READY and CORRID controls of every row of the batch. Null rows (READY 0) touch
no sequence. Each execute takes a moment, so that requests arriving meanwhile form a batch."""

import time

import numpy as np
import triton_python_backend_utils as pb_utils

EXECUTE_SECONDS = 0.05


def control(request, name):
    return pb_utils.get_input_tensor_by_name(request, name).as_numpy().reshape(-1)[0]


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        time.sleep(EXECUTE_SECONDS)
        ready = np.array([[control(r, "READY") for r in requests]], dtype=np.int32)
        corrids = np.array([[control(r, "CORRID") for r in requests]], dtype=np.uint64)
        responses = []
        for slot, request in enumerate(requests):
            total = 0
            if control(request, "READY"):
                key = int(control(request, "CORRID"))
                if control(request, "START"):
                    self.sums[key] = 0
                value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
                total = self.sums[key] = self.sums[key] + int(value.reshape(-1)[0])
            outputs = [
                pb_utils.Tensor("OUTPUT", np.array([[total]], dtype=np.int32)),
                pb_utils.Tensor("SLOT", np.array([[slot]], dtype=np.int32)),
                pb_utils.Tensor("READY_ROWS", ready),
                pb_utils.Tensor("CORRID_ROWS", corrids),
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
