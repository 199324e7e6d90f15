"""Response senders, driven through `PythonInstance` with real stub processes: a model that is
not decoupled answering through its sender (during execute or after it returned: a Deferred),
decoupled models answering after execute returned, Triton's checks on what execute returns,
concurrent `async def execute`, rescheduling, error codes, argv, requested outputs."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import anyio
import numpy as np
import pytest

from tests.python_backend_support import (
    PATIENCE_S,
    Started,
    context,
    decoupled,
    int32,
    outputs,
    request,
    tensor,
    text,
)
from tritonactor.actors import Reply
from tritonactor.backends.base import RESCHEDULE, Deferred
from tritonactor.backends.python import PythonBackend
from tritonactor.core.errors import ErrorCode, TritonError
from tritonactor.core.types import InferenceResponse, RequestedOutput


@pytest.fixture(params=["inline", "files"])
def start_both(
    request: pytest.FixtureRequest, backend: PythonBackend, arena_backend: PythonBackend
) -> Iterator[Started]:
    """`start` twice: small tensors inside the messages, as served, then every tensor of a
    response sender's, or of a BLS call's either way, through a shared-memory file of its own
    (the inline limit 0)."""
    started = Started(arena_backend if request.param == "files" else backend)
    yield started
    started.finalize_all()


def late(mode: str, value: int = 0, model: str = "late_answer"):  # type: ignore[no-untyped-def]
    return request(model, text("MODE", mode), int32("VALUE", value))


async def resolved(deferred: object) -> InferenceResponse | TritonError:
    """Wait (without blocking the loop) for the backend to resolve a Deferred."""
    assert isinstance(deferred, Deferred), deferred
    done = anyio.Event()
    answer: list[InferenceResponse | TritonError] = []
    token_loop = asyncio.get_running_loop()

    def on_resolved(result: InferenceResponse | TritonError) -> None:
        answer.append(result)
        token_loop.call_soon_threadsafe(done.set)

    deferred.on_resolved(on_resolved)
    with anyio.fail_after(PATIENCE_S):
        await done.wait()
    return answer[0]


# -- not decoupled, answering through the response sender -------------------------------------


@pytest.mark.anyio
async def test_answer_sent_during_execute_is_the_result(start: Started) -> None:
    instance = start("late_answer")
    [result] = await instance.execute([late("before", 7)])
    assert outputs(result)["OUT"].tolist() == [7]


@pytest.mark.anyio
async def test_answer_sent_after_execute_returned_arrives_later(start: Started) -> None:
    """The parked request's execute returns a Deferred, the instance runs the next batch
    meanwhile (the release request), and the parked answer then resolves it."""
    instance = start("late_answer")
    [parked] = await instance.execute([late("park", 1)])
    assert isinstance(parked, Deferred) and not parked.resolved
    [released] = await instance.execute([late("release", 2)])
    assert outputs(released)["OUT"].tolist() == [2]
    assert outputs(await resolved(parked))["OUT"].tolist() == [1]


@pytest.mark.anyio
async def test_async_execute_answers_from_a_task_after_it_returned(start: Started) -> None:
    instance = start("late_answer_async")
    [parked] = await instance.execute([late("park", 3, "late_answer_async")])
    assert isinstance(parked, Deferred)
    [released] = await instance.execute([late("release", 4, "late_answer_async")])
    assert outputs(released)["OUT"].tolist() == [4]
    assert outputs(await resolved(parked))["OUT"].tolist() == [3]


@pytest.mark.anyio
async def test_second_response_is_refused_but_the_first_stands(start: Started) -> None:
    instance = start("late_answer")
    twice, other = late("twice", 5), late("return", 6)
    results = await instance.execute([twice, other])
    assert outputs(results[0])["OUT"].tolist() == [5]
    # The model's execute failed on the second send: the rest of the batch gets that error.
    assert isinstance(results[1], TritonError)
    assert "Non-decoupled model cannot send more than one response" in results[1].message
    assert results[1].message.startswith("Failed to process the request(s) for model ")


@pytest.mark.anyio
async def test_a_response_sent_and_returned_too_fails_the_rest_in_tritons_words(
    start: Started,
) -> None:
    instance = start("late_answer")
    results = await instance.execute([late("send_and_return", 5), late("return", 6)])
    assert outputs(results[0])["OUT"].tolist() == [5]  # the one it sent stands
    assert isinstance(results[1], TritonError)
    # Triton's words alone: no exception's name before them, no traceback after.
    assert results[1].message.endswith(
        ", message: Unable to send response. Non-decoupled model cannot send more than one "
        "response."
    )


@pytest.mark.anyio
async def test_final_flag_before_a_response_is_refused(start: Started) -> None:
    instance = start("late_answer")
    [result] = await instance.execute([late("final_first")])
    assert isinstance(result, TritonError)
    assert "Non-decoupled model cannot send complete final before sending a response" in (
        result.message
    )


@pytest.mark.anyio
async def test_request_the_model_forgot_fails_instead_of_hanging(start: Started) -> None:
    instance = start("late_answer")
    [result] = await instance.execute([late("drop")])
    # The stub notices at once, so the error may be there when execute returns, or come later.
    failure = await resolved(result) if isinstance(result, Deferred) else result
    assert isinstance(failure, TritonError) and failure.code is ErrorCode.INTERNAL
    assert "released a request without finishing it" in failure.message
    # The instance goes on serving.
    [ok] = await instance.execute([late("return", 9)])
    assert outputs(ok)["OUT"].tolist() == [9]


@pytest.mark.anyio
async def test_outstanding_answer_fails_when_the_process_dies(start: Started) -> None:
    instance = start("late_answer")
    [parked] = await instance.execute([late("park")])
    os.kill(instance.pid, signal.SIGKILL)
    failure = await resolved(parked)
    assert isinstance(failure, TritonError) and failure.code is ErrorCode.UNAVAILABLE
    assert "exited with signal SIGKILL" in failure.message


@pytest.mark.anyio
async def test_outstanding_answer_fails_when_the_instance_is_finalized(start: Started) -> None:
    instance = start("late_answer")
    [parked] = await instance.execute([late("park")])
    await anyio.to_thread.run_sync(instance.finalize)
    failure = await resolved(parked)
    assert isinstance(failure, TritonError) and failure.code is ErrorCode.UNAVAILABLE
    assert "finalized before it answered" in failure.message


# -- decoupled ----------------------------------------------------------------------------------


def stream(mode: str, count: int = 0):  # type: ignore[no-untyped-def]
    return decoupled("stream_after", text("MODE", mode), int32("COUNT", count))


def values(answers: list) -> list[object]:  # type: ignore[type-arg]
    return [None if r is None else outputs(r)["OUT"].tolist()[0] for r, _, _ in answers]


@pytest.mark.anyio
async def test_decoupled_responses_after_execute_returned_arrive(start_both: Started) -> None:
    """The model checks `using_decoupled_model_transaction_policy` in initialize."""
    instance = start_both("stream_after")
    parked, parked_answers = stream("park", 2)
    assert await instance.execute([parked]) == [None]
    release, release_answers = stream("release", 5)
    assert await instance.execute([release]) == [None]
    assert values(parked_answers.until_final()) == [0, 1, None]
    assert values(release_answers.until_final()) == [5]


@pytest.mark.anyio
async def test_decoupled_execute_returning_responses_fails_with_tritons_words(
    start: Started,
) -> None:
    instance = start("stream_after")
    req, answers = stream("return", 1)
    [error] = await instance.execute([req])
    # The request fails (counted so); whoever streams its responses ends it with the error
    # (`ResponseSender.end_if_failed`).
    assert isinstance(error, TritonError) and answers.queue.empty()
    assert error.message == (
        "Failed to process the request(s) for model 'stream_after_0_0', message: Python model "
        "'stream_after_0_0' is using the decoupled mode and the execute function must return "
        "None."
    )


@pytest.mark.anyio
async def test_decoupled_send_after_final_is_refused_in_the_model(start: Started) -> None:
    instance = start("stream_after")
    req, answers = stream("after_final", 1)
    await instance.execute([req])
    assert answers.until_final() == [(None, None, True)]
    # The refused send reached the server as nothing: the next request's answers come next.
    nxt, next_answers = stream("count", 1)
    await instance.execute([nxt])
    assert values(next_answers.until_final()) == [0, None]
    assert answers.queue.empty()


@pytest.mark.anyio
async def test_decoupled_execute_raising_fails_each_request_with_the_error(
    start: Started,
) -> None:
    instance = start("stream_after")
    first, first_answers = stream("raise")
    second, second_answers = stream("raise")
    results = await instance.execute([first, second])
    for error, answers in zip(results, (first_answers, second_answers), strict=True):
        assert isinstance(error, TritonError) and answers.queue.empty()
        assert "ValueError: stream_after was asked to raise" in error.message


@pytest.mark.anyio
async def test_decoupled_async_executes_run_concurrently(start: Started) -> None:
    """Each request's coroutine waits for the other's to have started: both can only answer
    True if the second execute is taken while the first still runs."""
    instance = start("async_handshake")
    a, a_answers = decoupled("async_handshake", text("ROLE", "a"))
    b, b_answers = decoupled("async_handshake", text("ROLE", "b"))
    with anyio.fail_after(PATIENCE_S):
        assert await instance.execute([a]) == [None]
        assert await instance.execute([b]) == [None]
    for answers in (a_answers, b_answers):
        [(response, error, final)] = answers.until_final()
        assert error is None and final
        assert outputs(response)["PARTNER_SEEN"].tolist() == [True]


# -- rescheduling ---------------------------------------------------------------------------------


def resched(mode: str, request_id: str):  # type: ignore[no-untyped-def]
    return request("reschedule", text("MODE", mode), int32("VALUE", 4), id=request_id)


@pytest.mark.anyio
async def test_reschedule_flag_gives_reschedule_then_the_answer(start_either: Started) -> None:
    instance = start_either("reschedule")
    first = resched("ok", "r1")
    assert await instance.execute([first]) == [RESCHEDULE]
    [answer] = await instance.execute([first])  # the scheduler runs the same request again
    assert outputs(answer)["RUNS"].tolist() == [2]


@pytest.mark.anyio
async def test_reschedule_goes_back_to_the_scheduler_whatever_the_config(
    start: Started,
) -> None:
    # The scheduler decides: a sequence batcher with iterative_sequence runs it again, any
    # other refuses it (tests/unit/test_rescheduling.py, and end to end).
    plain = context("reschedule")
    plain.config.sequence_batching = None
    instance = start("reschedule", model_context=plain)
    [result] = await instance.execute([resched("ok", "r2")])
    assert result is RESCHEDULE


@pytest.mark.anyio
async def test_response_for_a_rescheduled_request_is_refused(start: Started) -> None:
    instance = start("reschedule")
    [result] = await instance.execute([resched("wrong", "r3")])
    assert isinstance(result, TritonError)
    assert (
        "Expected a None object in the execute function return list for reschduled request"
        in result.message
    )


@pytest.mark.anyio
async def test_decoupled_reschedule_sends_then_reruns(start: Started) -> None:
    instance = start("iterate")
    req, answers = decoupled("iterate", int32("COUNT", 3), id="it")
    assert await instance.execute([req]) == [RESCHEDULE]
    assert await instance.execute([req]) == [RESCHEDULE]
    assert await instance.execute([req]) == [None]
    seen = answers.until_final()
    assert [outputs(r)["LEFT"].tolist()[0] for r, _, _ in seen] == [2, 1, 0]
    assert [final for _, _, final in seen] == [False, False, True]


# -- codes, argv, requested outputs --------------------------------------------------------------


@pytest.mark.anyio
async def test_error_codes_cross_the_wire_unchanged(start: Started) -> None:
    instance = start("error_code")
    names = ["UNKNOWN", "INTERNAL", "NOT_FOUND", "INVALID_ARG", "UNAVAILABLE", "UNSUPPORTED"]
    names += ["ALREADY_EXISTS", "CANCELLED"]
    results = await instance.execute([request("error_code", text("CODE", n)) for n in names])
    assert [r.code.name for r in results] == names  # type: ignore[union-attr]
    assert results[0].message == "failed with UNKNOWN"  # type: ignore[union-attr]


@pytest.mark.anyio
async def test_model_process_has_a_clean_argv_for_unittest(start: Started) -> None:
    instance = start("argv_unittest")
    [result] = await instance.execute([request("argv_unittest")])
    got = outputs(result)
    assert got["ARGV"].tolist() == [b""]
    assert got["PASSED"].tolist() == [True]


@pytest.mark.anyio
async def test_request_naming_no_outputs_lists_all_of_the_models(start: Started) -> None:
    instance = start("introspect")
    data = int32("INPUT0", 1).data.astype(np.float32)
    [result] = await instance.execute([request("introspect", tensor("INPUT0", data))])
    seen = json.loads(outputs(result)["REQUEST"][0])
    assert seen["requested_output_names"] == ["ARGS", "DLPACK", "REQUEST"]
    named = request("introspect", tensor("INPUT0", data), outputs=[RequestedOutput("REQUEST")])
    [result] = await instance.execute([named])
    assert json.loads(outputs(result)["REQUEST"][0])["requested_output_names"] == ["REQUEST"]


# -- BLS streams and model control, against stand-ins for the server ------------------------------


class StreamingRouter:
    """Stands in for the router a model's BLS calls reach: `stream_after` runs on a real
    instance, streamed through the request's sender as `Router.submit` does."""

    def __init__(self, target: Any) -> None:
        self.target = target
        self.tasks: set[asyncio.Task[None]] = set()

    async def infer(self, request: Any) -> InferenceResponse:
        raise AssertionError("a decoupled model is never called without decoupled=True")

    def resolve(self, name: str, version: str = "") -> Any:
        return SimpleNamespace(decoupled=name == "stream_after")

    def submit(self, request: Any) -> Reply[Any]:
        reply: Reply[Any] = Reply()

        async def run() -> None:
            try:
                [result] = await self.target.execute([request])
                reply.set(result)
            except Exception as error:
                reply.fail(error)

        task = asyncio.get_running_loop().create_task(run())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return reply


