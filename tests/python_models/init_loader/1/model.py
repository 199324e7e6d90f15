"""Loads the model its config's `load_at_init` parameter names from `initialize`, as Triton's
README shows BLS model loading, and reports (as JSON, for any request) whether that model was
ready before and after the load, and the error the load gave, if any."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        target = config["parameters"]["load_at_init"]["string_value"]
        self.report = {"ready_before": pb_utils.is_model_ready(target), "error": None}
        try:
            pb_utils.load_model(target)
        except pb_utils.TritonModelException as exc:
            self.report["error"] = str(exc)
        self.report["ready_after"] = pb_utils.is_model_ready(target)

    def execute(self, requests):
        text = np.array([json.dumps(self.report).encode()], dtype=np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("REPORT", text)]) for _ in requests]
