"""A model that is not decoupled but may answer through its response sender, as MODE says:

- return: the usual way, execute returns the response;
- before: sends the response (and the final flag) during execute, returns None;
- park: keeps the sender and returns None; the answer comes when a later `release` request
  arrives (so, from a thread of the model, after this execute returned);
- release: answers every parked request (from a thread), and itself the usual way;
- twice: sends a response, then a second one (refused: execute fails after the first went);
- send_and_return: sends a response, and returns one too (refused: the same);
- final_first: sends the final flag before any response (refused);
- drop: returns None and keeps nothing (the request can never be answered)."""

import threading

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.parked = []
        self.lock = threading.Lock()

    def execute(self, requests):
        responses = []
        for request in requests:
            mode = pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0].decode()
            value = pb_utils.get_input_tensor_by_name(request, "VALUE").as_numpy()
            answer = pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value)])
            if mode == "return":
                responses.append(answer)
                continue
            responses.append(None)
            sender = request.get_response_sender()
            if mode == "before":
                sender.send(answer, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            elif mode == "park":
                with self.lock:
                    self.parked.append((sender, answer))
            elif mode == "release":
                with self.lock:
                    parked, self.parked = self.parked, []
                threading.Thread(target=self.answer, args=(parked,)).start()
                responses[-1] = answer
            elif mode == "twice":
                sender.send(answer)
                sender.send(answer)
            elif mode == "send_and_return":
                sender.send(answer)
                responses[-1] = answer
            elif mode == "final_first":
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return responses

    def answer(self, parked):
        for sender, answer in parked:
            sender.send(answer)
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