@pytest.mark.anyio
async def test_decoupled_bls_yields_every_response_then_the_empty_final(
    start_both: Started,
) -> None:
    router = StreamingRouter(start_both("stream_after"))
    instance = start_both("bls_stream", infer=router.infer, submit=router.submit)
    [result] = await instance.execute(
        [request("bls_stream", text("MODE", "count"), int32("COUNT", 2))]
    )
    report = json.loads(outputs(result)["REPORT"][0])
    expected = [{"out": [0]}, {"out": [1]}, {"out": None}]
    for way in ("exec", "exec_again", "async_for", "async_iter"):
        assert report[way] == expected, way
    [refused] = report["not_decoupled"]
    assert "Please use 'decoupled=True'" in refused["error"]


class RecordingControl:
    """Stands in for the model manager: records what a model asks, refuses unknown models."""

    def __init__(self) -> None:
        self.loaded: set[str] = set()
        self.calls: list[tuple[str, str, object]] = []

    async def load(self, name: str, config: str = "", files: Any = None) -> None:
        self.calls.append(("load", name, config))
        if name == "missing":
            raise TritonError(ErrorCode.INVALID_ARG, "failed to load 'missing', no version")
        self.loaded.add(name)

    async def unload(self, name: str, unload_dependents: bool = False) -> None:
        self.calls.append(("unload", name, unload_dependents))
        self.loaded.discard(name)

    async def ready(self, name: str, version: str = "") -> bool:
        return name in self.loaded


