"""The model-version actor: loads one version through its backend and owns the scheduler and the
instance actors that serve it."""

from __future__ import annotations

import logging
from typing import Any

import anyio

from tritonactor.actors import Actor, ActorRef
from tritonactor.backends.base import (
    Backend,
    BackendInstance,
    BackendModel,
    InstanceContext,
    ModelContext,
)
from tritonactor.config.normalize import InstanceSpec, instance_specs
from tritonactor.scheduling.default import DefaultScheduler
from tritonactor.scheduling.instance import InstanceActor
from tritonactor.scheduling.messages import InstanceGone

log = logging.getLogger(__name__)


class ModelVersionActor(Actor[Any]):
    """Started = loaded and ready: `spawn` returns once every instance is up, or raises the
    reason the load failed (after releasing whatever was already created)."""

    def __init__(self, backend: Backend, context: ModelContext) -> None:
        super().__init__(f"{context.name}:{context.version}")
        self.context = context
        self._backend = backend
        self._model: BackendModel | None = None
        self._instances: set[ActorRef[Any]] = set()
        self.scheduler: ActorRef[Any] | None = None

    async def started(self) -> None:
        self._model = await anyio.to_thread.run_sync(self._backend.load_model, self.context)
        created: list[tuple[InstanceSpec, BackendInstance]] = []
        try:
            for spec in instance_specs(self.context.config):
                instance_context = InstanceContext(
                    spec.name, spec.kind, spec.device_id, spec.index, spec.group
                )
                instance = await anyio.to_thread.run_sync(
                    self._model.create_instance, instance_context
                )
                created.append((spec, instance))
        except BaseException:
            with anyio.CancelScope(shield=True):
                for _, instance in created:
                    await anyio.to_thread.run_sync(instance.finalize)
                await anyio.to_thread.run_sync(self._model.finalize)
            raise
        self.scheduler = await self.spawn(DefaultScheduler(self.context.name))
        for spec, instance in created:
            ref = await self.spawn(InstanceActor(spec.name, instance, self.scheduler))
            self._instances.add(ref)

    async def receive(self, message: Any) -> None:
        log.warning("model '%s' ignored an unexpected message %r", self.name, message)

    async def on_child_failed(self, child: ActorRef[Any], error: BaseException) -> None:
        if child is self.scheduler or child not in self._instances:
            raise error
        self._instances.discard(child)
        assert self.scheduler is not None
        await self.scheduler.tell(InstanceGone(child))
        if not self._instances:
            raise error  # nothing left to serve with: the model fails as a whole

    async def stopped(self) -> None:
        if self._model is not None:
            await anyio.to_thread.run_sync(self._model.finalize)
