"""Runs a unittest suite inside the model, as Triton's QA models do (`unittest.main("model",
exit=False)`, which parses sys.argv and imports this file as module `model`), and answers with
sys.argv and whether the suite passed."""

import sys
import unittest

import numpy as np
import triton_python_backend_utils as pb_utils


class InsideTheModel(unittest.TestCase):
    def test_pb_utils_is_there(self):
        self.assertTrue(
            pb_utils.using_decoupled_model_transaction_policy(
                {"model_transaction_policy": {"decoupled": True}}
            )
        )


class TritonPythonModel:
    def execute(self, requests):
        argv = np.array([arg.encode() for arg in sys.argv], dtype=np.object_)
        responses = []
        for _ in requests:
            result = unittest.main("model", exit=False).result
            passed = np.array([result.wasSuccessful() and result.testsRun == 1])
            responses.append(
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("ARGV", argv), pb_utils.Tensor("PASSED", passed)]
                )
            )
        return responses
