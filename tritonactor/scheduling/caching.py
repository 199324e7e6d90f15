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
    rough_work,
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
        if reply.error is not None:
            return  # errors are never cached
        started = time.perf_counter_ns()
        response = reply.result()
        stored = functools.partial(self._insert, handle, key, generation, lookup_ns, started)
        if not self._serves(handle):
            stored(None)
            return
        work = rough_work(response)
        if offload.large(work):
            # Measured and packed from a snapshot: whoever answers the request may add to the
            # response's parameters meanwhile (a gRPC stream's final flag is not the model's).
            request.context[STORING] = self._start(
                self._store_off_loop(handle, _snapshot(response), work, stored)
            )
            return
        stored(self._pack_if_it_fits(handle, response))

    def _pack_if_it_fits(self, handle: ModelHandle, response: InferenceResponse) -> bytes | None:
        """`response`'s blob, or None when the cache cannot take it (too large: never copied,
        and logged as Triton logs it; an output not in host memory)."""
        measured = measure(response)
        if measured is None:
            return None
        if self.cache.refuses(measured.size):
            _log_refused(handle, measured.size, self.cache.size)
            return None
        return pack(response)

    async def _store_off_loop(
        self,
        handle: ModelHandle,
        response: InferenceResponse,
        work: int,
        stored: Callable[[bytes | None], None],
    ) -> None:
        try:
            blob = await offload.off_loop(
                functools.partial(self._pack_if_it_fits, handle, response), work
            )
        except Exception:  # the answer went out already: only the cache misses it
            log.exception("a response of model '%s' could not be cached", handle.name)
            blob = None
        stored(blob)

    def _insert(
        self,
        handle: ModelHandle,
        key: bytes,
        generation: int,
        lookup_ns: int,
        started: int,
        blob: bytes | None,
    ) -> None:
        """Store `blob` (None: a miss the cache could not take), and count the miss."""
        outcome = Inserted.REFUSED
        if blob is not None and self._serves(handle):  # again: a large copy took a while
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
