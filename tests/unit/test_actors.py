"""The actor runtime on its own: mailboxes, tell/ask, supervision, shutdown."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import anyio
import pytest

from tritonactor.actors import Actor, ActorRef, ActorStopped, ActorSystem, Reply

pytestmark = pytest.mark.anyio

# A bound on waits for something that is bound to happen: generous, so that only a hang reaches
# it, however busy the machine.
HANG = 30


@dataclass(frozen=True)
class Add:
    amount: int


@dataclass(frozen=True)
class Get:
    reply: Reply[int]


@dataclass(frozen=True)
class Boom:
    reply: Reply[int] | None = None


@dataclass(frozen=True)
class Slow:
    reply: Reply[int]
    seconds: float = 0.05


@dataclass(frozen=True)
class Held:
    """Handled once `gate` is set; `taken` is set when the actor starts handling it."""

    reply: Reply[int]
    taken: anyio.Event
    gate: anyio.Event


class Counter(Actor[Any]):
    def __init__(self, name: str = "counter", log: list[str] | None = None) -> None:
        super().__init__(name)
        self.total = 0
        self.log = log if log is not None else []

    async def started(self) -> None:
        self.log.append(f"{self.name} started")

    async def receive(self, message: Any) -> None:
        match message:
            case Add(amount):
                self.total += amount
            case Get(reply):
                reply.set(self.total)
            case Slow(reply, seconds):
                await anyio.sleep(seconds)
                reply.set(self.total)
            case Held(reply, taken, gate):
                taken.set()
                await gate.wait()
                reply.set(self.total)
            case Boom():
                raise RuntimeError(f"{self.name} exploded")

    async def stopped(self) -> None:
        self.log.append(f"{self.name} stopped")


async def test_tell_then_ask_sees_messages_in_order() -> None:
    async with ActorSystem() as system:
        ref = await system.spawn(Counter())
        for amount in range(1, 11):
            await ref.tell(Add(amount))
        assert await ref.ask(Get) == 55


async def test_mailbox_is_bounded() -> None:
    class Tiny(Counter):
        mailbox_size = 2

    async with ActorSystem() as system:
        taken = anyio.Event()
        gate = anyio.Event()

        class Blocked(Tiny):
            async def receive(self, message: Any) -> None:
                taken.set()
                await gate.wait()
                await super().receive(message)

        ref = await system.spawn(Blocked())
        await ref.tell(Add(1))  # taken by the loop, which then blocks on the gate
        with anyio.fail_after(HANG):
            await taken.wait()
        assert ref.mailbox_depth == 0
        ref.tell_nowait(Add(1))
        ref.tell_nowait(Add(1))
        assert ref.mailbox_depth == 2
        with pytest.raises(anyio.WouldBlock):
            ref.tell_nowait(Add(1))
        gate.set()
        assert await ref.ask(Get) == 3


async def test_stop_drains_queue_then_runs_stopped_hook() -> None:
    log: list[str] = []
    async with ActorSystem() as system:
        ref = await system.spawn(Counter(log=log))
        replies = [Reply[int]() for _ in range(3)]
        for reply in replies:
            await ref.tell(Slow(reply, 0.01))
        ref.stop()
        with pytest.raises(ActorStopped):
            await ref.tell(Add(1))
        assert [await reply.wait() for reply in replies] == [0, 0, 0]
    assert log == ["counter started", "counter stopped"]


async def test_failing_actor_is_reported_and_its_pending_asks_fail() -> None:
    failures: list[tuple[str, str]] = []
    async with ActorSystem(
        on_failure=lambda ref, err: failures.append((ref.name, str(err)))
    ) as system:
        ref = await system.spawn(Counter())
        survivor = await system.spawn(Counter("survivor"))
        waiting = Reply[int]()
        ref.tell_nowait(Boom())
        ref.tell_nowait(Slow(waiting))  # queued behind the failing message
        with pytest.raises(ActorStopped):
            await waiting.wait()
        with anyio.fail_after(HANG):
            while not failures:
                await anyio.sleep(0.001)
        assert failures == [("counter", "counter exploded")]
        assert not ref.running
        with pytest.raises(ActorStopped):
            await ref.ask(Get)
        # the system and its other actors keep running
        assert await survivor.ask(Get) == 0


async def test_failure_while_answering_fails_that_ask() -> None:
    async with ActorSystem() as system:
        ref = await system.spawn(Counter())
        with pytest.raises(ActorStopped):
            await ref.ask(Boom)


class Parent(Actor[Any]):
    def __init__(self, log: list[str]) -> None:
        super().__init__("parent")
        self.log = log
        self.failed: list[str] = []
        self.child: ActorRef[Any] | None = None

    async def started(self) -> None:
        self.child = await self.spawn(Counter("child", self.log))

    async def receive(self, message: Any) -> None:
        match message:
            case Get(reply):
                reply.set(len(self.failed))

    async def on_child_failed(self, child: ActorRef[Any], error: BaseException) -> None:
        self.failed.append(f"{child.name}: {error}")

    async def stopped(self) -> None:
        self.log.append("parent stopped")


async def test_parent_is_told_when_child_fails() -> None:
    log: list[str] = []
    async with ActorSystem() as system:
        parent_actor = Parent(log)
        parent = await system.spawn(parent_actor)
        assert parent_actor.child is not None
        await parent_actor.child.tell(Boom())
        with anyio.fail_after(HANG):
            while await parent.ask(Get) == 0:
                await anyio.sleep(0.001)
        assert parent_actor.failed == ["child: child exploded"]
        assert parent_actor.children == ()


async def test_stopping_parent_stops_children_first() -> None:
    log: list[str] = []
    async with ActorSystem() as system:
        parent = await system.spawn(Parent(log))
        parent.stop()
        with anyio.fail_after(HANG):
            while parent.running:
                await anyio.sleep(0.001)
    assert log == ["child started", "child stopped", "parent stopped"]


async def test_unhandled_child_failure_escalates_to_parent() -> None:
    failures: list[str] = []

    class Strict(Parent):
        on_child_failed = Actor.on_child_failed  # default policy: escalate

    async with ActorSystem(on_failure=lambda ref, err: failures.append(ref.name)) as system:
        strict = Strict([])
        await system.spawn(strict)
        assert strict.child is not None
        await strict.child.tell(Boom())
        with anyio.fail_after(HANG):
            while not failures:
                await anyio.sleep(0.001)
        assert failures == ["parent"]


async def test_error_in_started_fails_spawn() -> None:
    class Broken(Counter):
        async def started(self) -> None:
            raise ValueError("cannot start")

    log: list[str] = []
    async with ActorSystem() as system:
        with pytest.raises(ValueError, match="cannot start"):
            await system.spawn(Broken(log=log))
        assert log == []  # it never ran: its stopped hook does not either
        # a failed start leaves the system usable
        assert await (await system.spawn(Counter())).ask(Get) == 0


async def test_shutdown_timeout_cancels_stuck_actor() -> None:
    class Stuck(Counter):
        async def receive(self, message: Any) -> None:
            await anyio.sleep_forever()

    waiting = Reply[int]()
    with anyio.fail_after(HANG):  # a bound on the hang; 0.1 s is the timeout under test
        async with ActorSystem(shutdown_timeout=0.1) as system:
            ref = await system.spawn(Stuck())
            await ref.tell(Add(1))
            await ref.tell(Get(waiting))
    with pytest.raises(ActorStopped):
        await waiting.wait()


async def test_reply_callbacks_fire_once_with_the_answer() -> None:
    seen: list[object] = []
    reply = Reply[int]()
    reply.add_done_callback(lambda r: seen.append(r.result()))
    reply.set(7)
    reply.set(8)  # a reply is answered once
    reply.add_done_callback(lambda r: seen.append(r.result()))  # already done: called at once
    assert seen == [7, 7]
    failed = Reply[int]()
    failed.add_done_callback(lambda r: seen.append(type(r._error).__name__))
    failed.fail(ValueError("no"))
    assert seen[-1] == "ValueError"
    with pytest.raises(ValueError):
        failed.result()


async def test_a_failing_reply_callback_does_not_stop_the_others() -> None:
    seen: list[int] = []
    reply = Reply[int]()

    def broken(r: Reply[int]) -> None:
        raise RuntimeError("callback bug")

    reply.add_done_callback(broken)
    reply.add_done_callback(lambda r: seen.append(r.result()))
    reply.set(3)  # must not raise into whoever answered
    assert seen == [3]


async def test_helper_tasks_end_when_the_actor_stops() -> None:
    class Ticking(Counter):
        async def started(self) -> None:
            await super().started()
            self.start_soon(self._tick)

        async def _tick(self) -> None:
            while True:
                await anyio.sleep(3600)  # a timer that would hold a stop for an hour

    log: list[str] = []
    with anyio.fail_after(HANG):  # far short of the timer's hour
        async with ActorSystem() as system:
            ref = await system.spawn(Ticking(log=log))
            ref.stop()
    assert log == ["counter started", "counter stopped"]


async def test_a_timer_delivers_its_message_and_a_stop_cancels_those_pending() -> None:
    """`tell_later`: the message arrives; one pending when the actor stops neither holds the
    stop up nor arrives after it; one that fires into a full mailbox waits for room rather
    than being lost."""

    class Timed(Counter):
        mailbox_size = 1

    log: list[str] = []
    with anyio.fail_after(HANG):
        async with ActorSystem() as system:
            actor = Timed(log=log)
            ref = await system.spawn(actor)
            actor.tell_later(Add(5), 0)
            while actor.total != 5:
                await anyio.sleep(0)  # yield until the timer's message is handled
            # A full mailbox when the timer fires: a held message runs, another waits behind it.
            held: Reply[int] = Reply()
            taken, gate = anyio.Event(), anyio.Event()
            await ref.tell(Held(held, taken, gate))
            await taken.wait()
            await ref.tell(Add(1))
            assert ref.mailbox_depth == 1  # full
            actor.tell_later(Add(10), 0)
            # Every task blocked: the timer has fired and waits for room (the actor is held).
            await anyio.wait_all_tasks_blocked()
            assert (ref.mailbox_depth, actor.total) == (1, 5)
            gate.set()
            assert await held.wait() == 5
            while actor.total != 16:
                await anyio.sleep(0)
            actor.tell_later(Add(100), 3600)  # would hold a stop for an hour
            ref.stop()
            await ref.join()
    assert actor.total == 16 and log == ["counter started", "counter stopped"]


async def test_now_is_the_clock_timers_count_on() -> None:
    """`now()` reads the clock `tell_later` sleeps on (the event loop's, which anyio reads)."""
    with anyio.fail_after(HANG):
        async with ActorSystem() as system:
            actor = Counter(log=[])
            await system.spawn(actor)
            before = anyio.current_time()
            now = actor.now()
            assert before <= now <= anyio.current_time()
            actor.tell_later(Add(1), 0.01)
            while actor.total != 1:
                await anyio.sleep(0)
            assert actor.now() >= now + 0.009  # (the loop may run a timer a clock tick early)


@dataclass(frozen=True)
class Echo:
    """Handled by telling the actor `then`, from inside its own handling."""

    then: Any


class Immediate(Actor[Any]):
    """An actor that handles every message without waiting: on the sender's turn when idle."""

    handles_now = True

    def __init__(self, name: str = "immediate") -> None:
        super().__init__(name)
        self.total = 0
        self.seen: list[Any] = []
        self.failed: list[str] = []

    async def receive(self, message: Any) -> None:
        self.handle_now(message)

    def handle_now(self, message: Any) -> None:
        self.seen.append(message)
        match message:
            case Add(amount):
                self.total += amount
            case Get(reply):
                reply.set(self.total)
            case Echo(then):
                self.ref.tell_nowait(then)
                self.total *= 10  # before `then` is handled: it waits for this one
            case Boom():
                raise RuntimeError(f"{self.name} exploded")

    async def on_child_failed(self, child: ActorRef[Any], error: BaseException) -> None:
        self.failed.append(f"{child.name}: {error}")


async def test_an_idle_actor_that_handles_now_takes_a_message_on_the_senders_turn() -> None:
    """Sent while it waits on an empty mailbox, a message is handled before `tell_nowait`
    (and `tell`, and `ask`) returns, with no turn of the loop; the mailbox is never used."""
    async with ActorSystem() as system:
        actor = Immediate()
        ref = await system.spawn(actor)
        await anyio.wait_all_tasks_blocked()  # its loop waits for a message
        ref.tell_nowait(Add(2))
        assert actor.total == 2 and ref.mailbox_depth == 0
        await ref.tell(Add(3))
        assert actor.total == 5
        reply = Reply[int]()
        ref.tell_nowait(Get(reply))
        assert reply.done and reply.result() == 5


async def test_a_message_sent_while_handling_waits_its_turn() -> None:
    """One message at a time still: a message the actor sends itself while handling one is
    queued, and handled after it by the loop, in the order sent."""
    async with ActorSystem() as system:
        actor = Immediate()
        ref = await system.spawn(actor)
        await anyio.wait_all_tasks_blocked()
        ref.tell_nowait(Add(1))
        ref.tell_nowait(Echo(Add(5)))  # handled now; its Add(5) is queued, not nested
        assert actor.total == 10 and ref.mailbox_depth == 1
        assert await ref.ask(Get) == 15  # after the loop has had Add(5)
        assert [type(m).__name__ for m in actor.seen] == ["Add", "Echo", "Add", "Get"]


async def test_a_busy_or_starting_actor_that_handles_now_queues_instead() -> None:
    """Messages sent before its loop waits (while queued ones are pending) go through the
    mailbox, in order, as to any actor."""
    async with ActorSystem() as system:
        actor = Immediate()
        ref = await system.spawn(actor)
        await anyio.wait_all_tasks_blocked()
        ref.tell_nowait(Echo(Add(1)))  # handled now; Add(1) queued behind it
        ref.tell_nowait(Add(2))  # the loop is woken but has not run: queued too
        assert ref.mailbox_depth == 2 and actor.total == 0
        assert await ref.ask(Get) == 3
        assert [type(m).__name__ for m in actor.seen] == ["Echo", "Add", "Add", "Get"]


async def test_a_failure_on_the_senders_turn_fails_the_actor_not_the_sender() -> None:
    """What `handle_now` raises on a sender's turn fails the actor in its own loop, as a
    failing `receive` does: reported to its owner, the message's ask answered ActorStopped,
    later messages refused; the sender's `tell` returns normally."""
    failures: list[tuple[str, str]] = []
    async with ActorSystem(on_failure=lambda ref, err: failures.append((ref.name, str(err)))) as (
        system
    ):
        actor = Immediate()
        ref = await system.spawn(actor)
        await anyio.wait_all_tasks_blocked()
        waiting = Reply[int]()
        ref.tell_nowait(Boom(waiting))  # does not raise here
        with pytest.raises(ActorStopped):
            await waiting.wait()
        with anyio.fail_after(HANG):
            await ref.join()
        assert failures == [("immediate", "immediate exploded")]
        with pytest.raises(ActorStopped):
            ref.tell_nowait(Add(1))


async def test_a_child_failure_reaches_a_parent_that_handles_now_through_its_loop() -> None:
    """ChildFailed is never taken on the sender's turn: the parent's loop hands it to
    `on_child_failed` (which may wait), even when the parent is idle."""

    class Guardian(Immediate):
        async def started(self) -> None:
            self.child = await self.spawn(Counter("child", []))

    async with ActorSystem() as system:
        parent = Guardian("parent")
        await system.spawn(parent)
        await anyio.wait_all_tasks_blocked()
        await parent.child.tell(Boom())
        with anyio.fail_after(HANG):
            while not parent.failed:
                await anyio.sleep(0.001)
        assert parent.failed == ["child: child exploded"]
        assert not any(type(m).__name__ == "ChildFailed" for m in parent.seen)
        assert parent.children == ()


@dataclass(frozen=True)
class EchoThenBoom:
    """Sends the actor `then`, then fails, in one handling."""

    then: Any


class Brittle(Immediate):
    def handle_now(self, message: Any) -> None:
        if isinstance(message, EchoThenBoom):
            self.ref.tell_nowait(message.then)
            raise RuntimeError("brittle broke")
        super().handle_now(message)


async def test_what_was_sent_during_a_failing_handling_is_refused_not_handled() -> None:
    """A handling that fails on the sender's turn fails the actor before any message sent
    meanwhile is handled: that message is answered ActorStopped, as in the loop."""
    async with ActorSystem() as system:
        actor = Brittle()
        ref = await system.spawn(actor)
        await anyio.wait_all_tasks_blocked()
        waiting = Reply[int]()
        ref.tell_nowait(EchoThenBoom(Get(waiting)))
        with pytest.raises(ActorStopped):
            await waiting.wait()
        with anyio.fail_after(HANG):
            await ref.join()
        assert [type(m).__name__ for m in actor.seen] == []  # Get was never handled


def test_a_class_that_handles_now_must_say_how() -> None:
    """`handles_now` without a `handle_now` is refused when the class is made, not when a
    message first finds the actor idle."""
    with pytest.raises(TypeError, match="defines no handle_now"):

        class Careless(Counter):
            handles_now = True


@dataclass(frozen=True)
class Batch:
    """A message answering several: its replies are named by `replies`."""

    replies: tuple[Reply[int], ...]


class Holder(Actor[Any]):
    """Keeps the asks it is sent (as a scheduler keeps its queue) until it stops."""

    def __init__(self, hook_fails: bool = False) -> None:
        super().__init__("holder")
        self.held: list[Reply[int]] = []
        self.hook_fails = hook_fails
        self.hook_saw: list[Exception | None] = []

    async def receive(self, message: Any) -> None:
        match message:
            case Get(reply):
                self.held.append(reply)
            case Boom():
                raise RuntimeError("holder exploded")

    async def stopped(self) -> None:
        self.hook_saw.append(self.failure)
        for reply in self.held:
            reply.fail(ActorStopped(f"let go: {self.failure}"))
        if self.hook_fails:
            raise ValueError("the hook failed too")


@pytest.mark.parametrize("hook_fails", [False, True])
async def test_a_failed_actor_runs_its_stopped_hook_so_what_it_holds_is_answered(
    hook_fails: bool,
) -> None:
    failures: list[str] = []
    async with ActorSystem(on_failure=lambda ref, err: failures.append(str(err))) as system:
        holder = Holder(hook_fails)
        ref = await system.spawn(holder)
        held = [Reply[int]() for _ in range(2)]
        for reply in held:
            await ref.tell(Get(reply))
        batch = Batch((Reply[int](), Reply[int]()))
        ref.tell_nowait(Boom())
        ref.tell_nowait(batch)  # queued behind the failure: each of its replies is failed
        with anyio.fail_after(HANG):
            for reply in held:
                with pytest.raises(ActorStopped, match="let go: holder exploded"):
                    await reply.wait()
            for reply in batch.replies:
                with pytest.raises(ActorStopped, match="stopped before answering"):
                    await reply.wait()
            await ref.join()
    # the actor's own failure is what its owner hears, the hook's only logged
    assert failures == ["holder exploded"]
    assert [type(error) for error in holder.hook_saw] == [RuntimeError]


async def test_a_clean_stop_runs_the_hook_without_a_failure() -> None:
    async with ActorSystem() as system:
        holder = Holder()
        ref = await system.spawn(holder)
        reply = Reply[int]()
        await ref.tell(Get(reply))
        ref.stop()
        with anyio.fail_after(HANG):
            with pytest.raises(ActorStopped, match="let go: None"):
                await reply.wait()
            await ref.join()
    assert holder.hook_saw == [None]
