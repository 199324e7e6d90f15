"""Calls the decoupled model `stream_after` through BLS with `decoupled=True` and reports, as
JSON, what each way of reading the responses gave: for each response its OUT values (None for a
response without outputs) or its error message.

The report has `exec` (exec(), a plain for loop), `exec_again` (the same iterator walked a
second time), `async_for` (await async_exec(), then async for) and `async_iter` (await
async_exec(), then a plain for loop), and `not_decoupled`: what exec() without decoupled=True
answers for a decoupled model."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


def describe(responses):
    seen = []
    for response in responses:
        seen.append(describe_one(response))
    return seen


def describe_one(response):
    if response.has_error():
        return {"error": response.error().message()}
    out = pb_utils.get_output_tensor_by_name(response, "OUT")
    return {"out": None if out is None else out.as_numpy().tolist()}


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            mode = pb_utils.get_input_tensor_by_name(request, "MODE")
            count = pb_utils.get_input_tensor_by_name(request, "COUNT")

            def call(mode=mode, count=count):
                return pb_utils.InferenceRequest(
                    model_name="stream_after",
                    inputs=[pb_utils.Tensor("MODE", mode.as_numpy()), count],
                    requested_output_names=["OUT"],
                )

            report = {}
            iterator = call().exec(decoupled=True)
            report["exec"] = describe(iterator)
            report["exec_again"] = describe(iterator)
            walked = []
            async for response in await call().async_exec(decoupled=True):
                walked.append(describe_one(response))
            report["async_for"] = walked
            report["async_iter"] = describe(await call().async_exec(decoupled=True))
            report["not_decoupled"] = describe([call().exec()])
            text = np.array([json.dumps(report).encode()], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("REPORT", text)]))
        return responses
