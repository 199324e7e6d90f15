"""INPUT0 = 0: execute raises (-1: without a message); 1: the response carries an INVALID_ARG
error; 2: execute returns its responses in a tuple (refused); else an echo."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        in_a_tuple = False
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            in_a_tuple = in_a_tuple or value[0] == 2
            if value[0] == 0:
                raise ValueError("the model was asked to fail")
            if value[0] == -1:
                raise ValueError()
            if value[0] == 1:
                error = pb_utils.TritonError("one is not allowed", pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
            else:
                responses.append(
                    pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", value)])
                )
        return tuple(responses) if in_a_tuple else responses
