"""Works until its request is cancelled (or for `limit_s` seconds, 10 by default).

Decoupled (as configured): a thread sends a response every INTERVAL_MS milliseconds, INDEX
counting them, until `is_cancelled()` — the response sender's, or the request's when the request
parameter "check" is "request" — says True; then the final response carries INDEX = how many
were sent and CANCELLED. Not decoupled: execute() polls the request until it is cancelled and
answers INDEX = polls and CANCELLED. Either way, a request parameter "marker" names a file written
once the loop ends, holding "cancelled" or "timeout"; not decoupled, "polling" names a file
made once it has polled once."""

import json
import os
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def answer(index, cancelled):
    return pb_utils.InferenceResponse(
        output_tensors=[
            pb_utils.Tensor("INDEX", np.array([index], dtype=np.uint32)),
            pb_utils.Tensor("CANCELLED", np.array([cancelled], dtype=np.bool_)),
        ]
    )


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.decoupled = bool(config.get("model_transaction_policy", {}).get("decoupled"))
        self.threads = []

    def execute(self, requests):
        if not self.decoupled:
            return [self.poll(request) for request in requests]
        for request in requests:
            thread = threading.Thread(target=self.stream, args=(request,))
            thread.start()
            self.threads.append(thread)
        return None

    def settings(self, request):
        parameters = json.loads(request.parameters())
        interval = pb_utils.get_input_tensor_by_name(request, "INTERVAL_MS").as_numpy()
        deadline = time.monotonic() + float(parameters.get("limit_s", 10))
        return parameters, int(interval.reshape(-1)[0]) / 1000, deadline

    def poll(self, request):
        parameters, interval, deadline = self.settings(request)
        polls = 0
        while not request.is_cancelled() and time.monotonic() < deadline:
            polls += 1
            if polls == 1 and parameters.get("polling"):  # a file saying it polls now
                open(parameters["polling"], "w").close()
            time.sleep(interval)
        cancelled = request.is_cancelled()
        mark(parameters, cancelled)
        return answer(polls, cancelled)

    def stream(self, request):
        parameters, interval, deadline = self.settings(request)
        sender = request.get_response_sender()
        by_request = parameters.get("check") == "request"
        check = request.is_cancelled if by_request else sender.is_cancelled
        sent = 0
        while not check() and time.monotonic() < deadline:
            sender.send(answer(sent, False))
            sent += 1
            time.sleep(interval)
        cancelled = check()
        mark(parameters, cancelled)
        sender.send(answer(sent, cancelled), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self):
        for thread in self.threads:
            thread.join()


def mark(parameters, cancelled):
    marker = parameters.get("marker")
    if marker:
        with open(marker + ".tmp", "w") as file:
            file.write("cancelled" if cancelled else "timeout")
        os.replace(marker + ".tmp", marker)
