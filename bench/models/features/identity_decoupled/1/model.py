import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for req in requests:
            x = pb_utils.get_input_tensor_by_name(req, "INPUT0").as_numpy()
            sender = req.get_response_sender()
            sender.send(
                pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )
        return None
