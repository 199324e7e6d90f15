"""The requests a python instance holds: from the execute that hands them to the stub until
their last answer. A decoupled request answers through its own `ResponseSender` (any number of
responses, until its final flag); any other request has exactly one answer, which its execute
returns, or which the model sends through its response sender, during execute or after it
returned. In the latter case the instance gives the request's result as a `Deferred` and
resolves it when the response comes, so that the instance is free for its next batch meanwhile.

Every method may be called from the instance's reader (on the event loop, or on a thread of
its own where none runs), from the event loop, or from the thread that notes the process's
death: the state is behind one lock, and senders and deferreds are called outside it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from dataclasses import dataclass
from typing import Any

from tritonactor.backends.base import Deferred
from tritonactor.core.errors import TritonError, internal
from tritonactor.core.types import InferenceRequest, InferenceResponse, ResponseSender

log = logging.getLogger(__name__)


@dataclass(eq=False, slots=True)
class _Held:
    request: InferenceRequest
    # A decoupled request's sender (its answers go there, as they come).
    sender: ResponseSender | None
    # Any other request: the one answer the model sent through its response sender...
    answer: InferenceResponse | TritonError | None = None
    # ...and, once execute returned without it, what the instance actor waits on.
    deferred: Deferred | None = None


class HeldRequests:
    def __init__(self, model_name: str) -> None:
        self._model_name = model_name
        self._lock = threading.Lock()
        self._held: dict[int, _Held] = {}

    def hold(self, key: int, request: InferenceRequest) -> None:
        """`request` goes to the stub as `key`."""
        with self._lock:
            self._held[key] = _Held(request, request.sender)

    def request(self, key: int | None) -> InferenceRequest | None:
        if key is None:
            return None
        with self._lock:
            entry = self._held.get(key)
        return None if entry is None else entry.request

    def holds_up(self, key: int) -> bool:
        """Whether a response for `key` may wait for room when sent from a thread (its
        sender's back-pressure: `ResponseSender.holds_up`)."""
        with self._lock:
            entry = self._held.get(key)
        return entry is not None and entry.sender is not None and entry.sender.holds_up()

    def is_cancelled(self, key: int) -> bool:
        """Whether the server marked the request behind `key` cancelled; a request the instance
        no longer holds reads as not cancelled."""
        with self._lock:
            entry = self._held.get(key)
        if entry is None:
            return False
        return entry.request.cancelled or (entry.sender is not None and entry.sender.is_cancelled())

    # -- what the stub sends (the instance's reader) -----------------------------------------

    def deliver(
        self, key: int, result: InferenceResponse | TritonError | None, final: bool
    ) -> None:
        """A response (or a bare final flag) the model sent through a response sender. The stub
        has already checked Triton's rules (one response for a non-decoupled model; nothing
        after the final flag)."""
        deferred: Deferred | None = None
        with self._lock:
            entry = self._held.get(key)
            if entry is None:
                pass
            elif entry.sender is not None:
                if final:
                    del self._held[key]
            elif result is not None and entry.answer is None:
                entry.answer = result
                deferred = entry.deferred
                if deferred is not None:
                    del self._held[key]
            else:
                return  # the final flag after the one response: nothing more to say
        if entry is None:
            if result is not None:
                log.debug(
                    "model '%s': a response for a request it no longer holds", self._model_name
                )
            return
        if entry.sender is not None:
            response = result if isinstance(result, InferenceResponse) else None
            error = result if isinstance(result, TritonError) else None
            try:
                entry.sender.send(response, error=error, final=final)
            except RuntimeError as exc:
                log.warning("model '%s': %s", self._model_name, exc)
        elif deferred is not None and result is not None:
            deferred.resolve(result)

    def dropped(self, key: int) -> None:
        """The model let go of the request's response sender without finishing the request: it
        fails, rather than its client waiting forever."""
        error = internal(
            f"model '{self._model_name}' released a request without finishing it: its response "
            "sender was no longer referenced before the final response was sent"
        )
        self.fail([key], error)

    # -- when execute returns (the event loop) -----------------------------------------------

    def returned(self, key: int) -> InferenceResponse | TritonError | Deferred | None:
        """Execute returned no response for the request: None for a decoupled one (its sender
        goes on), else its answer if the model already sent it, or a Deferred for it."""
        with self._lock:
            entry = self._held.get(key)
            if entry is None or entry.sender is not None:
                return None  # decoupled: finished already, or its sender goes on
            if entry.answer is not None:
                del self._held[key]
                return entry.answer
            entry.deferred = Deferred()
            return entry.deferred

    def release(self, key: int) -> InferenceRequest | None:
        """The instance is done with `key` (answered by execute's return, or rescheduled)."""
        with self._lock:
            entry = self._held.pop(key, None)
        return None if entry is None else entry.request

    def failed(self, key: int, error: TritonError) -> InferenceResponse | TritonError:
        """The request's execute failed: its result. A request the model already answered
        keeps that answer; a decoupled one fails, as Triton counts it (whoever streams its
        responses ends it with the error unless it already ended: `end_if_failed`)."""
        with self._lock:
            entry = self._held.pop(key, None)
        if entry is None or entry.sender is not None:
            return error
        return entry.answer if entry.answer is not None else error

    def fail(self, keys: Any, error: TritonError) -> None:
        """End the held requests among `keys` with `error`: a decoupled one through its sender,
        a deferred one by resolving it, one whose execute has not returned yet when it does."""
        ended: list[_Held] = []
        with self._lock:
            for key in list(keys):
                entry = self._held.get(key)
                if entry is None:
                    continue
                if entry.sender is None and entry.deferred is None:
                    # Its execute has not been seen to return yet: this is what it returns.
                    if entry.answer is None:
                        entry.answer = error
                    continue
                del self._held[key]
                ended.append(entry)
        for entry in ended:
            if entry.sender is not None:
                if not entry.sender.finished:
                    with contextlib.suppress(RuntimeError):
                        entry.sender.send(None, error=error, final=True)
            elif entry.deferred is not None:
                entry.deferred.resolve(error)

    def fail_all(self, error: TritonError, keep: set[int] | None = None) -> None:
        with self._lock:
            keys = [key for key in self._held if keep is None or key not in keep]
        self.fail(keys, error)
