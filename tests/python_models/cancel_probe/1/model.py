"""Answers once its request is cancelled (or after `limit_s` seconds, 30 by default), so a test
can tell whether a client that left cancelled it. Request parameters: "started", a file written
when execute() begins; "marker", a file written when it ends, holding "cancelled" or "timeout".
The answer: CANCELLED = whether the request was cancelled."""

import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def write(path, text):
    if path:
        with open(path + ".tmp", "w") as file:
            file.write(text)
        os.replace(path + ".tmp", path)


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            parameters = json.loads(request.parameters())
            write(parameters.get("started"), "started")
            deadline = time.monotonic() + float(parameters.get("limit_s", 30))
            while not request.is_cancelled() and time.monotonic() < deadline:
                time.sleep(0.01)
            cancelled = request.is_cancelled()
            write(parameters.get("marker"), "cancelled" if cancelled else "timeout")
            tensor = pb_utils.Tensor("CANCELLED", np.array([cancelled], dtype=np.bool_))
            responses.append(pb_utils.InferenceResponse(output_tensors=[tensor]))
        return responses
