"""The model-version actor: loads one version through its backend and owns the scheduler and the
instance actors that serve it."""

from __future__ import annotations

import contextlib
import logging
import threading
from dataclasses import dataclass
from typing import Any

import anyio

from tritonactor.actors import Actor, ActorRef, ActorStopped
from tritonactor.backends.base import (
    Backend,
    BackendInstance,
    BackendModel,
    InferFunction,
    InstanceContext,
    ModelContext,
    ModelControl,
    SubmitFunction,
)
from tritonactor.cache import caches_responses
from tritonactor.config.normalize import InstanceSpec, instance_specs
from tritonactor.observability.summaries import LatencyOptions, LatencySummaries
from tritonactor.scheduling.default import Scheduler
from tritonactor.scheduling.factory import scheduler_for
from tritonactor.scheduling.instance import InstanceActor
from tritonactor.scheduling.messages import InstanceGone, VersionHealth
from tritonactor.scheduling.statistics import VersionStatistics
from tritonactor.scheduling.warmup import warm_up

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Restart:
    """Time for the next attempt to put a new instance in the place of one that died."""

    name: str


@dataclass(slots=True)
class _Down:
    """An instance that died and is not replaced yet."""

    spec: InstanceSpec
    reason: str  # why it died
    attempts: int = 0  # failed attempts to replace it


class _Creation:
    """An instance created on a worker thread whose caller may abandon it (`_create_instance`):
    one that comes up after that is finalized where it was made, and one made just before is
    handed to the caller to finalize (an abandoned thread's result goes nowhere)."""

    def __init__(self, model: BackendModel, context: InstanceContext) -> None:
        self._model = model
        self._context = context
        self._lock = threading.Lock()
        self._abandoned = False
        self._made: BackendInstance | None = None

    def run(self) -> BackendInstance:
        instance = self._model.create_instance(self._context)
        with self._lock:
            if not self._abandoned:
                self._made = instance
                return instance
        instance.finalize()
        raise RuntimeError(f"the creation of instance '{self._context.name}' was abandoned")

    def abandon(self) -> BackendInstance | None:
        """The backend cuts the creation short; an instance already made is returned."""
        with self._lock:
            self._abandoned = True
            made = self._made
        if made is None:
            self._model.abort_create(self._context)
        return made


