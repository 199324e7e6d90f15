"""How a waiting request of the sequence batcher becomes a row of a batch: the client's inputs,
the row's control inputs and the sequence's implicit state (kept from the model's answer); and
the null request that fills an empty slot of a direct batch."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

from tritonactor.actors import Reply
from tritonactor.core.errors import TritonError
from tritonactor.core.types import (
    OUTPUT_BUFFERS,
    InferenceRequest,
    InferenceResponse,
    RequestedOutput,
)
from tritonactor.scheduling.messages import Infer
from tritonactor.scheduling.sequence_controls import NULL_ROW, Control, Row
from tritonactor.scheduling.sequence_slots import RunningSequence, Waiting, zeros_like
from tritonactor.scheduling.sequence_state import StateSpec, requested_outputs, take_states

__all__ = ["NULL_REQUEST", "STATE_ERROR", "RowBuilder"]

# Set in the context of the requests that fill an empty slot of a direct batch: they answer
# nobody, and statistics should not count them.
NULL_REQUEST = "sequence_null_request"
# Set on a request whose response the batcher refused (no state output): its execute failed,
# though the instance saw a response.
STATE_ERROR = "sequence_state_error"


class RowBuilder:
    """Builds the rows of one model's batches."""

    def __init__(
        self,
        name: str,
        controls: list[Control],
        states: tuple[StateSpec, ...],
        config_outputs: tuple[str, ...],
        row_shape: tuple[int, ...],
    ) -> None:
        self.name = name
        self.controls = controls
        self.control_names = {control.name for control in controls}
        self.states = states
        self.config_outputs = config_outputs
        # Of each control tensor: one value per row, with the batch dimension when batching.
        self.row_shape = row_shape

    def prepared(self, entry: Waiting) -> Infer:
        """The request as the model sees it: its inputs, its row's controls, and its states."""
        request = entry.item.request
        sequence = entry.sequence
        row = Row(entry.start, entry.end, True, sequence.correlation_id)
        # Built from the client's tensors each time: a batch that could not be sent is built
        # again later without doubling them.
        request.inputs = [*entry.inputs, *row.tensors(self.controls, self.row_shape)]
        if not self.states:
            return entry.item
        # A state is kept from the model's output: never a view of a client's memory (an
        # output due in shared memory and written there in place), which the client reuses.
        request.context.pop(OUTPUT_BUFFERS, None)
        if entry.start:
            sequence.saved = None  # a (re)start begins from the initial state
        saved = sequence.saved or {}
        for spec in self.states:
            state = saved.get(spec.input_name)
            request.inputs.append(spec.initial_tensor() if state is None else state)
        request.outputs, hidden = requested_outputs(self.states, entry.outputs, self.config_outputs)
        inner: Reply[InferenceResponse] = Reply()
        inner.add_done_callback(
            partial(self._answered, request, entry.item.reply, sequence, hidden)
        )
        return replace(entry.item, reply=inner)

    def _answered(
        self,
        request: InferenceRequest,
        outer: Reply[InferenceResponse],
        sequence: RunningSequence,
        hidden: frozenset[str],
        inner: Reply[InferenceResponse],
    ) -> None:
        """Keep the state the model output, then answer the client. Runs on the event loop when
        the instance answers, before it reports idle: the sequence's next request, which only
        that instance runs, is built after this."""
        try:
            response = inner.result()
        except BaseException as error:
            outer.fail(error)
            return
        try:
            response, saved = take_states(self.name, self.states, response, hidden, sequence.saved)
        except TritonError as error:
            # Seen by the statistics, which account for the execute after this answer.
            request.context[STATE_ERROR] = error
            outer.fail(error)
            return
        if sequence.lane is not None:  # not ended or released meanwhile
            sequence.saved = saved
        outer.set(response)

    def null(self, like: InferenceRequest) -> Infer:
        """A request for an empty slot: zeros of the shapes of `like` (a real request of the
        batch, states included), not ready; its answer goes nowhere."""
        inputs = [zeros_like(t) for t in like.inputs if t.name not in self.control_names]
        inputs += NULL_ROW.tensors(self.controls, self.row_shape)
        request = InferenceRequest(
            model_name=like.model_name,
            model_version=like.model_version,
            inputs=inputs,
            outputs=[RequestedOutput(output.name) for output in like.outputs],
            resolved_version=like.resolved_version,
            context={NULL_REQUEST: True},
        )
        return Infer(request, Reply())
