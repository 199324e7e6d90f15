"""The instance actor: one `instance_group` instance, executing one batch at a time off the loop."""

from __future__ import annotations

import contextlib
import inspect
import logging
from typing import Any

from tritonactor.actors import Actor, ActorRef, ActorStopped
from tritonactor.actors.worker import WorkerThread
from tritonactor.backends.base import BackendInstance, InstanceDied, Result
from tritonactor.core.errors import TritonError, internal, unavailable
from tritonactor.scheduling.messages import Execute, InstanceIdle

log = logging.getLogger(__name__)


class InstanceActor(Actor[Execute]):
    mailbox_size = 4  # the scheduler sends a batch only to an idle instance

    def __init__(self, name: str, backend: BackendInstance, scheduler: ActorRef[Any]) -> None:
        super().__init__(name)
        self._backend = backend
        self._scheduler = scheduler
        self._is_async = inspect.iscoroutinefunction(backend.execute)
        # One thread of its own: the backend runs one batch at a time, off the event loop.
        self._worker = WorkerThread(name)

    async def started(self) -> None:
        await self._scheduler.tell(InstanceIdle(self.ref))

    async def receive(self, message: Execute) -> None:
        requests = [item.request for item in message.batch]
        try:
            if self._is_async:
                results = await self._backend.execute(requests)  # type: ignore[misc]
            else:
                results = await self._worker.run(self._backend.execute, requests)
            if len(results) != len(requests):
                raise internal(
                    f"instance '{self.name}' returned {len(results)} responses "
                    f"for {len(requests)} requests"
                )
        except InstanceDied as death:
            # The instance itself is gone: its batch fails with the reason, and so does this
            # actor, so that the model-version actor can put a new instance in its place.
            _answer(message, [unavailable(str(death))] * len(requests))
            raise
        except Exception as error:  # a backend bug fails this batch, not the instance
            log.exception("instance '%s' failed to execute a batch", self.name)
            failure = error if isinstance(error, TritonError) else internal(str(error))
            results = [failure] * len(requests)
        _answer(message, results)
        # The scheduler may have stopped first (the model is unloading): nothing more will come.
        with contextlib.suppress(ActorStopped):
            await self._scheduler.tell(InstanceIdle(self.ref))

    async def stopped(self) -> None:
        try:
            await self._worker.run(self._backend.finalize)
        finally:
            self._worker.close()


def _answer(message: Execute, results: list[Result]) -> None:
    # None: a decoupled model answered (or will answer) through the request's sender; its reply
    # then only says that execute is over.
    for item, result in zip(message.batch, results, strict=True):
        if isinstance(result, TritonError):
            item.reply.fail(result)
            continue
        sender = item.request.sender
        if result is not None and sender is not None and not sender.finished:
            # A backend that knows nothing of decoupling answered with one response: that is
            # the request's only, and final, response.
            sender.send(result, final=True)
        item.reply.set(result)  # type: ignore[arg-type]
