"""A decoupled model: one response per element of IN, then a bare final flag (with the config
parameter `final_with_last` "true": the final flag comes with the last response). The responses
are sent from a thread after execute() has returned, as decoupled models may."""

import json
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.threads = []
        parameters = json.loads(args["model_config"]).get("parameters", {})
        setting = parameters.get("final_with_last", {}).get("string_value", "")
        self.final_with_last = setting == "true"

    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            sender = request.get_response_sender()
            thread = threading.Thread(target=self.answer, args=(values.copy(), sender))
            thread.start()
            self.threads.append(thread)
        return None

    def answer(self, values, sender):
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        for index, value in enumerate(values):
            out = pb_utils.Tensor("OUT", np.array([value], dtype=np.int32))
            idx = pb_utils.Tensor("IDX", np.array([index], dtype=np.uint32))
            last = self.final_with_last and index == len(values) - 1
            sender.send(
                pb_utils.InferenceResponse(output_tensors=[out, idx]), flags=final if last else 0
            )
        if not (self.final_with_last and len(values)):
            sender.send(flags=final)

    def finalize(self):
        for thread in self.threads:
            thread.join()
