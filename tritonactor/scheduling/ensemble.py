"""The scheduler of an ensemble: each request runs its DAG of steps, each step a request through
the router, steps whose inputs are ready running at once. The steps after a decoupled step run
once per response of it, and the ensemble then answers with a stream of responses."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import sniffio
from anyio.abc import TaskGroup, TaskStatus

from tritonactor._proto.inference import ModelConfig, ModelTransactionPolicy
from tritonactor.actors import Actor, Reply
from tritonactor.backends.base import InferFunction
from tritonactor.backends.ensemble import (
    EnsembleFlow,
    EnsemblePlan,
    EnsembleStep,
    check_steps,
    plan_ensemble,
    plan_flow,
)
from tritonactor.core.errors import (
    TritonError,
    cancelled,
    internal,
    invalid_arg,
    unavailable,
    unsupported,
)
from tritonactor.core.types import (
    InferenceRequest,
    InferenceResponse,
    RequestedOutput,
    ResponseSender,
    Tensor,
)
from tritonactor.scheduling.messages import Infer
from tritonactor.scheduling.router import ModelHandle, Router

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Routes:
    """The flow of the ensemble for one set of step model versions (`handles`, by step)."""

    handles: tuple[ModelHandle, ...]
    flow: EnsembleFlow
    steps_of_stream: dict[int, tuple[EnsembleStep, ...]]


class EnsembleScheduler(Actor[Any]):
    """Takes `Infer` messages; each request is a helper task of its own (its steps await other
    models), so requests run concurrently with each other. The actor stopping cancels those
    still running: they fail UNAVAILABLE.

    At load it fails when a step names a model that no repository holds, and checks the steps
    against those of their models that are already loaded (all of them when the manager loads
    an ensemble after its steps). The rest is checked by the first request that finds them
    loaded, and again whenever a step model is replaced."""

    mailbox_size = 1024

    def __init__(self, name: str, config: ModelConfig, router: Router | InferFunction) -> None:
        super().__init__(name)
        self.plan: EnsemblePlan = plan_ensemble(config)
        self._config = config
        self._router = _router_of(name, router)
        limit = self.plan.max_inflight_requests
        self._slots: tuple[anyio.Semaphore | None, ...] = tuple(
            anyio.Semaphore(limit) if limit else None for _ in self.plan.steps
        )
        self._routes: _Routes | None = None
        self._check_at_load()

    def _check_at_load(self) -> None:
        absent = [model for model in self.plan.models if model not in self._router.known]
        if absent:
            names = ", ".join(f"'{model}'" for model in absent)
            which = f"step model {names} is" if len(absent) == 1 else f"step models {names} are"
            raise invalid_arg(f"ensemble '{self.name}': {which} not in any model repository")
        ready: dict[int, ModelHandle] = {}
        for step in self.plan.steps:
            with contextlib.suppress(TritonError):  # not loaded yet: checked when it is
                ready[step.index] = self._router.resolve(step.model_name, step.model_version)
        check_steps(self._config, self.plan, {i: h.config for i, h in ready.items()})
        if len(ready) == len(self.plan.steps):
            routes = self._routes = _routes_for(self.plan, tuple(ready[i] for i in sorted(ready)))
            # Triton's rule: an ensemble with a decoupled step is decoupled. Set on the config
            # the ensemble is served with, so that the front ends stream its responses.
            decoupled = routes.flow.streams_responses
            policy = self._config.model_transaction_policy
            if (policy is not None and policy.decoupled) != decoupled:
                self._config.model_transaction_policy = ModelTransactionPolicy(decoupled=decoupled)

    async def receive(self, message: Any) -> None:
        if isinstance(message, Infer):
            self.start_soon(self._serve, message)
        # InstanceIdle / InstanceGone never come: an ensemble has no instances.

    async def _serve(self, item: Infer) -> None:
        request = item.request
        try:
            routes = await self._current_routes()
            if routes.flow.output_stream and request.sender is None:
                raise self._streams_only(routes)
            run = _Run(self.plan, self._router, self._slots, request, routes)
            await run.execute()
            _answer(self.name, item, run)
        except TritonError as error:
            _fail(item, error)
        except Exception as error:
            log.exception("ensemble '%s' failed a request", self.name)
            _fail(item, internal(f"ensemble '{self.name}': {error}"))
        finally:
            if not item.reply.done:  # cancelled: the ensemble is unloading
                _fail(item, unavailable(f"ensemble '{self.name}' is unloading"))

    def _streams_only(self, routes: _Routes) -> TritonError:
        flow = routes.flow
        step = next(
            step
            for step in self.plan.steps
            if flow.decoupled[step.index] and flow.opens[step.index] == flow.output_stream
        )
        # Reached when the ensemble loaded before that step model, so was not made decoupled.
        return unsupported(
            f"ensemble '{self.name}' answers with a stream of responses (its step model "
            f"'{step.model_name}' is decoupled): use gRPC streaming, with the ensemble declared "
            "decoupled (model_transaction_policy) in its config"
        )

    async def _current_routes(self) -> _Routes:
        """The routes for the step model versions serving now: checked again when one of them
        changed since the last request (a reload may change its tensors or make it decoupled)."""
        handles: list[ModelHandle] = []
        for step in self.plan.steps:
            try:
                handles.append(await self._resolve(step))
            except TritonError as error:
                raise _in_step(self.name, step, error) from None
        routes = self._routes
        if routes is not None and all(a is b for a, b in zip(routes.handles, handles, strict=True)):
            return routes
        try:
            check_steps(self._config, self.plan, {i: h.config for i, h in enumerate(handles)})
            routes = _routes_for(self.plan, tuple(handles))
        except TritonError as error:
            raise unavailable(error.message) from None
        self._routes = routes
        return routes

    async def _resolve(self, step: EnsembleStep) -> ModelHandle:
        try:
            return self._router.resolve(step.model_name, step.model_version)
        except TritonError:
            if self._router.loader is None:
                raise
        # Lazy loading: the step model loads with the ensemble's first request that needs it.
        await self._router.ensure_loaded(step.model_name)
        return self._router.resolve(step.model_name, step.model_version)


def _router_of(name: str, router: Router | InferFunction) -> Router:
    """The router the steps go through. The factory hands over the router's bound `infer` (all
    that BLS needs); an ensemble needs the router itself, to look at its step models and to
    stream from decoupled ones."""
    if isinstance(router, Router):
        return router
    owner = getattr(router, "__self__", None)
    if isinstance(owner, Router):
        return owner
    raise internal(f"ensemble '{name}' needs the router to run its steps")


def _routes_for(plan: EnsemblePlan, handles: tuple[ModelHandle, ...]) -> _Routes:
    flow = plan_flow(plan, [handle.decoupled for handle in handles])
    steps_of_stream: dict[int, list[EnsembleStep]] = {}
    for step in plan.steps:
        steps_of_stream.setdefault(flow.stream_of[step.index], []).append(step)
    return _Routes(handles, flow, {k: tuple(v) for k, v in steps_of_stream.items()})


def _in_step(ensemble: str, step: EnsembleStep, error: TritonError) -> TritonError:
    return TritonError(
        error.code, f"in ensemble '{ensemble}', step model '{step.model_name}': {error.message}"
    )


def _answer(name: str, item: Infer, run: _Run) -> None:
    request = item.request
    sender = request.sender
    if run.routes.flow.output_stream:
        assert sender is not None
        sender.send(final=True)  # its responses went out as they came
        item.reply.set(None)  # type: ignore[arg-type]
        return
    if run.response is None:
        missing = [n for n in run.output_names if n not in run.root.tensors]
        raise internal(f"ensemble '{name}' produced no tensor for output(s) {', '.join(missing)}")
    if sender is None:
        item.reply.set(run.response)
    else:
        sender.send(run.response, final=True)
        item.reply.set(None)  # type: ignore[arg-type]


def _fail(item: Infer, error: TritonError) -> None:
    sender = item.request.sender
    if sender is not None and not sender.finished:
        sender.send(error=error, final=True)
    item.reply.fail(error)


@dataclass(eq=False, slots=True)
class _Branch:
    """One item of a stream (see `EnsembleFlow`): the request itself, or one response of a
    decoupled step, with the tensors computed from it so far."""

    stream: int
    tensors: dict[str, Tensor]
    started: set[int] = field(default_factory=set)
    answered: bool = False


class _Run:
    """One request of the ensemble, from its inputs to its responses."""

    def __init__(
        self,
        plan: EnsemblePlan,
        router: Router,
        slots: tuple[anyio.Semaphore | None, ...],
        request: InferenceRequest,
        routes: _Routes,
    ) -> None:
        self.name = plan.name
        self.router = router
        self.slots = slots
        self.request = request
        self.routes = routes
        self.output_names = request.requested_output_names or list(plan.outputs)
        # How many responses of a decoupled step may wait before its model is held up.
        self.backlog = plan.max_inflight_requests
        self.root = _Branch(0, {tensor.name: tensor for tensor in request.inputs})
        self.response: InferenceResponse | None = None  # when the outputs are in stream 0
        self._failure: TritonError | None = None
        self._group: TaskGroup | None = None

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

    async def _start_ready(self, branch: _Branch) -> None:
        """Start the steps of the branch whose inputs it now has; answer once it has the
        outputs. With `max_inflight_requests`, waits for a step to have room: that holds up
        whatever produced the branch (back-pressure)."""
        assert self._group is not None
        for step in self.routes.steps_of_stream.get(branch.stream, ()):
            if step.index in branch.started:
                continue
            if not all(tensor in branch.tensors for tensor in step.inputs.values()):
                continue
            if self.request.cancelled:
                self._fail(cancelled(f"request for ensemble '{self.name}' was cancelled"))
                return
            branch.started.add(step.index)
            slot = self.slots[step.index]
            if slot is None:
                self._group.start_soon(self._run_step, step, branch, None)
            else:
                await self._group.start(self._run_step, step, branch, slot)
        self._answer(branch)

    def _answer(self, branch: _Branch) -> None:
        if branch.answered or branch.stream != self.routes.flow.output_stream:
            return
        if not all(name in branch.tensors for name in self.output_names):
            return
        branch.answered = True
        request = self.request
        response = InferenceResponse(
            self.name,
            str(request.resolved_version),
            request.id,
            [branch.tensors[name] for name in self.output_names],
        )
        if branch.stream == 0:
            self.response = response
        else:
            assert request.sender is not None
            request.sender.send(response)

    async def _run_step(
        self,
        step: EnsembleStep,
        branch: _Branch,
        slot: anyio.Semaphore | None,
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        try:
            if self.routes.flow.decoupled[step.index]:
                async with _holding(slot, task_status):
                    await self._stream_step(step, branch)
                return
            async with _holding(slot, task_status):
                response = await self.router.infer(self._step_request(step, branch))
            branch.tensors.update(_mapped(step, response))
            await self._start_ready(branch)
        except TritonError as error:
            self._fail(_in_step(self.name, step, error))

    async def _stream_step(self, step: EnsembleStep, branch: _Branch) -> None:
        """A decoupled step: each of its responses is a new branch of the stream it opens."""
        stream = _ResponseStream(self.backlog, self.request)
        request = self._step_request(step, branch)
        request.sender = stream.sender
        try:
            reply = self.router.submit(request)
            reply.add_done_callback(stream.execute_over)
            async with contextlib.aclosing(stream.responses()) as responses:
                async for response in responses:
                    if self.request.cancelled:
                        self._fail(cancelled(f"request for ensemble '{self.name}' was cancelled"))
                        return
                    opened = _Branch(self.routes.flow.opens[step.index], _mapped(step, response))
                    await self._start_ready(opened)
        finally:
            stream.close()
            if not stream.sender.finished:
                request.cancel()  # the ensemble gave up on it: the model may stop early

    def _step_request(self, step: EnsembleStep, branch: _Branch) -> InferenceRequest:
        inputs = []
        for model_input, tensor_name in step.inputs.items():
            tensor = branch.tensors[tensor_name]
            inputs.append(Tensor(model_input, tensor.datatype, tensor.shape, tensor.data))
        return InferenceRequest(
            step.model_name,
            step.model_version,
            self.request.id,
            inputs=inputs,
            outputs=[RequestedOutput(name) for name in step.outputs],
            parameters=dict(self.request.parameters),
            # Each step's spans nest under the ensemble's request; a child of its own, so that
            # steps running side by side keep their own queue times.
            trace=None if self.request.trace is None else self.request.trace.child(),
        )


def _mapped(step: EnsembleStep, response: InferenceResponse) -> dict[str, Tensor]:
    tensors: dict[str, Tensor] = {}
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


class _ResponseStream:
    """The responses of one request of a decoupled step, from whichever thread its model sends
    them on to the task that starts the next steps. With a `capacity`, a model thread that sends
    while that many responses wait is held up until one is taken (a model sending on the event
    loop cannot be held up: its responses wait however many they are). 0: no capacity limit."""

    def __init__(self, capacity: int, ensemble_request: InferenceRequest) -> None:
        self._send, self._receive = anyio.create_memory_object_stream[
            tuple[InferenceResponse | None, TritonError | None, bool]
        ](math.inf)
        self._capacity = capacity or math.inf
        self._room = threading.Condition()
        self._waiting = 0
        self._closed = False
        self._loop_thread = threading.get_ident()
        self._loop = _loop_token()
        self.sender = _StepSender(self._deliver, ensemble_request)

    def _deliver(
        self, response: InferenceResponse | None, error: TritonError | None, final: bool
    ) -> None:
        answer = (response, error, final)
        on_loop = threading.get_ident() == self._loop_thread
        with self._room:
            while (
                not on_loop
                and response is not None
                and self._waiting >= self._capacity
                and not self._closed
            ):
                self._room.wait()
            if self._closed:
                return
            self._waiting += 1
        if on_loop:
            self._put(answer)
        else:
            _call_on_loop(self._loop, self._put, answer)

    def _put(self, answer: tuple[InferenceResponse | None, TritonError | None, bool]) -> None:
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._send.send_nowait(answer)

    def execute_over(self, reply: Reply[Any]) -> None:
        """The step's execute is over: if it failed before the model sent its final response,
        that failure ends the stream."""
        if self.sender.finished:
            return
        try:
            reply.result()
        except TritonError as error:
            self.sender.send(error=error, final=True)
        except Exception as error:
            self.sender.send(error=internal(f"{type(error).__name__}: {error}"), final=True)

    async def responses(self) -> AsyncIterator[InferenceResponse]:
        """The model's responses, until its final one; raises the error it ended with."""
        while True:
            response, error, final = await self._receive.receive()
            with self._room:
                self._waiting -= 1
                self._room.notify()
            if error is not None:
                raise error
            if response is not None:
                yield response
            if final:
                return

    def close(self) -> None:
        """No more responses are taken: a model thread held up is let go, and what it sends
        from now on is dropped."""
        with self._room:
            self._closed = True
            self._room.notify_all()
        self._receive.close()


class _StepSender(ResponseSender):
    """A decoupled step's sender, cancelled too when the ensemble's request is: a model that
    polls `is_cancelled()` stops early when the ensemble's client goes away."""

    __slots__ = ("_ensemble_request",)

    def __init__(
        self,
        deliver: Callable[[InferenceResponse | None, TritonError | None, bool], None],
        ensemble_request: InferenceRequest,
    ) -> None:
        super().__init__(deliver)
        self._ensemble_request = ensemble_request

    def is_cancelled(self) -> bool:
        return self._ensemble_request.cancelled or super().is_cancelled()


def _loop_token() -> Any:
    if sniffio.current_async_library() == "asyncio":
        return asyncio.get_running_loop()
    return anyio.lowlevel.current_token()


def _call_on_loop(token: Any, function: Any, *args: Any) -> None:
    try:
        if isinstance(token, asyncio.AbstractEventLoop):
            # Does not wait for the loop to run it, unlike the generic path below.
            token.call_soon_threadsafe(function, *args)
        else:
            anyio.from_thread.run_sync(function, *args, token=token)
    except RuntimeError:  # the loop is gone: nobody listens any more
        pass