class ModelVersionActor(Actor[Any]):
    """Started = loaded and ready: `spawn` returns once every instance is up, or raises the
    reason the load failed (after releasing whatever was already created).

    An instance that dies is replaced: the owner hears `VersionHealth(ready=False)` at once and
    `VersionHealth(ready=True)` when the replacement serves. An instance that can die on its
    own (a python model's process) reports its death when it happens, busy or idle
    (`InstanceActor`). Requests queued meanwhile wait in the scheduler for the replacement.

    A replacement that fails to start is tried again: after `RESTART_DELAYS`, then twice the
    previous wait each time, up to `RESTART_DELAY_CAP`, for as long as another instance of the
    version still serves (a broken instance does not take its healthy siblings down). The
    version fails as a whole only when no instance is left and every dead one has failed its
    first `len(RESTART_DELAYS)` attempts. Attempts run as messages to this actor, so a death
    or a stop is heard between them. A replacement that dies within `STABLE_S` of starting,
    having answered no batch, counts as one more failed attempt (a model that crashes once
    started backs off as one that cannot start does, rather than restarting at once, forever).

    The version is unavailable (`VersionHealth(ready=False)`) only while no instance serves:
    with a sibling still serving it stays ready (its requests are served), and the death is
    logged."""

    RESTART_DELAYS = (0.0, 0.5, 2.0)
    RESTART_DELAY_CAP = 30.0
    STABLE_S = 10.0

    def __init__(
        self,
        backend: Backend,
        context: ModelContext,
        infer: InferFunction | None = None,
        submit: SubmitFunction | None = None,
        control: ModelControl | None = None,
        latency: LatencyOptions | None = None,
    ) -> None:
        super().__init__(f"{context.name}:{context.version}")
        self.context = context
        self._backend = backend
        self._infer = infer
        # What its instances may ask of the server beyond `infer` (streamed BLS, model control).
        self._submit = submit
        self._control = control
        self._model: BackendModel | None = None
        self._instances: dict[ActorRef[Any], InstanceSpec] = {}
        self._actors: dict[ActorRef[Any], InstanceActor] = {}
        # Instances that died and are not replaced yet, by name.
        self._down: dict[str, _Down] = {}
        # Replacements by name: when each started, and the failed attempts before it.
        self._replaced: dict[str, tuple[float, int]] = {}
        # Whether the owner was told the version cannot serve (no instance left).
        self._told_down = False
        self.scheduler: ActorRef[Any] | None = None
        self._scheduler: Actor[Any] | None = None  # the actor behind `scheduler`
        # The instances of passive groups: made and kept, never given requests (as in Triton).
        self._passive: list[BackendInstance] = []
        config = context.config
        # Whether a batch that never reached a dead instance may queue again as new requests:
        # not a sequence batcher's rows, nor where answers must keep the order of arrival.
        self._requeue = config.sequence_batching is None and not (
            config.dynamic_batching is not None and config.dynamic_batching.preserve_ordering
        )
        self.statistics = VersionStatistics(
            batching=context.config.max_batch_size > 0,
            counted_when_answered=context.config.ensemble_scheduling is not None,
            summaries=LatencySummaries(latency.quantiles, cached=caches_responses(config))
            if latency is not None and latency.summaries
            else None,
        )

    async def started(self) -> None:
        # Built first: a scheduler config it cannot serve fails the load before anything exists.
        scheduler = scheduler_for(self.context.config, self._infer, self.context.model_dir)
        specs = instance_specs(self.context.config)
        self._model = await anyio.to_thread.run_sync(self._backend.load_model, self.context)
        created: list[tuple[InstanceSpec, BackendInstance]] = []
        try:
            for spec in specs:
                created.append((spec, await self._create_instance(spec)))
        except BaseException:
            with anyio.CancelScope(shield=True):
                for _, instance in created:
                    await anyio.to_thread.run_sync(instance.finalize)
                await anyio.to_thread.run_sync(self._model.finalize)
            raise
        self._scheduler = scheduler
        self.scheduler = await self.spawn(scheduler)
        for spec, instance in created:
            if spec.passive:
                self._passive.append(instance)
            else:
                await self._start_instance(spec, instance)

    async def _create_instance(self, spec: InstanceSpec) -> BackendInstance:
        assert self._model is not None
        context = InstanceContext(
            spec.name,
            spec.kind,
            spec.device_id,
            spec.index,
            spec.group,
            infer=self._infer,
            submit=self._submit,
            control=self._control,
        )
        creation = _Creation(self._model, context)
        try:
            # (abandoned when cancelled: a model whose `initialize` never returns would hold the
            # server's exit for ever; the backend is told to cut it short)
            instance = await anyio.to_thread.run_sync(creation.run, abandon_on_cancel=True)
        except anyio.get_cancelled_exc_class():
            made = creation.abandon()
            if made is not None:  # made as the cancel came: its result would go nowhere
                threading.Thread(target=made.finalize, daemon=True).start()
            raise
        try:  # warmed up before it serves, also when it replaces one that died
            await warm_up(instance, self.context, spec.name, self.statistics)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(instance.finalize)
            raise
        return instance

    async def _start_instance(self, spec: InstanceSpec, instance: BackendInstance) -> None:
        assert self.scheduler is not None
        actor = InstanceActor(
            spec.name, instance, self.scheduler, self.statistics, requeue=self._requeue
        )
        ref = await self.spawn(actor)
        self._instances[ref] = spec
        self._actors[ref] = actor

    async def receive(self, message: Any) -> None:
        if isinstance(message, _Restart):
            await self._restart(message.name)
            return
        log.warning("model '%s' ignored an unexpected message %r", self.name, message)

    async def on_child_failed(self, child: ActorRef[Any], error: BaseException) -> None:
        spec = self._instances.pop(child, None)
        actor = self._actors.pop(child, None)
        if spec is None:
            raise error  # the scheduler: nothing can serve without it
        assert self.scheduler is not None
        await self.scheduler.tell(InstanceGone(child))
        attempts = 0
        replaced = self._replaced.pop(spec.name, None)
        answered = actor is not None and actor.answered > 0
        if (
            replaced is not None
            and not answered
            and anyio.current_time() - replaced[0] < self.STABLE_S
        ):
            attempts = replaced[1] + 1  # a replacement that died soon, unproven: a failed try
        down = self._down[spec.name] = _Down(
            spec, f"instance '{spec.name}' failed: {error}", attempts
        )
        if self._instances:
            log.warning(
                "model '%s': %s; %d other instance(s) still serve",
                self.name,
                down.reason,
                len(self._instances),
            )
        else:
            self._told_down = True
            await self._tell_owner(ready=False, reason=down.reason)
        self._schedule(down)

    def restart_delay(self, attempts: int) -> float:
        """The wait before attempt `attempts` (0: the first) to replace a dead instance."""
        delays = self.RESTART_DELAYS
        if attempts < len(delays):
            return delays[attempts]
        doubled = max(delays[-1], 0.5) * 2 ** (attempts - len(delays) + 1)
        return min(doubled, self.RESTART_DELAY_CAP)

    def _schedule(self, down: _Down) -> None:
        # A message, even with no wait: what else came meanwhile (a death, a stop) is heard.
        self.tell_later(_Restart(down.spec.name), self.restart_delay(down.attempts))

    async def _restart(self, name: str) -> None:
        down = self._down.get(name)
        if down is None:
            return
        try:
            instance = await self._create_instance(down.spec)
        except Exception as error:
            down.attempts += 1
            log.warning(
                "model '%s': %s; restarting it failed (attempt %d): %s",
                self.name,
                down.reason,
                down.attempts,
                error,
            )
            first_tries = len(self.RESTART_DELAYS)
            if not self._instances and all(d.attempts >= first_tries for d in self._down.values()):
                reason = f"{down.reason}; restarting it failed: {error}"
                if isinstance(self._scheduler, Scheduler):  # its queued requests are told why
                    self._scheduler.given_up = reason
                raise RuntimeError(reason) from None
            self._schedule(down)
            return
        del self._down[name]
        await self._start_instance(down.spec, instance)
        self._replaced[name] = (anyio.current_time(), down.attempts)
        log.info("model '%s': instance '%s' restarted", self.name, name)
        if self._told_down:
            self._told_down = False
            await self._tell_owner(ready=True)

    async def _tell_owner(self, ready: bool, reason: str = "") -> None:
        if self.parent is not None:
            health = VersionHealth(
                self.context.name, self.context.version, ready, reason, sender=self.ref
            )
            with contextlib.suppress(ActorStopped):
                await self.parent.tell(health)

    async def stopped(self) -> None:
        # Instances stopped with the model have released their backends; those cancelled
        # because it failed have not (an instance's `stopped` hook runs at a stop or a failure,
        # never at a cancellation), and go before the model.
        for actor in list(self._actors.values()):
            await actor.release()
        for instance in self._passive:
            await anyio.to_thread.run_sync(instance.finalize)
        self._passive.clear()
        if self._model is not None:
            await anyio.to_thread.run_sync(self._model.finalize)
