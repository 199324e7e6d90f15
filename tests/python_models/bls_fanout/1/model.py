"""Business logic scripting, many calls at once: each request asks the model named by its
"model" parameter (default "identity") the number of times the config's "calls" parameter
says, every call awaited together (async_exec and asyncio.gather), and answers the sum."""

import asyncio
import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.calls = int(config["parameters"]["calls"]["string_value"])

    async def execute(self, requests):
        responses = []
        for request in requests:
            target = json.loads(request.parameters()).get("model", "identity")
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            calls = [
                pb_utils.InferenceRequest(
                    model_name=target, inputs=[x], requested_output_names=["OUTPUT0"]
                ).async_exec()
                for _ in range(self.calls)
            ]
            answers = await asyncio.gather(*calls)
            failed = next((a for a in answers if a.has_error()), None)
            if failed is not None:
                responses.append(pb_utils.InferenceResponse(error=failed.error()))
                continue
            total = sum(
                pb_utils.get_output_tensor_by_name(answer, "OUTPUT0").as_numpy()
                for answer in answers
            )
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", total)]))
        return responses
