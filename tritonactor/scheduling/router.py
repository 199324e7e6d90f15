"""The router: name + version -> the scheduler of a ready model version. The only part of the
data plane the front ends talk to."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable

from anyio import WouldBlock, get_cancelled_exc_class

from tritonactor._proto.inference import ModelConfig
from tritonactor.actors import ActorStopped, Reply
from tritonactor.cache import ResponseCache
from tritonactor.core.errors import (
    ErrorCode,
    TritonError,
    cancelled,
    invalid_arg,
    not_found,
    refused,
    unavailable,
    unsupported,
)
from tritonactor.core.types import InferenceRequest, InferenceResponse
from tritonactor.scheduling.caching import STORING, ResponseCaching
from tritonactor.scheduling.handle import ModelHandle
from tritonactor.scheduling.messages import Infer

__all__ = ["ModelHandle", "Router", "parse_version"]


class Router:
    """Holds the table of ready versions. The control plane changes the table (`add`,
    `remove`); the front ends only read it and send requests through it.

    With a response cache (`cache`), a request to a version whose config asks for it is looked
    up after validation: a hit is answered at once, never reaching the scheduler; a miss goes on
    and its successful answer is stored (docs/response-cache.md)."""

    def __init__(self, cache: ResponseCache | None = None) -> None:
        # The response cache (None without one) and the work of looking up and storing.
        self.cache = cache
        self.caching = ResponseCaching(cache, self.resolve_exact) if cache is not None else None
        # Every version the control plane added, and of them those that serve (`_models`): all
        # but an ensemble's whose step does not serve (`_show`).
        self._added: dict[str, dict[int, ModelHandle]] = {}
        self._models: dict[str, dict[int, ModelHandle]] = {}
        # Names the repository knows (ready or not), and those of them a load was asked for,
        # with the versions that have a state (the manager keeps both): an error says "no
        # available versions" for a model a load was asked for that does not serve, and "is
        # not at ready state" for such a version, as Triton's, and "not found" for any other.
        self.known: set[str] = set()
        self.tried: dict[str, frozenset[int]] = {}
        # Lazy loading (set by the server): loads a known model that is not loaded yet.
        self.loader: Callable[[str], Awaitable[None]] | None = None

    def tried_load(self, name: str, versions: frozenset[int] | None = frozenset()) -> bool:
        """Note that a load of `name` was asked for, and which of its versions have a state
        now (None: forget it, the model left the repository); whether that changed anything."""
        if versions is None:
            return self.tried.pop(name, None) is not None
        if self.tried.get(name) == versions:
            return False
        self.tried[name] = versions
        return True

    def add(self, handle: ModelHandle) -> None:
        versions = dict(self._added.get(handle.name, {}))
        replaced = versions.get(handle.version)
        versions[handle.version] = handle
        self._added[handle.name] = dict(sorted(versions.items()))
        self._show()
        if replaced is not None and replaced is not handle and self.cache is not None:
            # Another copy serves the version now: what the old one answered is not its answer.
            self.cache.drop(handle.name, handle.version)
        if replaced is not handle:
            self._drop_dependents(handle.name)

    def remove(self, name: str, version: int) -> None:
        versions = dict(self._added.get(name, {}))
        removed = versions.pop(version, None)
        if versions:
            self._added[name] = versions
        else:
            self._added.pop(name, None)
        self._show()
        if removed is not None and self.cache is not None:
            self.cache.drop(name, version)
            self._drop_dependents(name)

    def _show(self) -> None:
        """What serves, worked out again from what was added: every version but an ensemble's
        a step of which finds no version serving (through any number of ensembles). As in
        Triton, such an ensemble is away (not ready, "unloaded" in the index, its requests
        those of a model with no available versions) while its step model is, and back as
        the step model serves again; here it stays loaded meanwhile (`hidden`)."""
        shown: dict[str, dict[int, ModelHandle]] = {}
        waiting: list[ModelHandle] = []
        for name, versions in self._added.items():
            for version, handle in versions.items():
                if handle.config.ensemble_scheduling is None:
                    shown.setdefault(name, {})[version] = handle
                else:
                    waiting.append(handle)
        while waiting:
            ready = [handle for handle in waiting if _steps_serve(handle.config, shown)]
            if not ready:
                break
            for handle in ready:
                shown.setdefault(handle.name, {})[handle.version] = handle
                waiting.remove(handle)
        self._models = {name: dict(sorted(versions.items())) for name, versions in shown.items()}

    def hidden(self) -> frozenset[tuple[str, int]]:
        """(name, version) of each ensemble version loaded but away, a step model of it not
        serving (`_show`)."""
        return frozenset(
            (name, version)
            for name, versions in self._added.items()
            for version in versions
            if version not in self._models.get(name, {})
        )

    def _drop_dependents(self, name: str) -> None:
        """A version of `name` came or went: what an ensemble running it (through any number
        of ensembles) answered may not be what it answers now, so its entries go."""
        if self.cache is None:
            return
        changed, frontier = {name}, [name]
        while frontier:
            step = frontier.pop()
            for model, versions in self._added.items():
                if model not in changed and any(_runs(h.config, step) for h in versions.values()):
                    changed.add(model)
                    frontier.append(model)
                    for version in versions:
                        self.cache.drop(model, version)

    def resolve_exact(self, name: str, version: int) -> ModelHandle | None:
        """The handle added for `name` at `version`, serving or not (`_show`)."""
        return self._added.get(name, {}).get(version)

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
            if handle is None:  # named as read ("01", "+1": version 1), as Triton names it
                raise self._not_ready(name, str(number))
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
        # (An ensemble away is loaded again: its load loads the step models it needs.)
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
        miss, hit = None, None
        if self.caching is not None:
            await self.caching.prepare(handle, request)
            miss, hit = self.caching.look_up(handle, request, arrival)
        if hit is not None:
            return await hit.wait()
        message = self._admit(handle, request, arrival, miss)
        delivered = False
        try:
            await handle.scheduler.tell(message)
            delivered = True
            response = await message.reply.wait()
            storing: asyncio.Task[None] | None = request.context.get(STORING)
            if storing is not None:
                await asyncio.wait({storing})  # neither cancels it nor raises its error
            return response
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
        reach the scheduler in that order. A response-cache hit comes back answered, or
        answered once a large one is read out of the cache off the event loop; `prepare`
        first keeps a large request's key off the event loop too."""
        handle, arrival = self._route(request)
        if handle.decoupled and request.sender is None:
            error = unsupported(f"model '{handle.name}' is decoupled: a response sender is needed")
            self._admit(handle, request, arrival).reply.fail(error)
            raise error
        miss, hit = (
            self.caching.look_up(handle, request, arrival)
            if self.caching is not None
            else (None, None)
        )
        if hit is not None:
            return hit
        message = self._admit(handle, request, arrival, miss)
        try:
            handle.scheduler.tell_nowait(message)
        except (ActorStopped, WouldBlock):
            error = self._stopped(handle)
            message.reply.fail(error)
            raise error from None
        if miss is None:
            return message.reply
        return _after_storing(request, message.reply)

    async def prepare(self, request: InferenceRequest) -> None:
        """Before `submit`: work out the response-cache key of a large request to a model that
        caches off the event loop (what `submit` would do on it). Never fails: a request that
        cannot be routed, or is not valid, is left to `submit` to refuse (and is never hashed)."""
        if self.caching is None:
            return
        try:
            handle = self.resolve(request.model_name, request.model_version)
            if not self.caching.caches(handle):
                return
            handle.signature.validate(request)
        except TritonError:
            return
        await self.caching.prepare(handle, request)

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
            raise refused(error) from None
        request.resolved_version = handle.version
        if trace is not None:
            trace.routed(request, started)
        return handle, arrival

    def _admit(
        self,
        handle: ModelHandle,
        request: InferenceRequest,
        arrival: int,
        miss: tuple[bytes, int, int] | None = None,
    ) -> Infer:
        """The message that takes `request` to the scheduler, counted in the version's
        statistics; `miss`: the cache missed it (its key, the lookup's ns, the generation of
        its version's entries), so its answer is to be stored."""
        reply: Reply[InferenceResponse] = Reply()
        handle.statistics.admit(request, reply, arrival)
        if miss is not None:
            assert self.caching is not None
            reply.add_done_callback(functools.partial(self.caching.store, handle, request, *miss))
        return Infer(request, reply, arrival)

    @staticmethod
    def _stopped(handle: ModelHandle) -> TritonError:
        return unavailable(
            f"model '{handle.name}' version {handle.version} is not accepting requests"
        )

    def _not_ready(self, name: str, version: str) -> TritonError:
        if name not in self.known or name not in self.tried:
            return not_found(f"Request for unknown model: '{name}' is not found")
        if version:
            if int(version) in self.tried[name]:  # (a version loaded once, or tried)
                return unavailable(
                    f"Request for unknown model: '{name}' version {version} is not at ready state"
                )
            return not_found(f"Request for unknown model: '{name}' version {version} is not found")
        return not_found(f"Request for unknown model: '{name}' has no available versions")


