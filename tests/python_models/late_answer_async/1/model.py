"""`late_answer`'s park/release, with `async def execute`: a parked request is answered by a task
on the model's event loop, which must keep running after the execute that created it returned."""

import asyncio

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.release = None
        self.tasks = set()

    async def execute(self, requests):
        if self.release is None:
            self.release = asyncio.Event()
        responses = []
        for request in requests:
            mode = pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0].decode()
            value = pb_utils.get_input_tensor_by_name(request, "VALUE").as_numpy()
            answer = pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value)])
            if mode == "park":
                task = asyncio.create_task(self.answer_later(request.get_response_sender(), answer))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
                responses.append(None)
            else:  # release
                self.release.set()
                responses.append(answer)
        return responses

    async def answer_later(self, sender, answer):
        await self.release.wait()
        sender.send(answer, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
