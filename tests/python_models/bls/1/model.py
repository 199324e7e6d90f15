"""Business logic scripting: asks another model (by default `onnx_add_sub`, or the request
parameter "model") for the sum with a blocking exec() and for the difference with async_exec()."""

import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            target = json.loads(request.parameters()).get("model", "onnx_add_sub")
            inputs = [
                pb_utils.get_input_tensor_by_name(request, "INPUT0"),
                pb_utils.get_input_tensor_by_name(request, "INPUT1"),
            ]
            first = pb_utils.InferenceRequest(
                model_name=target, inputs=inputs, requested_output_names=["OUTPUT0"]
            ).exec()
            if first.has_error():
                responses.append(pb_utils.InferenceResponse(error=first.error()))
                continue
            second = await pb_utils.InferenceRequest(
                model_name=target, inputs=inputs, requested_output_names=["OUTPUT1"]
            ).async_exec()
            if second.has_error():
                responses.append(pb_utils.InferenceResponse(error=second.error()))
                continue
            outputs = [
                pb_utils.get_output_tensor_by_name(first, "OUTPUT0"),
                pb_utils.get_output_tensor_by_name(second, "OUTPUT1"),
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
