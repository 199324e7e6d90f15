"""A decoupled `async def execute` that can only finish if two executes run at once: the
request with ROLE "a" waits until one with ROLE "b" has started, and the other way round. Run
one after the other, the first would wait in vain (and answer False after a generous timeout)."""

import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils

PATIENCE_S = 60


class TritonPythonModel:
    def initialize(self, args):
        self.started = {}

    def event(self, role):
        if role not in self.started:
            self.started[role] = asyncio.Event()
        return self.started[role]

    async def execute(self, requests):
        for request in requests:
            role = pb_utils.get_input_tensor_by_name(request, "ROLE").as_numpy()[0].decode()
            self.event(role).set()
            partner = "b" if role == "a" else "a"
            try:
                await asyncio.wait_for(self.event(partner).wait(), PATIENCE_S)
                seen = True
            except TimeoutError:
                seen = False
            out = pb_utils.Tensor("PARTNER_SEEN", np.array([seen]))
            request.get_response_sender().send(
                pb_utils.InferenceResponse([out]),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )
        return None