def _after_storing(
    request: InferenceRequest, reply: Reply[InferenceResponse]
) -> Reply[InferenceResponse]:
    """`reply`, answered once a large answer's copy into the response cache is over (as `infer`
    waits for it), so that a twin sent after the answer hits: whoever answers through the
    reply (the engine's connection to a front end, a gRPC stream) need not know."""
    answered: Reply[InferenceResponse] = Reply()

    def forward(_: object = None) -> None:
        error = reply.error
        if error is not None:
            answered.fail(error)
        else:
            answered.set(reply.result())

    def over(_: Reply[InferenceResponse]) -> None:
        # The cache's `store` ran before this (it was added to `reply` first).
        storing: asyncio.Task[None] | None = request.context.get(STORING)
        if storing is None or storing.done():
            forward()
        else:
            storing.add_done_callback(forward)

    reply.add_done_callback(over)
    return answered


_INT64_MAX = 2**63 - 1


def parse_version(version: str) -> int:
    """A version asked for by its string, refused in Triton's words where Triton refuses it
    (a string its `stol` cannot read, or past int64: "details: stol"; a negative number).
    Stricter than Triton: a sign and digits only, where `stol` reads "5abc" or " 5" as 5."""
    digits = version[1:] if version[:1] in "+-" else version
    negative = version.startswith("-")
    if not digits.isdigit() or not digits.isascii() or int(digits) > _INT64_MAX + negative:
        raise invalid_arg(
            f"failed to get model version from specified version string '{version}' "
            "(details: stol), version should be an integral value > 0"
        )
    if negative and int(digits):
        raise invalid_arg(
            f"invalid model version specified '{version}' , version should be an integral value > 0"
        )
    return int(digits)


def _runs(config: ModelConfig, model: str) -> bool:
    """Whether `config` is an ensemble with a step that runs `model`."""
    scheduling = config.ensemble_scheduling
    return scheduling is not None and any(step.model_name == model for step in scheduling.step)


def _steps_serve(config: ModelConfig, shown: dict[str, dict[int, ModelHandle]]) -> bool:
    """Whether each step of the ensemble `config` finds the version it runs in `shown`."""
    assert config.ensemble_scheduling is not None
    for step in config.ensemble_scheduling.step:
        versions = shown.get(step.model_name)
        if not versions or (step.model_version > 0 and step.model_version not in versions):
            return False
    return True


def _step_version(version: int) -> str:
    # An ensemble step's model_version: -1 (or 0) is the highest ready one.
    return str(version) if version > 0 else ""
