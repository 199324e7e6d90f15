"""One request of an ensemble, from its inputs to its responses.

Only the steps that lead to the requested outputs run (`needed_steps`). A step starts once
every tensor it reads is *resolved*: produced, or known to be absent — an optional ensemble
input the request left out, or a step output its model did not return. It runs with the tensors
that are present (its model's validation refuses it if a required one is absent); a step whose
tensors are all absent, each feeding an optional input of its model, has nothing to run on and
is skipped, its outputs absent too. The response carries the requested outputs that are present.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import anyio
from anyio.abc import TaskGroup, TaskStatus

from tritonactor.backends.ensemble import (
    EnsembleFlow,
    EnsemblePlan,
    EnsembleStep,
    batch_reshaped,
    plan_flow,
)
from tritonactor.core.errors import TritonError, cancelled
from tritonactor.core.types import (
    InferenceRequest,
    InferenceResponse,
    Parameters,
    RequestedOutput,
    Tensor,
)
from tritonactor.scheduling.ensemble_stream import ResponseStream
from tritonactor.scheduling.router import ModelHandle, Router
from tritonactor.scheduling.step_times import STEP_TIMES, StepTimes

# How many steps one after the other a task runs itself before the next starts a task of its
# own (`EnsembleRun._start_ready`): each nests a few frames, and a chain may be long.
INLINE_DEPTH = 16

# Absent: resolved, but not there (an optional input left out, an output not produced).
Resolved = Tensor | None


@dataclass(frozen=True, slots=True)
class Routes:
    """The flow of the ensemble for one set of step model versions (`handles`, by step)."""

    handles: tuple[ModelHandle, ...]
    flow: EnsembleFlow
    steps_of_stream: dict[int, tuple[EnsembleStep, ...]]
    # By step: the inputs its model declares optional.
    optional: tuple[frozenset[str], ...]
    # By step: whether its model batches, and its inputs' dims (`batch_reshaped`).
    batching: tuple[bool, ...]
    input_dims: tuple[dict[str, tuple[int, ...]], ...]


def routes_for(plan: EnsemblePlan, handles: tuple[ModelHandle, ...]) -> Routes:
    flow = plan_flow(plan, [handle.decoupled for handle in handles])
    steps_of_stream: dict[int, list[EnsembleStep]] = {}
    for step in plan.steps:
        steps_of_stream.setdefault(flow.stream_of[step.index], []).append(step)
    optional = tuple(
        frozenset(tensor.name for tensor in handle.config.input if tensor.optional)
        for handle in handles
    )
    return Routes(
        handles,
        flow,
        {k: tuple(v) for k, v in steps_of_stream.items()},
        optional,
        tuple(handle.config.max_batch_size > 0 for handle in handles),
        tuple(
            {tensor.name: tuple(tensor.dims) for tensor in handle.config.input}
            for handle in handles
        ),
    )


def in_step(ensemble: str, error: TritonError) -> TritonError:
    # Triton's words: the step's message names its model where it says which one.
    return TritonError(error.code, f"in ensemble '{ensemble}', {error.message}")


def sequence_parameters(request: InferenceRequest) -> Parameters:
    """What Triton puts in every response of an ensemble (and of no other model): the request's
    correlation ID (0 without one) and sequence flags."""
    parameters = request.parameters
    return {
        "sequence_id": parameters.get("sequence_id", 0),
        "sequence_start": parameters.get("sequence_start") is True,
        "sequence_end": parameters.get("sequence_end") is True,
    }


@dataclass(eq=False, slots=True)
class Branch:
    """One item of a stream (see `EnsembleFlow`): the request itself, or one response of a
    decoupled step, with the tensors resolved from it so far."""

    stream: int
    tensors: dict[str, Resolved]
    # The batch each tensor was made in (0: by a side that does not batch), as Triton keeps it
    # to reshape the tensor where it goes (`batch_reshaped`).
    batch: dict[str, int]
    started: set[int] = field(default_factory=set)
    answered: bool = False


class EnsembleRun:
    """One request of the ensemble: `execute` runs its steps; then `response` holds its answer
    when its outputs are in stream 0 (else its responses went out through its sender)."""

    def __init__(
        self,
        plan: EnsemblePlan,
        router: Router,
        slots: tuple[anyio.Semaphore | None, ...],
        request: InferenceRequest,
        routes: Routes,
        needed: frozenset[int],
    ) -> None:
        self.name = plan.name
        self.router = router
        self.slots = slots
        self.request = request
        self.routes = routes
        self.needed = needed
        self.output_names = request.requested_output_names or list(plan.outputs)
        # How many responses of a decoupled step may wait before its model is held up.
        self.backlog = plan.max_inflight_requests
        given: dict[str, Resolved] = {tensor.name: tensor for tensor in request.inputs}
        # The request's batch (0 where the ensemble does not batch): its signature checked
        # that every input has it.
        batch = request.inputs[0].shape[0] if plan.max_batch_size and request.inputs else 0
        self.batching = plan.max_batch_size > 0
        self.output_dims = plan.output_dims
        self.root = Branch(
            0, {name: given.get(name) for name in plan.inputs}, dict.fromkeys(plan.inputs, batch)
        )
        self.response: InferenceResponse | None = None  # when the outputs are in stream 0
        # The compute times of the steps that succeeded, summed: the ensemble's own, as Triton
        # counts them (statistics.py adds each step's).
        self.step_times = StepTimes()
        self._failure: TritonError | None = None
        self._group: TaskGroup | None = None
        # Steps started and not yet done (a decoupled one is done with its final response): a
        # streamed answer made when none is left is the last, and carries the final flag, as
        # Triton's does.
        self._running = 0

    async def execute(self) -> None:
        async with anyio.create_task_group() as group:
            self._group = group
            await self._start_ready(self.root)
        if self._failure is not None:
            raise self._failure

    def _fail(self, error: TritonError) -> None:
        if self._failure is None:
            self._failure = error
        assert self._group is not None
        self._group.cancel_scope.cancel()

    async def _start_ready(self, branch: Branch, run_here: bool = True, depth: int = 0) -> None:
        """Start the needed steps of the branch whose tensors are all resolved; answer once its
        outputs are. With `max_inflight_requests`, waits for a step to have room: that holds up
        whatever produced the branch (back-pressure).

        With `run_here`, a step that is the only one this call starts (and has no slot limit)
        runs in this task: a chain of steps runs in the request's task and spawns none, up to
        `INLINE_DEPTH` steps deep (`depth`: the steps run so in this task), beyond which a task
        of its own starts afresh. Steps that start together each get a task, started in the
        config's order, so they reach their models in that order. A decoupled step's loop over
        its responses passes False: it must go on reading while the steps it opened run."""
        assert self._group is not None
        steps = self.routes.steps_of_stream.get(branch.stream, ())
        here: EnsembleStep | None = None
        starting = 0  # the steps this call starts
        run_here = run_here and depth < INLINE_DEPTH
        progress = True
        while progress:  # a skipped step resolves its outputs at once: look again
            progress = False
            for step in steps:
                if step.index in branch.started or step.index not in self.needed:
                    continue
                if not all(tensor in branch.tensors for tensor in step.inputs.values()):
                    continue
                if self.request.cancelled:
                    self._fail(cancelled(f"request for ensemble '{self.name}' was cancelled"))
                    return
                branch.started.add(step.index)
                if self._nothing_to_run(step, branch):
                    if not self.routes.flow.decoupled[step.index]:  # else: no branch opens
                        branch.tensors.update(dict.fromkeys(step.outputs.values()))
                        progress = True
                    continue
                slot = self.slots[step.index]
                starting += 1
                self._running += 1
                if slot is None and run_here and starting == 1:
                    here = step  # run here, unless another step starts too
                    continue
                if here is not None:  # not the only one: it starts first, in a task of its own
                    self._group.start_soon(self._run_step, here, branch, None)
                    here = None
                if slot is None:
                    self._group.start_soon(self._run_step, step, branch, None)
                else:
                    await self._group.start(self._run_step, step, branch, slot)
        self._answer(branch)  # (as soon as its outputs are: before a step run here)
        if here is not None:
            await self._run_step(here, branch, None, depth=depth + 1)

    def _nothing_to_run(self, step: EnsembleStep, branch: Branch) -> bool:
        """Every tensor the step reads is absent, each for an optional input of its model: it
        has nothing to run on. (With a required input among them the step runs, and its model's
        validation refuses it with the reason, as in Triton.)"""
        optional = self.routes.optional[step.index]
        return bool(step.inputs) and all(
            branch.tensors[tensor] is None and model_input in optional
            for model_input, tensor in step.inputs.items()
        )

    def _answer(self, branch: Branch) -> None:
        if branch.answered or branch.stream != self.routes.flow.output_stream:
            return
        tensors = branch.tensors
        if not all(name in tensors for name in self.output_names):
            return
        branch.answered = True
        request = self.request
        # A requested output that no step produced is left out, as Triton does.
        outputs = [
            self._reshaped(tensor, self.output_dims[name], self.batching, branch.batch[name])
            for name in self.output_names
            if (tensor := tensors[name]) is not None
        ]
        response = InferenceResponse(
            self.name,
            str(request.resolved_version),
            request.id,
            outputs,
            sequence_parameters(request),
        )
        if branch.stream == 0:
            self.response = response
        else:
            assert request.sender is not None
            request.sender.send(response, final=self._running == 0)

    async def _run_step(
        self,
        step: EnsembleStep,
        branch: Branch,
        slot: anyio.Semaphore | None,
        *,
        depth: int = 0,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        if self._failure is not None:  # started before another step failed: nothing to run
            task_status.started()
            return
        try:
            if self.routes.flow.decoupled[step.index]:
                async with _holding(slot, task_status):
                    await self._stream_step(step, branch)
                return
            request, batch = self._step_request(step, branch)
            if slot is None:  # (no slot to hold: spares the context manager, a step's most)
                task_status.started()
                response = await self.router.infer(request)
            else:
                async with _holding(slot, task_status):
                    response = await self.router.infer(request)
            branch.tensors.update(_mapped(step, response))
            branch.batch.update(dict.fromkeys(step.outputs.values(), batch))
            self._running -= 1
            await self._start_ready(branch, depth=depth)
        except TritonError as error:
            self._fail(in_step(self.name, error))

    async def _stream_step(self, step: EnsembleStep, branch: Branch) -> None:
        """A decoupled step: each of its responses is a new branch of the stream it opens."""
        stream = ResponseStream(self.backlog, self.request)
        request, batch = self._step_request(step, branch)
        batches = dict.fromkeys(step.outputs.values(), batch)
        request.sender = stream.sender
        running = True
        try:
            reply = self.router.submit(request)
            reply.add_done_callback(stream.execute_over)
            self.step_times.running(reply)  # its execute may outlast its last response
            async with contextlib.aclosing(stream.responses()) as responses:
                async for response in responses:
                    if self._failure is not None:  # another step failed: the run is over
                        return
                    if self.request.cancelled:
                        self._fail(cancelled(f"request for ensemble '{self.name}' was cancelled"))
                        return
                    if stream.ended:  # its final response: the step is done
                        running = False
                        self._running -= 1
                    opened = Branch(
                        self.routes.flow.opens[step.index], _mapped(step, response), dict(batches)
                    )
                    await self._start_ready(opened, run_here=False)
        finally:
            if running:
                self._running -= 1
            stream.close()
            if not stream.sender.finished:
                request.cancel()  # the ensemble gave up on it: the model may stop early

    def _step_request(self, step: EnsembleStep, branch: Branch) -> tuple[InferenceRequest, int]:
        """The step's request, and the batch its outputs will be made in (0: its model does
        not batch)."""
        inputs = []
        batching = self.routes.batching[step.index]
        dims = self.routes.input_dims[step.index]
        for model_input, tensor_name in step.inputs.items():
            tensor = branch.tensors[tensor_name]
            if tensor is not None:
                inputs.append(
                    self._reshaped(
                        tensor, dims[model_input], batching, branch.batch[tensor_name], model_input
                    )
                )
        batch = inputs[0].shape[0] if batching and inputs and inputs[0].shape else 0
        request = InferenceRequest(
            step.model_name,
            step.model_version,
            self.request.id,
            inputs=inputs,
            # Every mapped output, as Triton asks for them, whichever the client wants.
            outputs=[RequestedOutput(name) for name in step.outputs],
            parameters=dict(self.request.parameters),
            headers=self.request.headers,
            # Each step's spans nest under the ensemble's request; a child of its own, so that
            # steps running side by side keep their own queue times.
            trace=None if self.request.trace is None else self.request.trace.child(),
        )
        request.context[STEP_TIMES] = self.step_times
        return request, batch

    @staticmethod
    def _reshaped(
        tensor: Tensor, dims: tuple[int, ...], batching: bool, batch: int, name: str | None = None
    ) -> Tensor:
        """`tensor` as it goes to a side with `dims` and `batching` (`batch_reshaped`),
        renamed `name` if given."""
        shape = tensor.shape
        if batching != (batch != 0):  # (else nothing to convert: the common case)
            shape = batch_reshaped(dims, batching, batch, shape)
        if shape == tensor.shape:
            if name is None:
                return tensor
            return Tensor(name, tensor.datatype, shape, tensor.data)
        return Tensor(name or tensor.name, tensor.datatype, shape, tensor.data.reshape(shape))


def _mapped(step: EnsembleStep, response: InferenceResponse) -> dict[str, Resolved]:
    """The step's mapped outputs as ensemble tensors; those its model did not return are
    absent."""
    tensors: dict[str, Resolved] = dict.fromkeys(step.outputs.values())
    for output in response.outputs:
        target = step.outputs.get(output.name)
        if target is not None:
            tensors[target] = Tensor(target, output.datatype, output.shape, output.data)
    return tensors


@contextlib.asynccontextmanager
async def _holding(
    slot: anyio.Semaphore | None, task_status: TaskStatus[None]
) -> AsyncIterator[None]:
    """Hold one of a step's slots (if it is limited) while its request is in flight; the
    caller learns that the step started once it has one."""
    if slot is None:
        task_status.started()
        yield
        return
    async with slot:
        task_status.started()
        yield
