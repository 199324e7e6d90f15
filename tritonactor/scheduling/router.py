"""The router: name + version -> the scheduler of a ready model version. The only part of the
data plane the front ends talk to."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from anyio import WouldBlock, get_cancelled_exc_class

from tritonactor._proto.inference import ModelConfig
from tritonactor.actors import ActorRef, ActorStopped, Reply
from tritonactor.core.errors import (
    ErrorCode,
    TritonError,
    cancelled,
    invalid_arg,
    not_found,
    unavailable,
    unsupported,
)
from tritonactor.core.types import InferenceRequest, InferenceResponse
from tritonactor.scheduling.messages import Infer
from tritonactor.scheduling.signature import ModelSignature
from tritonactor.scheduling.statistics import VersionStatistics


@dataclass(frozen=True, slots=True)
class ModelHandle:
    """A ready model version as the router serves it."""

    name: str
    version: int
    config: ModelConfig
    signature: ModelSignature
    scheduler: ActorRef[Any]
    # Shared with the version's instance actors, which record into it.
    statistics: VersionStatistics = field(default_factory=lambda: VersionStatistics(False))

    @property
    def decoupled(self) -> bool:
        """Whether the model may answer a request with any number of responses."""
        policy = self.config.model_transaction_policy
        return policy is not None and policy.decoupled


class Router:
    """Holds the table of ready versions. The control plane changes the table (`add`,
    `remove`); the front ends only read it and send requests through it."""

    def __init__(self) -> None:
        self._models: dict[str, dict[int, ModelHandle]] = {}
        # Names the repository knows (ready or not), so an error can say "not ready" vs "unknown".
        self.known: set[str] = set()
        # Lazy loading (set by the server): loads a known model that is not loaded yet.
        self.loader: Callable[[str], Awaitable[None]] | None = None

    def add(self, handle: ModelHandle) -> None:
        versions = dict(self._models.get(handle.name, {}))
        versions[handle.version] = handle
        self._models[handle.name] = dict(sorted(versions.items()))

    def remove(self, name: str, version: int) -> None:
        versions = dict(self._models.get(name, {}))
        versions.pop(version, None)
        if versions:
            self._models[name] = versions
        else:
            self._models.pop(name, None)

    def resolve_exact(self, name: str, version: int) -> ModelHandle | None:
        return self._models.get(name, {}).get(version)

    def ready_versions(self, name: str) -> list[int]:
        return list(self._models.get(name, {}))

    def handles(self) -> list[ModelHandle]:
        """Every ready version, by model name, then version."""
        return [handle for name in sorted(self._models) for handle in self._models[name].values()]

    def resolve(self, name: str, version: str = "") -> ModelHandle:
        """The handle serving `name` at `version` ("" = the highest ready version)."""
        versions = self._models.get(name)
        if version:
            number = parse_version(version)
            handle = versions.get(number) if versions else None
            if handle is None:
                raise self._not_ready(name, version)
            return handle
        if not versions:
            raise self._not_ready(name, version)
        return versions[next(reversed(versions))]

    def select(self, name: str = "", version: str = "") -> list[ModelHandle]:
        """The ready versions whose statistics were asked for: every one (no name), every one
        of a model (no version), or one. Anything else is Triton's INVALID_ARG."""
        if not name:
            return self.handles()
        if version:
            try:
                return [self.resolve(name, version)]
            except TritonError as error:
                if error.code is ErrorCode.INVALID_ARG:  # not a version number
                    raise
                if self.ready_versions(name):
                    raise invalid_arg(
                        f"requested model version is not available for model '{name}'"
                    ) from None
        versions = self.ready_versions(name)
        if not versions:
            raise invalid_arg(f"requested model '{name}' is not available")
        return [self.resolve(name, str(number)) for number in versions]

    async def ensure_loaded(self, name: str) -> None:
        """With lazy loading, load `name` if the repository has it and it is not loaded yet:
        its first request waits for the load (and fails with the load's error)."""
        if self.loader is not None and name not in self._models and name in self.known:
            await self.loader(name)

    async def infer(self, request: InferenceRequest) -> InferenceResponse:
        """Validate, queue (waiting while the scheduler's mailbox is full) and await the answer."""
        if self.loader is not None:
            await self.ensure_loaded(request.model_name)
        handle, message = self._prepare(request)
        if handle.decoupled:
            error = unsupported(
                f"model '{handle.name}' is decoupled: its responses can only be streamed"
            )
            message.reply.fail(error)
            raise error
        delivered = False
        try:
            await handle.scheduler.tell(message)
            delivered = True
            return await message.reply.wait()
        except ActorStopped:
            error = self._stopped(handle)
            message.reply.fail(error)
            raise error from None
        except get_cancelled_exc_class():
            request.cancel()  # whoever waited is gone: the request need not run
            if not delivered:
                # Given up while the mailbox was full: no one else will ever answer it. (A
                # delivered one is answered by the scheduler, which drops it cancelled.)
                message.reply.fail(cancelled(f"request for model '{handle.name}' was cancelled"))
            raise

    def submit(self, request: InferenceRequest) -> Reply[InferenceResponse]:
        """Validate and queue the request now; its answer comes through the returned reply
        (for a decoupled model, through `request.sender`, which the caller must set; the reply
        then only says when execute is over, or fails). Requests submitted one after another
        reach the scheduler in that order."""
        handle, message = self._prepare(request)
        if handle.decoupled and request.sender is None:
            error = unsupported(f"model '{handle.name}' is decoupled: a response sender is needed")
            message.reply.fail(error)
            raise error
        try:
            handle.scheduler.tell_nowait(message)
        except (ActorStopped, WouldBlock):
            error = self._stopped(handle)
            message.reply.fail(error)
            raise error from None
        return message.reply

    def _prepare(self, request: InferenceRequest) -> tuple[ModelHandle, Infer]:
        arrival = time.perf_counter_ns()
        trace = request.trace
        started = time.time_ns() if trace is not None else 0
        try:
            handle = self.resolve(request.model_name, request.model_version)
            handle.signature.validate(request)
        except TritonError as error:
            if trace is not None:
                trace.routed(request, started, error)
            raise
        request.resolved_version = handle.version
        if trace is not None:
            trace.routed(request, started)
        reply: Reply[InferenceResponse] = Reply()
        handle.statistics.admit(request, reply, arrival)
        return handle, Infer(request, reply, arrival)

    @staticmethod
    def _stopped(handle: ModelHandle) -> TritonError:
        return unavailable(
            f"model '{handle.name}' version {handle.version} is not accepting requests"
        )

    def _not_ready(self, name: str, version: str) -> TritonError:
        if name not in self.known:
            return not_found(f"Request for unknown model: '{name}' is not found")
        if version:
            return not_found(f"Request for unknown model: '{name}' version {version} is not found")
        return not_found(f"Request for unknown model: '{name}' has no available versions")


def parse_version(version: str) -> int:
    try:
        number = int(version)
    except ValueError:
        number = -1
    if number < 0 or not version.isdigit():
        raise invalid_arg(
            f"failed to get model version from specified version string '{version}', "
            "version should be an integral value > 0"
        )
    return number
