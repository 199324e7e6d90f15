"""The router: name + version -> the scheduler of a ready model version. The only part of the
data plane the front ends talk to."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from anyio import WouldBlock, get_cancelled_exc_class

from tritonactor._proto.inference import ModelConfig
from tritonactor.actors import ActorRef, ActorStopped, Reply
from tritonactor.cache import Inserted, ResponseCache, caches_responses, freeze, request_key
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

log = logging.getLogger(__name__)


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
    `remove`); the front ends only read it and send requests through it.

    With a response cache (`cache`), a request to a version whose config asks for it is looked
    up after validation: a hit is answered at once, never reaching the scheduler; a miss goes on
    and its successful answer is stored (docs/response-cache.md)."""

    def __init__(self, cache: ResponseCache | None = None) -> None:
        self.cache = cache
        self._models: dict[str, dict[int, ModelHandle]] = {}
        # Names the repository knows (ready or not), so an error can say "not ready" vs "unknown".
        self.known: set[str] = set()
        # Lazy loading (set by the server): loads a known model that is not loaded yet.
        self.loader: Callable[[str], Awaitable[None]] | None = None

    def add(self, handle: ModelHandle) -> None:
        versions = dict(self._models.get(handle.name, {}))
        replaced = versions.get(handle.version)
        versions[handle.version] = handle
        self._models[handle.name] = dict(sorted(versions.items()))
        if replaced is not None and replaced is not handle and self.cache is not None:
            # Another copy serves the version now: what the old one answered is not its answer.
            self.cache.drop(handle.name, handle.version)

    def remove(self, name: str, version: int) -> None:
        versions = dict(self._models.get(name, {}))
        removed = versions.pop(version, None)
        if versions:
            self._models[name] = versions
        else:
            self._models.pop(name, None)
        if removed is not None and self.cache is not None:
            self.cache.drop(name, version)

    def resolve_exact(self, name: str, version: int) -> ModelHandle | None:
        return self._models.get(name, {}).get(version)

    def step_configs(self, config: ModelConfig) -> list[ModelConfig]:
        """The configs of the loaded versions an ensemble's steps would run now (none for a
        model that is not an ensemble, nor for a step not loaded)."""
        scheduling = config.ensemble_scheduling
        if scheduling is None:
            return []
        configs = []
        for step in scheduling.step:
            try:
                configs.append(self.resolve(step.model_name, _step_version(step.model_version)))
            except TritonError:
                continue
        return [handle.config for handle in configs]

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
        """Validate, queue (waiting while the scheduler's mailbox is full) and await the answer
        (a response-cache hit is answered at once)."""
        if self.loader is not None:
            await self.ensure_loaded(request.model_name)
        handle, arrival = self._route(request)
        if handle.decoupled:
            error = unsupported(
                f"model '{handle.name}' is decoupled: its responses can only be streamed"
            )
            self._admit(handle, request, arrival).reply.fail(error)
            raise error
        miss, hit = self._look_up(handle, request, arrival)
        if hit is not None:
            return hit
        message = self._admit(handle, request, arrival, miss)
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
        reach the scheduler in that order. A response-cache hit comes back already answered."""
        handle, arrival = self._route(request)
        if handle.decoupled and request.sender is None:
            error = unsupported(f"model '{handle.name}' is decoupled: a response sender is needed")
            self._admit(handle, request, arrival).reply.fail(error)
            raise error
        miss, hit = self._look_up(handle, request, arrival)
        if hit is not None:
            answered: Reply[InferenceResponse] = Reply()
            answered.set(hit)
            return answered
        message = self._admit(handle, request, arrival, miss)
        try:
            handle.scheduler.tell_nowait(message)
        except (ActorStopped, WouldBlock):
            error = self._stopped(handle)
            message.reply.fail(error)
            raise error from None
        return message.reply

    def _route(self, request: InferenceRequest) -> tuple[ModelHandle, int]:
        """The handle that serves `request`, once the request is valid for it, and the time of
        its arrival."""
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
        return handle, arrival

    def _admit(
        self,
        handle: ModelHandle,
        request: InferenceRequest,
        arrival: int,
        miss: tuple[bytes, int] | None = None,
    ) -> Infer:
        """The message that takes `request` to the scheduler, counted in the version's
        statistics; `miss`: the cache missed it (its key, the lookup's ns), so its answer is
        to be stored."""
        reply: Reply[InferenceResponse] = Reply()
        handle.statistics.admit(request, reply, arrival)
        if miss is not None:
            reply.add_done_callback(functools.partial(self._store, handle, *miss))
        return Infer(request, reply, arrival)

    def _look_up(
        self, handle: ModelHandle, request: InferenceRequest, arrival: int
    ) -> tuple[tuple[bytes, int] | None, InferenceResponse | None]:
        """((key, lookup ns), None) for a request the cache missed, (None, answer) for a hit,
        (None, None) when the cache has no part in it (no cache, not asked for by the config,
        decoupled, or an input that cannot be hashed: not in host memory, as in Triton)."""
        cache = self.cache
        if cache is None or handle.decoupled or not caches_responses(handle.config):
            return None, None
        key = request_key(handle.name, handle.version, request)
        if key is None:
            return None, None
        started = time.perf_counter_ns()
        entry = cache.lookup(key)
        ended = time.perf_counter_ns()
        if entry is None:
            return (key, ended - started), None
        response = entry.response(handle.name, str(handle.version), request.id)
        handle.statistics.record_cache_hit(arrival, started, ended, time.perf_counter_ns())
        return None, response

    def _store(
        self, handle: ModelHandle, key: bytes, lookup_ns: int, reply: Reply[InferenceResponse]
    ) -> None:
        """A request the cache missed has its answer: store it if it succeeded and the copy that
        answered still serves its version. As in Triton, a request whose twin was stored while
        it ran counts neither as a hit nor as a miss."""
        cache = self.cache
        if cache is None or reply.error is not None:
            return  # errors are never cached
        started = time.perf_counter_ns()
        outcome = Inserted.REFUSED
        if self.resolve_exact(handle.name, handle.version) is handle:
            entry = freeze(reply.result())
            if entry is not None:
                outcome = cache.insert(key, (handle.name, handle.version), entry)
                if outcome is Inserted.REFUSED:
                    # Triton logs its failed insertions too ("Failed to insert key").
                    log.warning(
                        "Failed to insert key into response cache: a response of model '%s' "
                        "version %d takes %d bytes, more than the %d-byte cache has room for",
                        handle.name,
                        handle.version,
                        entry.byte_size,
                        cache.size,
                    )
        if outcome is not Inserted.EXISTS:
            handle.statistics.record_cache_miss(lookup_ns + time.perf_counter_ns() - started)

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


def _step_version(version: int) -> str:
    # An ensemble step's model_version: -1 (or 0) is the highest ready one.
    return str(version) if version > 0 else ""
