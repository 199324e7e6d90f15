"""Starts a child process in initialize and answers [its own pid, the child's]; finalize
terminates the child (SIGTERM), as a model that runs a helper process does."""

import os
import subprocess

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.child = subprocess.Popen(["sleep", "1000"])

    def execute(self, requests):
        pids = np.array([os.getpid(), self.child.pid], dtype=np.int64)
        return [
            pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("PID", pids)])
            for _ in requests
        ]

    def finalize(self):
        self.child.terminate()
        self.child.wait()
