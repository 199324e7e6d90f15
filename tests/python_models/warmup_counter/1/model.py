"""Counts its executes and requests and answers every request with the two counts. Each execute
is also appended, as a JSON line, to `record_<instance>.jsonl` in the model's folder, so that a
test can read what the warmup sent and when. INPUT0[0] = -1 exits the process."""

import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.executes = 0
        self.requests = 0
        name = args["model_instance_name"]
        self.record = os.path.join(args["model_repository"], f"record_{name}.jsonl")

    def execute(self, requests):
        self.executes += 1
        self.requests += len(requests)
        seen = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            if data.flat[0] == -1:
                os._exit(1)
            seen.append(
                {
                    "INPUT0": data.tolist(),
                    "TEXT": [item.decode("utf-8", "replace") for item in text.flat],
                    "TEXT_SHAPE": list(text.shape),
                }
            )
        with open(self.record, "a", encoding="utf-8") as record:
            record.write(json.dumps({"pid": os.getpid(), "requests": seen}) + "\n")
        counts = [np.array([[self.executes]], np.int64), np.array([[self.requests]], np.int64)]
        return [
            pb_utils.InferenceResponse(
                output_tensors=[
                    pb_utils.Tensor("EXECUTES", counts[0]),
                    pb_utils.Tensor("REQUESTS", counts[1]),
                ]
            )
            for _ in requests
        ]
