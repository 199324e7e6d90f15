"""Answers each request with the order in which it ran (0, 1, 2...). A request tagged `block`
holds the instance until the file its `gate` parameter names exists (a test's switch), after
writing `<gate>.entered`: the requests that arrive meanwhile queue in the dynamic batcher."""

import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"])["parameters"]
        self.gate = parameters["gate"]["string_value"]
        self.ran = 0

    def execute(self, requests):
        responses = []
        for request in requests:
            tag = pb_utils.get_input_tensor_by_name(request, "TAG").as_numpy().reshape(-1)[0]
            if tag == b"block":
                open(self.gate + ".entered", "w").close()
                while not os.path.exists(self.gate):
                    time.sleep(0.01)
            order = np.array([[self.ran]], dtype=np.int32)
            self.ran += 1
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("ORDER", order)]))
        return responses
