"""The scheduler of an ensemble: each request runs its DAG of steps, each step a request through
the router, steps whose inputs are ready running at once."""

from __future__ import annotations

import logging
from typing import Any

import anyio

from tritonactor._proto.inference import ModelConfig
from tritonactor.actors import Actor
from tritonactor.backends.base import InferFunction
from tritonactor.backends.ensemble import EnsemblePlan, EnsembleStep, plan_ensemble
from tritonactor.core.errors import TritonError, cancelled, internal, unavailable
from tritonactor.core.types import InferenceRequest, InferenceResponse, RequestedOutput, Tensor
from tritonactor.scheduling.messages import Infer

log = logging.getLogger(__name__)


class EnsembleScheduler(Actor[Any]):
    """Takes `Infer` messages; each request is a helper task of its own (its steps await other
    models), so requests run concurrently with each other. The actor stopping cancels those
    still running: they fail UNAVAILABLE."""

    mailbox_size = 1024

    def __init__(self, name: str, config: ModelConfig, infer: InferFunction) -> None:
        super().__init__(name)
        self.plan: EnsemblePlan = plan_ensemble(config)
        self._infer = infer

    async def receive(self, message: Any) -> None:
        if isinstance(message, Infer):
            self.start_soon(self._serve, message)
        # InstanceIdle / InstanceGone never come: an ensemble has no instances.

    async def _serve(self, item: Infer) -> None:
        try:
            item.reply.set(await self._run_dag(item.request))
        except TritonError as error:
            item.reply.fail(error)
        except Exception as error:
            log.exception("ensemble '%s' failed a request", self.name)
            item.reply.fail(internal(f"ensemble '{self.name}': {error}"))
        finally:
            if not item.reply.done:  # cancelled: the ensemble is unloading
                item.reply.fail(unavailable(f"ensemble '{self.name}' is unloading"))

    async def _run_dag(self, request: InferenceRequest) -> InferenceResponse:
        tensors: dict[str, Tensor] = {tensor.name: tensor for tensor in request.inputs}
        pending = list(self.plan.steps)
        failure: list[TritonError] = []

        async with anyio.create_task_group() as group:

            def launch() -> None:
                for step in list(pending):
                    if all(tensor in tensors for tensor in step.inputs.values()):
                        pending.remove(step)
                        group.start_soon(run_step, step)

            async def run_step(step: EnsembleStep) -> None:
                if request.cancelled:
                    failure.append(cancelled(f"request for ensemble '{self.name}' was cancelled"))
                    group.cancel_scope.cancel()
                    return
                try:
                    response = await self._infer(self._step_request(request, step, tensors))
                except TritonError as error:
                    failure.append(
                        TritonError(
                            error.code,
                            f"in ensemble '{self.name}', step model "
                            f"'{step.model_name}': {error.message}",
                        )
                    )
                    group.cancel_scope.cancel()
                    return
                for output in response.outputs:
                    target = step.outputs.get(output.name)
                    if target is not None:
                        tensors[target] = Tensor(target, output.datatype, output.shape, output.data)
                launch()

            launch()
        if failure:
            raise failure[0]
        names = request.requested_output_names or list(self.plan.outputs)
        missing = [name for name in names if name not in tensors]
        if missing:
            raise internal(
                f"ensemble '{self.name}' produced no tensor for output(s) {', '.join(missing)}"
            )
        return InferenceResponse(
            self.name,
            str(request.resolved_version),
            request.id,
            [tensors[name] for name in names],
        )

    @staticmethod
    def _step_request(
        request: InferenceRequest, step: EnsembleStep, tensors: dict[str, Tensor]
    ) -> InferenceRequest:
        inputs = []
        for model_input, tensor_name in step.inputs.items():
            tensor = tensors[tensor_name]
            inputs.append(Tensor(model_input, tensor.datatype, tensor.shape, tensor.data))
        return InferenceRequest(
            step.model_name,
            step.model_version,
            request.id,
            inputs=inputs,
            outputs=[RequestedOutput(name) for name in step.outputs],
            parameters=dict(request.parameters),
        )
