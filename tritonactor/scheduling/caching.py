"""The router's side of the response cache (`cache/` holds the cache itself): a request to a
version whose config asks for it is looked up after validation; a hit is answered at once,
never reaching the scheduler; a miss goes on, and its successful answer is stored if the copy
that answered still serves its version (docs/response-cache.md). Large keys, copies and hits
are worked out off the event loop (`core/offload.py`)."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from tritonactor.actors import Reply
from tritonactor.cache import (
    Inserted,
    ResponseCache,
    caches_responses,
    measure,
    pack,
    request_key,
    unpack,
)
from tritonactor.cache.key import content_digest, key_work
from tritonactor.core import offload
from tritonactor.core.errors import cancelled
from tritonactor.core.types import InferenceRequest, InferenceResponse
from tritonactor.scheduling.handle import ModelHandle

log = logging.getLogger(__name__)

# request.context key of a large answer's insertion into the response cache, under way on a
# worker thread (an asyncio task): `Router.infer` waits for it, so a twin sent after the answer
# hits.
STORING = "response_cache.storing"


class ResponseCaching:
    """Looks requests up in `cache` and stores the answers of those it missed; `serving` tells
    which handle serves a version now (the router's table)."""

    def __init__(
        self, cache: ResponseCache, serving: Callable[[str, int], ModelHandle | None]
    ) -> None:
        self.cache = cache
        self._serving = serving
        # The work running off the event loop (asyncio keeps only weak references to tasks).
        self._tasks: set[asyncio.Task[Any]] = set()

    async def prepare(self, handle: ModelHandle, request: InferenceRequest) -> None:
        """Work out the key of a large request to a version that caches off the event loop
        (what `look_up` would do on it)."""
        if self.caches(handle):
            work = key_work(request)
            if offload.large(work):
                await offload.off_loop(lambda: content_digest(request), work)

    def caches(self, handle: ModelHandle) -> bool:
        """Whether requests to `handle` go through the cache."""
        return not handle.decoupled and caches_responses(handle.config)

    def look_up(
        self, handle: ModelHandle, request: InferenceRequest, arrival: int
    ) -> tuple[tuple[bytes, int, int] | None, Reply[InferenceResponse] | None]:
        """((key, lookup ns, the owner's generation), None) for a request the cache missed,
        (None, answer) for a hit, (None, None) when the cache has no part in it (not asked for
        by the config, decoupled, or an input that cannot be hashed: not in host memory, as in
        Triton)."""
        cache = self.cache
        if not self.caches(handle):
            return None, None
        key = request_key(handle.name, handle.version, request)
        if key is None:
            return None, None
        generation = cache.generation((handle.name, handle.version))
        started = time.perf_counter_ns()
        blob = cache.lookup(key)
        ended = time.perf_counter_ns()
        if blob is None:
            return (key, ended - started, generation), None
        handle.statistics.record_cache_hit(arrival, started, ended, time.perf_counter_ns())
        answer = functools.partial(unpack, blob, handle.name, str(handle.version), request.id)
        answered: Reply[InferenceResponse] = Reply()
        if offload.large(len(blob)):
            self._start(offload.off_loop(answer, len(blob))).add_done_callback(
                functools.partial(_settle, answered)
            )
        else:
            answered.set(answer())
        return None, answered

    def store(
        self,
        handle: ModelHandle,
        request: InferenceRequest,
        key: bytes,
        lookup_ns: int,
        generation: int,
        reply: Reply[InferenceResponse],
    ) -> None:
        """A request the cache missed has its answer: store it if it succeeded and the copy that
        answered still serves its version. A response that can never fit is not copied; a
        large one is copied off the event loop. As in Triton, a request whose twin was stored
        while it ran counts neither as a hit nor as a miss."""
        cache = self.cache
        if reply.error is not None:
            return  # errors are never cached
        started = time.perf_counter_ns()
        response = reply.result()
        measured = measure(response) if self._serves(handle) else None
        if measured is None or cache.refuses(measured.size):
            if measured is not None:
                _log_refused(handle, measured.size, cache.size)
            handle.statistics.record_cache_miss(lookup_ns + time.perf_counter_ns() - started)
            return
        stored = functools.partial(self._insert, handle, key, generation, lookup_ns, started)
        if offload.large(measured.work):
            # Packed from a snapshot: whoever answers the request may add to the response's
            # parameters meanwhile (a gRPC stream's final flag is not the model's answer).
            request.context[STORING] = self._start(
                self._store_off_loop(
                    handle, lookup_ns, started, _snapshot(response), measured.work, stored
                )
            )
            return
        stored(pack(response))

    async def _store_off_loop(
        self,
        handle: ModelHandle,
        lookup_ns: int,
        started: int,
        response: InferenceResponse,
        work: int,
        stored: Callable[[bytes], None],
    ) -> None:
        try:
            blob = await offload.off_loop(functools.partial(pack, response), work)
        except Exception:  # the answer went out already: only the cache misses it
            log.exception("a response of model '%s' could not be cached", handle.name)
            handle.statistics.record_cache_miss(lookup_ns + time.perf_counter_ns() - started)
            return
        stored(blob)

    def _insert(
        self,
        handle: ModelHandle,
        key: bytes,
        generation: int,
        lookup_ns: int,
        started: int,
        blob: bytes,
    ) -> None:
        outcome = Inserted.REFUSED
        if self._serves(handle):  # checked again: a large copy took a while
            owner = (handle.name, handle.version)
            outcome = self.cache.insert(key, owner, blob, generation)
            if outcome is Inserted.REFUSED:
                _log_refused(handle, len(blob), self.cache.size)
        if outcome is not Inserted.EXISTS:
            handle.statistics.record_cache_miss(lookup_ns + time.perf_counter_ns() - started)

    def _serves(self, handle: ModelHandle) -> bool:
        return self._serving(handle.name, handle.version) is handle

    def _start(self, work: Awaitable[Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task


def _snapshot(response: InferenceResponse) -> InferenceResponse:
    """What `pack` reads of `response`, apart from the arrays (never written once answered)."""
    return dataclasses.replace(
        response,
        parameters=dict(response.parameters),
        outputs=[
            dataclasses.replace(tensor, parameters=dict(tensor.parameters))
            for tensor in response.outputs
        ],
    )


def _log_refused(handle: ModelHandle, size: int, cache_size: int) -> None:
    # Triton logs its failed insertions too ("Failed to insert key").
    log.warning(
        "Failed to insert key into response cache: a response of model '%s' version %d takes "
        "%d bytes, more than the %d-byte cache has room for",
        handle.name,
        handle.version,
        size,
        cache_size,
    )


def _settle(answered: Reply[InferenceResponse], task: asyncio.Task[InferenceResponse]) -> None:
    if task.cancelled():
        answered.fail(cancelled("reading an answer out of the response cache was cancelled"))
    elif (error := task.exception()) is not None:
        answered.fail(error)
    else:
        answered.set(task.result())
