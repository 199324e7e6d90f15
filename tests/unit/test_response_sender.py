"""ResponseSender.end_if_failed: a decoupled request whose execute failed before its final
response gets that failure as its last answer, once, whoever streams it."""

from __future__ import annotations

from typing import Any

import pytest

from tritonactor.core.errors import ErrorCode, TritonError, invalid_arg
from tritonactor.core.types import InferenceResponse, ResponseSender


def recorder() -> tuple[ResponseSender, list[tuple[Any, Any, bool]]]:
    sent: list[tuple[Any, Any, bool]] = []
    return ResponseSender(lambda r, e, f: sent.append((r, e, f))), sent


def fails(error: BaseException) -> Any:
    def outcome() -> None:
        raise error

    return outcome


def test_a_failed_execute_is_the_last_answer() -> None:
    sender, sent = recorder()
    sender.end_if_failed(fails(invalid_arg("bad")))
    ((response, error, final),) = sent
    assert response is None and final and error.code is ErrorCode.INVALID_ARG
    assert sender.finished


def test_an_unexpected_exception_becomes_internal() -> None:
    sender, sent = recorder()
    sender.end_if_failed(fails(ValueError("boom")))
    ((_, error, _),) = sent
    assert isinstance(error, TritonError) and error.code is ErrorCode.INTERNAL
    assert error.message == "ValueError: boom"


@pytest.mark.parametrize("finished_first", [True, False])
def test_a_successful_or_finished_request_gets_nothing_more(finished_first: bool) -> None:
    sender, sent = recorder()
    if finished_first:
        sender.send(InferenceResponse("m", "1"), final=True)
        sender.end_if_failed(fails(invalid_arg("too late")))
    else:
        sender.end_if_failed(lambda: None)
    assert len(sent) == (1 if finished_first else 0)
    assert sender.finished == finished_first