def control_request(action: str, target: str = "other") -> Any:
    return request("model_loader", text("ACTION", action), text("TARGET", target))


@pytest.mark.anyio
async def test_model_loads_unloads_and_asks_through_the_servers_control(
    start: Started,
) -> None:
    control = RecordingControl()
    instance = start("model_loader", control=control)
    reports = []
    for action in ("load", "ready", "unload", "load_config"):
        [result] = await instance.execute([control_request(action)])
        reports.append(json.loads(outputs(result)["REPORT"][0]))
    assert [r["ready"] for r in reports] == [True, True, False, True]
    assert [c[0] for c in control.calls] == ["load", "unload", "load"]
    assert json.loads(control.calls[2][2])["parameters"]["loaded_by"] == {"string_value": "bls"}  # type: ignore[arg-type]
    [result] = await instance.execute([control_request("load", "missing")])
    report = json.loads(outputs(result)["REPORT"][0])
    assert report == {"error": "failed to load 'missing', no version", "ready": False}


@pytest.mark.anyio
async def test_model_control_without_a_server_says_so(start: Started) -> None:
    instance = start("model_loader")
    # The model catches the refused unload, not the refused is_model_ready that follows it.
    [result] = await instance.execute([control_request("unload")])
    assert isinstance(result, TritonError)
    assert "TritonModelException: model control" in result.message
    assert "is not available to this model instance" in result.message
