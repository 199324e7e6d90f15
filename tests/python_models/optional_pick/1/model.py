"""Two optional inputs: OUTPUTi is INPUTi for each input the request has, and is left out of the
response when INPUTi is absent. Batched requests always share one set of inputs (the server
batches only requests of the same inputs and shapes), so the batch is answered row by row."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            outputs = []
            for index in ("0", "1"):
                tensor = pb_utils.get_input_tensor_by_name(request, "INPUT" + index)
                if tensor is not None:
                    outputs.append(pb_utils.Tensor("OUTPUT" + index, tensor.as_numpy()))
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
