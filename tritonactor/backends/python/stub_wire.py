"""The stub's side of what travels to and from the server (see `wire` for the server's): an
execute message's requests as the model's `pb_utils.InferenceRequest`s, and what execute
returned, or a response sender sends, as the responses' wire form, checked as Triton's stub
checks it.

`Stub` inherits these conversions: they read the stub's state (its `pb_utils`, whether the
model is decoupled, the arenas its tensors travel through), declared on `WireConversions`.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

from tritonactor.backends.python import ipc
from tritonactor.backends.python._pb_tensors import TritonModelException, error_code_name

_FINAL = 1  # TRITONSERVER_RESPONSE_COMPLETE_FINAL
_RESCHEDULE = 2  # TRITONSERVER_REQUEST_RELEASE_RESCHEDULE


class ExecuteError(Exception):
    """A broken contract of execute() (what it returned): its message is the error, bare, as in
    Triton's stub."""


class WireConversions:
    """An execute message into the model's requests; its responses into messages."""

    # The stub's state they read: set by `Stub.__init__` (`decoupled` by the init message).
    pb: Any
    decoupled: bool
    name: str
    shm_prefix: str
    _inputs_arena: ipc.ArenaReader
    _results_arena: ipc.Arena
    _inline_limit: int

    def _requests_from_wire(self, message: dict[str, Any]) -> list[Any]:
        pb = self.pb
        arrays = iter(ipc.read_tensors(message["shm"], message["descriptors"], self._inputs_arena))
        requests = []
        wrap = pb.Tensor._wrap
        for entry in message["requests"]:
            key = entry["key"]
            count = entry["inputs"]
            taken = list(itertools.islice(arrays, count))
            if len(taken) != count:
                raise RuntimeError(
                    f"the server sent {len(taken)} of a request's {count} input tensors"
                )
            inputs = [wrap(name, array) for name, _, array in taken]
            sender = pb.ResponseSender(key, self.decoupled, frozenset(entry["outputs"]))
            trace = pb.InferenceTrace(entry["trace"], key)
            requests.append(pb.InferenceRequest._received(entry, inputs, sender, trace))
        return requests

    def _responses_to_wire(self, seq: int, requests: list[Any], returned: Any) -> dict[str, Any]:
        """Check what execute returned as Triton's stub does, then the responses' wire form
        (None: every request answers through its response sender)."""
        reply: dict[str, Any] = {"op": "result", "seq": seq, "shm": None, "error": None}
        if self.decoupled:
            if returned is not None:
                raise ExecuteError(
                    f"Python model '{self.name}' is using the decoupled mode and the execute "
                    "function must return None."
                )
            return {**reply, "responses": None}
        if returned is None:
            return {**reply, "responses": [None] * len(requests)}
        if not isinstance(returned, list):  # (a tuple too is refused, as Triton's stub does)
            raise ExecuteError(
                f"Expected a list in the execute return, found type '{type(returned)}'."
            )
        if len(returned) != len(requests):
            raise ExecuteError(
                "Number of InferenceResponse objects do not match the number of "
                f"InferenceRequest objects. InferenceRequest(s) size is:{len(requests)}, and "
                f"InferenceResponse(s) size is:{len(returned)}\n"
            )
        for request, response in zip(requests, returned, strict=True):
            if response is None:
                continue
            if request._release_flags & _RESCHEDULE:
                raise ExecuteError(
                    "Expected a None object in the execute function return list for "
                    f"reschduled request, found type '{type(response)}'."
                )
            if not isinstance(response, self.pb.InferenceResponse):
                raise ExecuteError(
                    "Expected an 'InferenceResponse' object in the execute function return "
                    f"list, found type '{type(response)}'."
                )
            # A returned response is the request's final one: a sender that already answered
            # refuses it, as Triton's does (in its words alone: no exception's name before them).
            try:
                request._sender._account(True, _FINAL)
            except TritonModelException as exc:
                raise ExecuteError(str(exc)) from None
        tensors: list[tuple[str, Any]] = []
        wire: list[dict[str, Any] | None] = []
        for request, response in zip(requests, returned, strict=True):
            if response is None:
                wire.append(None)
                continue
            entry, arrays = self._response_entry(response, request._sender._requested)
            tensors.extend(arrays)
            wire.append(entry)
        shm, descriptors = ipc.write_tensors(
            self.shm_prefix, tensors, self._results_arena, self._inline_limit
        )
        return {**reply, "shm": shm, "descriptors": descriptors, "responses": wire}

    def _response_entry(
        self, response: Any, requested: frozenset[str]
    ) -> tuple[dict[str, Any], list[tuple[str, Any]]]:
        # (pb_utils' own attributes, not its accessors: a few calls fewer a response.)
        error = response._error
        arrays = [
            (t._name, t._array) for t in response._outputs if not requested or t._name in requested
        ]
        parameters = response._parameters
        entry = {
            "outputs": len(arrays),
            "error": None if error is None else (error_code_name(error.code()), error.message()),
            "parameters": json.loads(parameters) if parameters != "{}" else {},
        }
        return entry, arrays

    def _released(self, requests: list[Any]) -> dict[int, int]:
        """The requests released with RESCHEDULE: the server runs them again, as new requests of
        a later execute; these objects are done."""
        released = {}
        for request in requests:
            if request._release_flags & _RESCHEDULE:
                released[request._key] = request._release_flags
                request._sender._close()
        return released
