"""The scheduler of an ensemble: each request runs its DAG of steps (`ensemble_run.py`), each step
a request through the router, steps whose inputs are ready running at once. The steps after a
decoupled step run once per response of it (`ensemble_stream.py`), and the ensemble then answers
with a stream of responses."""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

import anyio

from tritonactor._proto.inference import ModelConfig, ModelTransactionPolicy
from tritonactor.actors import Actor
from tritonactor.backends.base import InferFunction
from tritonactor.backends.ensemble import (
    EnsemblePlan,
    EnsembleStep,
    check_steps,
    needed_steps,
    plan_ensemble,
)
from tritonactor.core.errors import TritonError, internal, unavailable, unsupported
from tritonactor.scheduling.ensemble_run import EnsembleRun, Routes, in_step, routes_for
from tritonactor.scheduling.messages import Infer
from tritonactor.scheduling.router import ModelHandle, Router
from tritonactor.scheduling.step_times import ENSEMBLE_TIMES

log = logging.getLogger(__name__)

# The pruned plans kept, by set of requested outputs (a client rarely asks for many sets).
_PRUNED_PLANS_KEPT = 64


class EnsembleScheduler(Actor[Any]):
    """Takes `Infer` messages; each request is a helper task of its own (its steps await other
    models), so requests run concurrently with each other. The actor stopping cancels those
    still running: they fail UNAVAILABLE.

    At load it checks the steps against those of their models that are already loaded (all of
    them when the manager loads an ensemble after its steps). The rest is checked by the first
    request that finds them loaded, and again whenever a step model is replaced."""

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
        self._routes: Routes | None = None
        self._all_steps = frozenset(step.index for step in self.plan.steps)
        self._pruned: dict[frozenset[str], frozenset[int]] = {}
        self._check_at_load()

    def _check_at_load(self) -> None:
        # (A step model no repository holds is the manager's to refuse, `unserved_step`; the
        # watcher's ensemble waits for it, away, as Triton's does.)
        ready: dict[int, ModelHandle] = {}
        for step in self.plan.steps:
            with contextlib.suppress(TritonError):  # not loaded yet: checked when it is
                ready[step.index] = self._router.resolve(step.model_name, step.model_version)
        check_steps(self._config, self.plan, {i: h.config for i, h in ready.items()})
        if len(ready) == len(self.plan.steps):
            routes = self._routes = routes_for(self.plan, tuple(ready[i] for i in sorted(ready)))
            # Triton's rule: an ensemble with a decoupled step is decoupled. Set on the config
            # the ensemble is served with, so that the front ends stream its responses.
            decoupled = routes.flow.streams_responses
            # Triton writes it whichever it is, false too.
            self._config.model_transaction_policy = ModelTransactionPolicy(decoupled=decoupled)

    async def receive(self, message: Any) -> None:
        if isinstance(message, Infer):
            self.start_soon(self._serve, message)
        # InstanceIdle / InstanceGone / Rescheduled never come: an ensemble has no instances.

    async def _serve(self, item: Infer) -> None:
        request = item.request
        taken = time.perf_counter_ns()
        try:
            routes = await self._current_routes()
            if routes.flow.output_stream and request.sender is None:
                raise self._streams_only(routes)
            needed = self._needed(request.requested_output_names)
            run = EnsembleRun(self.plan, self._router, self._slots, request, routes, needed)
            await run.execute()
            # For the ensemble's own statistics, read as the reply is answered.
            request.context[ENSEMBLE_TIMES] = (taken, run.step_times)
            _answer(self.name, item, run)
        except TritonError as error:
            _fail(item, error)
        except Exception as error:
            log.exception("ensemble '%s' failed a request", self.name)
            _fail(item, internal(f"ensemble '{self.name}': {error}"))
        finally:
            if not item.reply.done:  # cancelled: the ensemble is unloading
                _fail(item, unavailable(f"ensemble '{self.name}' is unloading"))

    def _needed(self, outputs: list[str]) -> frozenset[int]:
        """The steps a request for `outputs` (none named: all of them) needs."""
        if not outputs:
            return self._all_steps
        key = frozenset(outputs)
        needed = self._pruned.get(key)
        if needed is None:
            needed = needed_steps(self.plan, key)
            if len(self._pruned) >= _PRUNED_PLANS_KEPT:
                self._pruned.clear()
            self._pruned[key] = needed
        return needed

    def _streams_only(self, routes: Routes) -> TritonError:
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

    async def _current_routes(self) -> Routes:
        """The routes for the step model versions serving now: checked again when one of them
        changed since the last request (a reload may change its tensors or make it decoupled)."""
        handles: list[ModelHandle] = []
        for step in self.plan.steps:
            try:
                handles.append(await self._resolve(step))
            except TritonError as error:
                raise in_step(self.name, error) from None
        routes = self._routes
        if routes is not None and all(a is b for a, b in zip(routes.handles, handles, strict=True)):
            return routes
        try:
            check_steps(self._config, self.plan, {i: h.config for i, h in enumerate(handles)})
            routes = routes_for(self.plan, tuple(handles))
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


def _answer(name: str, item: Infer, run: EnsembleRun) -> None:
    request = item.request
    sender = request.sender
    if run.routes.flow.output_stream:
        assert sender is not None
        if not sender.finished:  # its last response was not made with nothing left to run
            sender.send(final=True)  # (its responses went out as they came)
        item.reply.set(None)  # type: ignore[arg-type]
        return
    if run.response is None:  # every needed step ran or was skipped: not expected
        raise internal(f"ensemble '{name}' finished its steps without a response")
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
