"""Reshapes, as Triton applies them for every backend: INPUT0 (dims [3]) reaches the model in
its reshape [1, 3]; ECHO is made in its reshape [1, 3] and the client gets its dims [3]; SEEN,
with no reshape, shows the client the shape the model saw."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if data.shape[1:] != (1, 3):
                raise pb_utils.TritonModelException(f"the model got shape {list(data.shape)}")
            responses.append(
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("ECHO", data + 1), pb_utils.Tensor("SEEN", data)]
                )
            )
        return responses
