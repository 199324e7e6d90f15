"""A decoupled model that answers nothing while it serves: it keeps every request's response
sender, and answers them all (IN echoed, then the final flag) in `finalize`, when it is
unloaded. Those answers must reach their clients."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.parked = []

    def execute(self, requests):
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            self.parked.append((request.get_response_sender(), value))
        return None

    def finalize(self):
        for sender, value in self.parked:
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value)]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
