"""A `ModelStreamInfer` call's answers between the requests' actors and the stream's writer
(frontends/grpc/stream.py): in order, as they come, the writer ending once the client has
finished and every request is answered, and an answer that comes after the writer has gone
dropped without an error in whoever delivered it."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from tritonactor.actors.mailbox import Mailbox
from tritonactor.frontends.grpc.stream import Pending, metadata_flag, write_answers

pytestmark = pytest.mark.anyio

HANG = 30


class Written:
    """The stream's side that `write_answers` writes to."""

    def __init__(self) -> None:
        self.messages: list[Any] = []
        self.more = anyio.Event()

    async def send_message(self, message: Any) -> None:
        self.messages.append(message)
        self.more.set()
        self.more = anyio.Event()


async def test_answers_go_out_in_order_and_the_writer_ends_with_the_last() -> None:
    answers: Mailbox[Any] = Mailbox.for_stream()
    pending = Pending(answers, window=4)
    stream = Written()
    with anyio.fail_after(HANG):
        async with anyio.create_task_group() as group:
            group.start_soon(write_answers, stream, answers, False, pending)
            for _ in range(3):
                await pending.start()
            pending.deliver("a", finished=True)  # type: ignore[arg-type]
            pending.deliver("b1")  # type: ignore[arg-type]  # a decoupled request's first
            pending.deliver("b2", finished=True)  # type: ignore[arg-type]
            while len(stream.messages) < 3:
                await stream.more.wait()
            pending.input_done()  # the client is done; one request still runs
            pending.deliver("c", finished=True)  # type: ignore[arg-type]
        # The task group ended: the writer stopped after the last request's answer.
    assert stream.messages == ["a", "b1", "b2", "c"]


async def test_an_answer_after_the_writer_has_gone_is_dropped_quietly() -> None:
    answers: Mailbox[Any] = Mailbox.for_stream()
    pending = Pending(answers, window=4)

    class Broken(Written):
        async def send_message(self, message: Any) -> None:
            raise ConnectionResetError("the client went away")

    with anyio.fail_after(HANG):
        await pending.start()
        await pending.start()
        pending.deliver("first", finished=True)  # type: ignore[arg-type]
        with pytest.raises(ConnectionResetError):
            await write_answers(Broken(), answers, False, pending)
        # Delivered from a model's actor once nobody writes: no exception reaches it.
        pending.deliver("late", finished=True)  # type: ignore[arg-type]
    assert len(answers) == 0


async def test_a_stream_the_client_reset_ends_the_writer_without_an_error() -> None:
    """A client that cancels its call resets the stream: the writer stops there, quietly
    (grpclib is cancelling the handler; an error would end that cancellation as a failure)."""
    from h2.exceptions import StreamClosedError

    answers: Mailbox[Any] = Mailbox.for_stream()
    pending = Pending(answers, window=4)

    class Reset(Written):
        async def send_message(self, message: Any) -> None:
            raise StreamClosedError(1)

    with anyio.fail_after(HANG):
        await pending.start()
        await pending.start()
        pending.deliver("first", finished=True)  # type: ignore[arg-type]
        await write_answers(Reset(), answers, False, pending)  # returns
        pending.deliver("late", finished=True)  # type: ignore[arg-type]
    assert len(answers) == 0


@pytest.mark.parametrize(
    ("value", "mode"), [("true", True), ("TRUE", False), (" true", False), ("1", False)]
)
def test_triton_grpc_error_mode_is_exactly_true(value: str, mode: bool) -> None:
    # Triton 2.51 compares the metadata value with "true" as it is.
    assert metadata_flag({"triton_grpc_error": value}, "triton_grpc_error") is mode
    assert metadata_flag(None, "triton_grpc_error") is False
