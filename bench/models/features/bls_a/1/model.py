import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for req in requests:
            x = pb_utils.get_input_tensor_by_name(req, "INPUT0")
            call = pb_utils.InferenceRequest(
                model_name="identity_a", requested_output_names=["OUTPUT0"], inputs=[x]
            )
            answer = call.exec()
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            y = pb_utils.get_output_tensor_by_name(answer, "OUTPUT0")
            out.append(pb_utils.InferenceResponse([y]))
        return out
