"""Loads, unloads and asks about other models from inside a model (Triton's BLS model loading),
as ACTION says, on the model TARGET: load, load_config (load with a config JSON that gives the
model a parameter), unload, or ready. Reports, as JSON, whether TARGET is ready afterwards and
the error the server gave, if any."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            action = pb_utils.get_input_tensor_by_name(request, "ACTION").as_numpy()[0].decode()
            target = pb_utils.get_input_tensor_by_name(request, "TARGET").as_numpy()[0].decode()
            report = {"error": None}
            try:
                if action == "load":
                    pb_utils.load_model(model_name=target)
                elif action == "load_config":
                    given = {"loaded_by": {"string_value": "bls"}}
                    config = {"backend": "python", "parameters": given}
                    pb_utils.load_model(target, config=json.dumps(config))
                elif action == "unload":
                    pb_utils.unload_model(target)
            except pb_utils.TritonModelException as exc:
                report["error"] = str(exc)
            report["ready"] = pb_utils.is_model_ready(target)
            text = np.array([json.dumps(report).encode()], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("REPORT", text)]))
        return responses
