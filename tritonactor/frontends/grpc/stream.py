"""The answers of one `ModelStreamInfer` call: its requests in the server (at most a window of
them at once), each answer as it comes (decoupled models: each response), and Triton's two error
modes: a failed request's error as a message in the stream (the default), or, with metadata
`triton_grpc_error: true`, the first error of a model ending the stream with its status."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.to_thread
import grpclib.server
from h2.exceptions import StreamClosedError

from tritonactor._proto_c.grpc_service_pb2 import ModelInferResponse
from tritonactor.actors import ActorStopped, Reply
from tritonactor.actors.mailbox import Mailbox, MailboxClosed
from tritonactor.core.errors import TritonError, internal, unavailable
from tritonactor.core.types import InferenceRequest, InferenceResponse
from tritonactor.frontends.grpc.codec import ENABLE_EMPTY_FINAL, encode_infer_response
from tritonactor.frontends.grpc.status import grpc_error
from tritonactor.frontends.grpc.wire import InferResponseMessage, StreamInferResponse
from tritonactor.memory import lease as shared_memory
from tritonactor.scheduling.caching import STORING

log = logging.getLogger(__name__)

# Requests one stream may have in the server at once (see Pending).
STREAM_WINDOW = 128
FINAL_RESPONSE = "triton_final_response"
GRPC_ERROR_MODE = "triton_grpc_error"


async def write_answers(
    stream: grpclib.server.Stream[Any, StreamInferResponse],
    answers: Mailbox[Answer],
    error_ends_stream: bool,
    pending: Pending | None = None,
    reading: anyio.CancelScope | None = None,
) -> None:
    """Send each answer as it comes; in "triton_grpc_error" mode the first error of a model
    ends the stream with its status (raised as a GRPCError). When the answers end because the
    server drains (`pending`), the `reading` of further requests stops too."""
    try:
        async for answer in answers:
            if isinstance(answer, StreamError):
                if error_ends_stream and answer.from_model:
                    raise grpc_error(answer.error)
                answer = answer.response
            try:
                await stream.send_message(answer)
            except StreamClosedError:
                # The client reset the stream (it cancelled the call): nothing more can be
                # sent, and grpclib is cancelling the call's handler. Raised on, it would end
                # that cancellation with an error of its own ("Failed to handle cancellation").
                return
    finally:
        answers.leave()  # answers delivered from now on find nobody to write them
    if pending is not None and reading is not None and pending.ended_by_drain:
        reading.cancel()


class Pending:
    """A stream's requests in the server. At most `window` run at once: beyond that the stream
    stops reading, and HTTP/2 flow control slows the client down, rather than the requests
    overflowing the scheduler's mailbox. Closes the response stream after the last answer once
    the client has finished sending.

    As Triton's, the one answer of a request (to a model that is not decoupled, or a refusal)
    goes out in the order the requests came (each has a ticket, its place): one that is ready
    waits for those before it. Its request leaves the window once answered, so the stream goes
    on reading behind a slow one (a sequence's later requests may be what lets it run). A
    decoupled model's responses go out as they come, and its request holds no place (`skip`)."""

    def __init__(self, answers: Mailbox[Answer], window: int):
        self._answers = answers
        self._slots = anyio.Semaphore(window)
        self._running = 0
        self._input_done = False
        self.draining = False
        # The stream's requests submitted and not yet finished, by id().
        self.requests: dict[int, InferenceRequest] = {}
        self._tickets = 0  # the next request's place
        self._written = 0  # the place whose answer goes out next
        self._held: dict[int, Answer | None] = {}  # answers waiting for those before them

    async def start(self) -> int:
        """Wait for room for one more request, and give it its place in the stream; it then
        counts as running until its answer is delivered with `finished=True`."""
        try:
            self._slots.acquire_nowait()  # the common case skips the checkpoint acquire makes
        except anyio.WouldBlock:
            await self._slots.acquire()
        self._running += 1
        ticket = self._tickets
        self._tickets += 1
        return ticket

    def deliver(
        self,
        response: Answer | None,
        finished: bool = False,
        request: InferenceRequest | None = None,
        ticket: int | None = None,
    ) -> None:
        """Send `response` (None: nothing to send); `finished` ends its request. With its
        `ticket`, the request's one answer, sent in the stream's order."""
        if finished and request is not None:
            self.requests.pop(id(request), None)
        if ticket is not None:
            self._held[ticket] = response
            self._running -= 1  # (its answer, held, keeps `_maybe_close` off: see `_flush`)
            self._slots.release()
            self._flush()
            return
        # Called from the actor that answered: it must never raise there.
        # A closed stream means the client went away: nobody is left to read the answer.
        if response is not None:
            with contextlib.suppress(MailboxClosed):
                self._answers.put_nowait(response)
        if finished:
            self._running -= 1
            self._slots.release()
            self._maybe_close()

    def skip(self, ticket: int) -> None:
        """The request of `ticket` is a decoupled model's: its answers take no place."""
        self._held[ticket] = _NO_PLACE
        self._flush()

    def _flush(self) -> None:
        """Write the answers whose turn has come. Once no request runs, every place has its
        answer (or is skipped), so none is left held when `_maybe_close` closes."""
        held = self._held
        while self._written in held:
            answer = held.pop(self._written)
            self._written += 1
            if answer is not None and answer is not _NO_PLACE:
                with contextlib.suppress(MailboxClosed):
                    self._answers.put_nowait(answer)
        self._maybe_close()

    def cancel_all(self) -> None:
        for request in list(self.requests.values()):
            request.cancel()
        self.requests.clear()

    def input_done(self) -> None:
        self._input_done = True
        self._maybe_close()

    def drain(self) -> None:
        """The server is shutting down (frontends/drain.py): requests read from now on are
        refused, and the answers end once the running ones are delivered."""
        self.draining = True
        self._maybe_close()

    @property
    def ended_by_drain(self) -> bool:
        """The answers ended because the server drains, not because the client finished."""
        return self.draining and not self._input_done

    def _maybe_close(self) -> None:
        if (self._input_done or self.draining) and self._running == 0:
            self._answers.close()


def decoupled_answer(
    request: InferenceRequest,
    pending: Pending,
    response: InferenceResponse | None,
    error: TritonError | None,
    final: bool,
) -> None:
    """A decoupled model's `sender.send`: each response as it comes, then the final flag (an
    empty final response only when the client asked for one)."""
    flagged = request.context.get(ENABLE_EMPTY_FINAL) is True
    answer: Answer | None = None
    failure: BaseException | None = error
    try:
        if error is not None:
            answer = _failure(request, error, final)
        elif response is not None:
            written = shared_memory.write_outputs(request, response)
            encoded = encode_infer_response(response, in_shared_memory=written, request=request)
            _mark(encoded.message, final)
            answer = StreamInferResponse(infer_response=encoded).freeze()
        elif final and flagged:
            message = ModelInferResponse(model_name=request.model_name, id=request.id)
            _mark(message, True)
            answer = StreamInferResponse(infer_response=InferResponseMessage(message, []))
    except TritonError as writing:  # an output larger than its shared-memory region
        answer = model_error(request, writing, final)
        failure = writing
    except Exception as encoding:
        log.exception("a response of model '%s' could not be encoded", request.model_name)
        text = f"internal error: {type(encoding).__name__}: {encoding}"
        answer = model_error(request, internal(text), final)
        failure = encoding
    if final:
        shared_memory.release(request)
    if final and request.trace is not None:
        request.trace.end(failure)
    pending.deliver(answer, finished=final, request=request)


def decoupled_done(
    request: InferenceRequest, pending: Pending, reply: Reply[InferenceResponse]
) -> None:
    """Execute is over. If it failed before the model sent its final response, that failure
    is the request's last answer."""
    if request.sender is not None:
        request.sender.end_if_failed(reply.result)


@dataclass(frozen=True, slots=True)
class StreamError:
    """A request of the stream failed: by default an error message in the stream (`response`),
    in "triton_grpc_error" mode, if it reached its model (`from_model`), the status that ends
    the stream."""

    error: TritonError
    response: StreamInferResponse
    from_model: bool = True


# What a stream's writer sends: a response, or a failure it turns into one (or into the end).
Answer = StreamInferResponse | StreamError
# A place in a stream's order that a decoupled request leaves to the others (`Pending.skip`).
_NO_PLACE: Any = object()


def refusal(request_id: str, error: TritonError) -> StreamError:
    """`error` as the answer of request `request_id`, refused before it reached its model: an
    error message in the stream in both modes, as in Triton 2.51, with the request's id (so that
    the client can tell which request failed) and nothing else."""
    message = InferResponseMessage(ModelInferResponse(id=request_id), [])
    return StreamError(error, StreamInferResponse(error.message, message), from_model=False)


def model_error(request: InferenceRequest, error: TritonError, final: bool) -> StreamError:
    """`error` as an answer of `request` once it reached its model: as Triton does for a failed
    response, the request's id, model name and version (as the client gave them) and whether it
    is the last answer ride along."""
    message = ModelInferResponse(
        id=request.id, model_name=request.model_name, model_version=request.model_version
    )
    _mark(message, final)
    answer = StreamInferResponse(error.message, InferResponseMessage(message, []))
    return StreamError(error, answer, from_model=True)


def _failure(request: InferenceRequest, error: TritonError, final: bool) -> StreamError:
    """A request's failure as its stream answers it: a scheduler's refusal as it arrived as
    one before its model (Triton's scheduler gives it back unrun), anything else as the
    model's."""
    return refusal(request.id, error) if error.refused else model_error(request, error, final)


def text_metadata(metadata: Any) -> list[tuple[str, str]]:
    """The call's metadata entries with text values (binary "-bin" ones are left out)."""
    return [(key, value) for key, value in metadata.items() if isinstance(value, str)]


def metadata_flag(metadata: Any, key: str) -> bool:
    """Whether the call's metadata sets `key` to exactly "true", as Triton reads it (grpclib
    gives a multidict of str)."""
    if metadata is None:
        return False
    return metadata.get(key) == "true"


# Tasks writing large outputs into shared memory (kept referenced until they are done).
_writing: set[asyncio.Task[None]] = set()


def streamed_answer(
    request: InferenceRequest, pending: Pending, ticket: int, reply: Reply[InferenceResponse]
) -> None:
    """Runs as a done callback inside the actor that answered: whatever happens here becomes
    an answer on the stream, never an exception in that actor. Large shared-memory outputs are
    written on a worker thread (a task then sends the answer), not in that actor."""
    storing: asyncio.Task[None] | None = request.context.get(STORING)
    if storing is not None and not storing.done():
        # A large answer on its way into the response cache goes out once it is in, so that a
        # twin sent when it arrives hits (as `Router.infer` waits for it).
        storing.add_done_callback(lambda _: streamed_answer(request, pending, ticket, reply))
        return
    lease = request.context.get(shared_memory.LEASE)
    if reply.error is None and lease is not None and lease.large(reply.result()):
        task = asyncio.get_running_loop().create_task(
            _answer_off_loop(request, pending, ticket, reply)
        )
        _writing.add(task)
        task.add_done_callback(_writing.discard)
        return
    _answer(request, pending, ticket, reply, shared_memory.write_outputs)


async def _answer_off_loop(
    request: InferenceRequest, pending: Pending, ticket: int, reply: Reply[InferenceResponse]
) -> None:
    try:
        written = await anyio.to_thread.run_sync(
            shared_memory.write_outputs, request, reply.result()
        )
    except Exception as error:
        failed = error

        def write(request: InferenceRequest, response: InferenceResponse) -> frozenset[str]:
            raise failed

    else:

        def write(request: InferenceRequest, response: InferenceResponse) -> frozenset[str]:
            return written

    _answer(request, pending, ticket, reply, write)


def _mark(message: ModelInferResponse, final: bool) -> None:
    """Mark `message` with whether it is its request's last answer, as Triton marks every
    stream answer (on the message: the response itself may be shared, e.g. by the response
    cache)."""
    message.parameters[FINAL_RESPONSE].bool_param = final


def _answer(
    request: InferenceRequest,
    pending: Pending,
    ticket: int,
    reply: Reply[InferenceResponse],
    write: Callable[[InferenceRequest, InferenceResponse], frozenset[str]],
) -> None:
    failure: BaseException | None = None
    answer: Answer | None = None
    try:
        response = reply.result()
        written = write(request, response)
        encoded = encode_infer_response(response, in_shared_memory=written, request=request)
        _mark(encoded.message, True)  # the one response is the last
        answer = StreamInferResponse(infer_response=encoded).freeze()
    except TritonError as error:
        failure = error
        answer = _failure(request, error, True)
    except ActorStopped as error:
        failure = error
        message = f"model '{request.model_name}' stopped before answering"
        answer = model_error(request, unavailable(message), True)
    except Exception as error:
        failure = error
        log.exception("streamed request for model '%s' failed", request.model_name)
        text = f"internal error: {type(error).__name__}: {error}"
        answer = model_error(request, internal(text), True)
    finally:
        try:
            shared_memory.release(request)
            if request.trace is not None:
                request.trace.end(failure)
        finally:  # whatever happens, its place in the stream's order is filled
            if answer is None:  # (something above failed unexpectedly)
                answer = model_error(request, internal("the answer could not be made"), True)
            pending.deliver(answer, finished=True, request=request, ticket=ticket)
