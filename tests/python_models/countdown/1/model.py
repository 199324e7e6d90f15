"""An iterative sequence (`sequence_batching { iterative_sequence: true }`): a request asks for
STEPS executions. Each execution but the last releases the request with RESCHEDULE, so that the
server runs it again in a later batch, next in its sequence's slot; the last one releases it for
good. Decoupled, it answers from every execution (LEFT: how many are left); otherwise only from
the last. Each answer tells the request's correlation ID, its START control and how many rows
the execution's batch had. A row that is not READY fills an empty slot of the batch (the direct
batcher's null request): it is answered with nothing and counts nothing."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


def value(request, name):
    return int(pb_utils.get_input_tensor_by_name(request, name).as_numpy().reshape(-1)[0])


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        policy = config.get("model_transaction_policy") or {}
        self.decoupled = bool(policy.get("decoupled"))
        self.batching = config.get("max_batch_size", 0) > 0
        self.left = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            if not value(request, "READY_CONTROL"):
                if self.decoupled:
                    flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
                    request.get_response_sender().send(flags=flags)
                else:
                    responses.append(pb_utils.InferenceResponse([]))
                continue
            key = request.correlation_id()
            if value(request, "START_CONTROL"):
                self.left[key] = value(request, "STEPS")
            self.left[key] -= 1
            left = self.left[key]
            cells = [
                ("LEFT", left, np.int32),
                ("CORRID", value(request, "CORRID_CONTROL"), np.uint64),
                ("START", value(request, "START_CONTROL"), np.int32),
                ("ROWS", len(requests), np.int32),
            ]
            shape = (1, 1) if self.batching else (1,)
            response = pb_utils.InferenceResponse(
                [pb_utils.Tensor(name, np.full(shape, v, dtype=t)) for name, v, t in cells]
            )
            if left > 0:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
            else:
                del self.left[key]
            if self.decoupled:
                sender = request.get_response_sender()
                final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if left <= 0 else 0
                sender.send(response, flags=final)
            else:
                responses.append(None if left > 0 else response)
        return None if self.decoupled else responses
