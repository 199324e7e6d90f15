"""A decoupled model (it checks so, as Triton's examples do), answering as MODE says:

- count: COUNT responses (0, 1, ...) during execute, then a bare final flag;
- last: COUNT responses, the last one carrying the final flag;
- park: nothing during execute; COUNT responses and the final flag come when a later
  `release` request arrives (from a thread, after this execute returned);
- release: answers every parked request, then itself with one response and the final flag;
- return: returns responses from execute (refused: a decoupled execute must return None);
- after_final: sends the final flag, then tries one more response (refused inside the model,
  which logs what it was told);
- raise: execute raises;
- gated:<path>: one response during execute; the other COUNT - 1 and the final flag come from a
  thread once the file <path> exists (a test's switch)."""

import json
import os
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def response(value):
    return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([value], np.int32))])


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise pb_utils.TritonModelException("stream_after must be decoupled")
        self.parked = []
        self.lock = threading.Lock()

    def execute(self, requests):
        returned = []
        for request in requests:
            mode = pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0].decode()
            count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()[0])
            sender = request.get_response_sender()
            returned.append(response(count))
            if mode == "count":
                for value in range(count):
                    sender.send(response(value))
                sender.send(flags=FINAL)
            elif mode == "last":
                for value in range(count):
                    sender.send(response(value), flags=FINAL if value == count - 1 else 0)
            elif mode == "park":
                with self.lock:
                    self.parked.append((sender, count))
            elif mode == "release":
                with self.lock:
                    parked, self.parked = self.parked, []
                threading.Thread(target=self.answer, args=(parked,)).start()
                sender.send(response(count), flags=FINAL)
            elif mode == "after_final":
                sender.send(flags=FINAL)
                try:
                    sender.send(response(count))
                except pb_utils.TritonModelException as exc:
                    pb_utils.Logger.log_info(f"stream_after was told: {exc}")
            elif mode == "raise":
                raise ValueError("stream_after was asked to raise")
            elif mode.startswith("gated:"):
                sender.send(response(0))
                gate = mode.removeprefix("gated:")
                threading.Thread(target=self.gated, args=(sender, count, gate)).start()
        return returned if mode == "return" else None

    def answer(self, parked):
        for sender, count in parked:
            for value in range(count):
                sender.send(response(value))
            sender.send(flags=FINAL)

    def gated(self, sender, count, gate):
        while not os.path.exists(gate):
            time.sleep(0.01)
        for value in range(1, count):
            sender.send(response(value))
        sender.send(flags=FINAL)
