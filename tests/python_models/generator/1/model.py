"""A decoupled stand-in for a text generator: `count` responses (1 when absent), the i-th
holding text_input followed by " i", i itself, the ids it was given and the request's parameters
as JSON; then a bare final flag. With the request parameter `fail_after` = n the n+1-th answer
is an error, sent with the final flag."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            self.answer(request, request.get_response_sender())
        return None

    def answer(self, request, sender):
        text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()[0]
        count_tensor = pb_utils.get_input_tensor_by_name(request, "count")
        count = 1 if count_tensor is None else int(count_tensor.as_numpy()[0])
        ids_tensor = pb_utils.get_input_tensor_by_name(request, "ids")
        ids = np.zeros([0], np.int64) if ids_tensor is None else ids_tensor.as_numpy()
        parameters = request.parameters()
        fail_after = json.loads(parameters).get("fail_after")
        for index in range(count):
            if fail_after is not None and index == fail_after:
                error = pb_utils.TritonError(f"generator failed after {index} responses")
                sender.send(
                    pb_utils.InferenceResponse(error=error),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                )
                return
            outputs = [
                pb_utils.Tensor("text_output", np.array([text + b" %d" % index], np.object_)),
                pb_utils.Tensor("index", np.array([index], np.int32)),
                pb_utils.Tensor("ids_seen", ids.astype(np.int64)),
                pb_utils.Tensor("parameters_seen", np.array([parameters.encode()], np.object_)),
            ]
            sender.send(pb_utils.InferenceResponse(output_tensors=outputs))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
