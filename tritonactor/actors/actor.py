"""Actors: a bounded mailbox, a loop that handles one message at a time, and an owner.

An actor runs inside its parent's task group and owns a task group for its own children, so
stopping an actor stops its subtree, and nothing outlives its owner. A message that expects an
answer carries a `reply` (see `Reply`), or several (`replies`); if the actor stops or fails
with such messages still queued, their replies fail (`ActorStopped`, or the actor's
`stopped_error`) instead of leaving the caller waiting forever. An actor that fails still
runs its `stopped` hook, which answers what it holds of its own (a scheduler's queue).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import anyio
import sniffio
from anyio.abc import TaskGroup, TaskStatus

from tritonactor.actors.mailbox import Mailbox, MailboxClosed
from tritonactor.actors.reply import Reply

log = logging.getLogger(__name__)

M = TypeVar("M")
R = TypeVar("R")


class ActorStopped(Exception):
    """The actor's mailbox is closed: it has stopped, or is stopping, or has failed."""


@dataclass(frozen=True, slots=True)
class ChildFailed:
    """Delivered to a parent's mailbox when one of its children failed."""

    child: ActorRef[Any]
    error: BaseException


@dataclass(frozen=True, slots=True)
class _HandlingFailed:
    """Queued for an actor whose `handle_now` raised on a sender's turn: its loop fails with
    `error`, as though `message` had failed there."""

    message: Any
    error: Exception


# The messages an actor's loop handles itself, not its `receive` (a tuple: isinstance is
# quicker with one than with a union, on every message of every actor).
_OWN_MESSAGES = (ChildFailed, _HandlingFailed)


class ActorRef(Generic[M]):
    """The only handle other code has on an actor: send it messages, ask it, stop it."""

    __slots__ = ("_actor", "_mailbox", "name")

    def __init__(self, actor: Actor[M], mailbox: Mailbox[M]) -> None:
        self._actor = actor
        self._mailbox = mailbox
        self.name = actor.name

    async def tell(self, message: M) -> None:
        """Queue a message, waiting while the mailbox is full."""
        actor = self._actor
        if actor.handles_now and actor._current is None and self._mailbox.waiting():
            actor._handle_now(message)
            return
        try:
            # The common case, a mailbox with room, queues it without yielding to the loop.
            await self._mailbox.put(message)
        except MailboxClosed:
            raise ActorStopped(f"actor '{self.name}' is not running") from None

    def tell_nowait(self, message: M) -> None:
        """Queue a message now; `anyio.WouldBlock` when the mailbox is full. (An actor that
        handles messages where they are sent, idle, handles it now: `Actor.handle_now`.)"""
        actor = self._actor
        if actor.handles_now and actor._current is None and self._mailbox.waiting():
            actor._handle_now(message)
            return
        try:
            self._mailbox.put_nowait(message)
        except MailboxClosed:
            raise ActorStopped(f"actor '{self.name}' is not running") from None

    async def ask(self, make: Callable[[Reply[R]], M]) -> R:
        """Send `make(reply)` and wait for the actor to answer through `reply`."""
        reply: Reply[R] = Reply()
        await self.tell(make(reply))
        return await reply.wait()

    def stop(self) -> None:
        """Close the mailbox: the actor handles what is already queued, then stops."""
        self._mailbox.close()

    async def join(self) -> None:
        """Wait until the actor has stopped (its `stopped` hook done); at once if it never ran."""
        finished = self._actor._finished
        if finished is not None:
            await finished.wait()

    @property
    def mailbox_depth(self) -> int:
        return len(self._mailbox)

    @property
    def running(self) -> bool:
        return self._actor.running

    @property
    def children(self) -> tuple[ActorRef[Any], ...]:
        """The actor's running children (for observers: metrics walk the tree with it)."""
        return self._actor.children

    def __repr__(self) -> str:
        return f"<ActorRef {self.name}>"


class Actor(ABC, Generic[M]):
    """Subclass and implement `receive`. Optional hooks: `started`, `stopped`, `on_child_failed`."""

    mailbox_size: int = 256
    # An actor whose every message is handled without waiting (`handle_now`) sets this: a
    # message sent while it is idle (its loop waiting on an empty mailbox, no message being
    # handled) is handled at once on the sender's turn, instead of waking its loop. (A
    # subclass whose `receive` waits after all must set it back to False.)
    handles_now: bool = False

    def __init__(self, name: str) -> None:
        self.name = name
        self._receive: Mailbox[M] = Mailbox(self.mailbox_size)
        self.ref: ActorRef[M] = ActorRef(self, self._receive)
        self.parent: ActorRef[Any] | None = None
        self.running = False
        self._children: list[ActorRef[Any]] = []
        self._task_group: TaskGroup | None = None
        self._current: Any = None
        self._helpers: set[anyio.CancelScope] = set()
        self._finished: anyio.Event | None = None
        self._clock: Callable[[], float] = anyio.current_time
        # What the actor failed with, for its `stopped` hook (None when it stops cleanly).
        self.failure: Exception | None = None

    # -- hooks ---------------------------------------------------------------------------------

    async def started(self) -> None:
        """Runs before the first message; an error here fails `spawn` for the caller."""

    @abstractmethod
    async def receive(self, message: M) -> None:
        """Handle one message; the next is not taken until this returns."""

    async def stopped(self) -> None:
        """Runs after the mailbox is drained and every child has stopped; also after the actor
        failed (`self.failure` set; its children cancelled, what its mailbox still held
        answered next), so that work it holds is never left unanswered."""

    def stopped_error(self) -> Exception:
        """What a message still waiting for an answer is failed with when the actor stops or
        fails (`ActorStopped`; a scheduler says which model, in the words its clients get)."""
        return ActorStopped(f"actor '{self.name}' stopped before answering")

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.handles_now and cls.handle_now is Actor.handle_now:
            raise TypeError(f"{cls.__name__} sets handles_now but defines no handle_now")

    def handle_now(self, message: M) -> None:
        """Handle one message without waiting, for an actor that `handles_now` (a class that
        says so must define it, checked when the class is made): its `receive` calls this, and
        so does a sender that finds the actor idle. An actor that does not handle messages
        now is never sent here."""
        raise TypeError(f"actor '{self.name}' does not handle messages on a sender's turn")

    async def on_child_failed(self, child: ActorRef[Any], error: BaseException) -> None:
        """Default: a failed child fails its parent too (the failure travels up to the system)."""
        raise error

    # -- children ------------------------------------------------------------------------------

    async def spawn(self, child: Actor[Any]) -> ActorRef[Any]:
        """Start a child in this actor's task group; returns once its `started` hook is done."""
        if self._task_group is None:
            raise ActorStopped(f"actor '{self.name}' is not running; cannot spawn '{child.name}'")
        child.parent = self.ref
        await self._task_group.start(_supervise, child, self._child_failed)
        self._children.append(child.ref)
        return child.ref

    def start_soon(self, function: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Run a helper task (a timer, say) owned by this actor: it stops when the actor does.
        It must talk to the actor only through messages (`self.ref.tell`)."""
        if self._task_group is None:
            raise ActorStopped(f"actor '{self.name}' is not running")
        scope = anyio.CancelScope()
        self._helpers.add(scope)

        async def run() -> None:
            try:
                with scope:
                    await function(*args)
            finally:
                self._helpers.discard(scope)

        self._task_group.start_soon(run)

    def now(self) -> float:
        """Seconds on the clock `tell_later` counts on: the event loop's. (`anyio.current_time`
        reads the same clock but looks its backend up first, at ~2 µs a call: a batcher reads it
        for every request.)"""
        return self._clock()

    def tell_later(self, message: M, delay: float) -> None:
        """Send this actor `message` in `delay` seconds: a timer the actor owns, cancelled when
        it stops (so a pending timer never holds up a stop)."""
        self.start_soon(self._tell_later, message, max(delay, 0.0))

    async def _tell_later(self, message: M, delay: float) -> None:
        await anyio.sleep(delay)
        with contextlib.suppress(ActorStopped):
            await self.ref.tell(message)

    async def stop_child(self, child: ActorRef[Any]) -> None:
        """Stop a child and wait until it has (its queued messages handled, its children and
        `stopped` hook done)."""
        child.stop()
        await child.join()
        if child in self._children:
            self._children.remove(child)

    @property
    def children(self) -> tuple[ActorRef[Any], ...]:
        return tuple(self._children)

    async def _child_failed(self, child: ActorRef[Any], error: BaseException) -> None:
        try:
            # Through the mailbox always: the loop hands it to `on_child_failed`.
            await self._receive.put(ChildFailed(child, error))  # type: ignore[arg-type]
        except MailboxClosed:
            log.error("actor '%s' failed while its parent '%s' was stopping", child.name, self.name)

    # -- the loop ------------------------------------------------------------------------------

    async def _run(self, task_status: TaskStatus[None]) -> None:
        self._finished = anyio.Event()
        if sniffio.current_async_library() == "asyncio":
            self._clock = asyncio.get_running_loop().time
        try:
            async with anyio.create_task_group() as task_group:
                self._task_group = task_group
                await self.started()
                self.running = True
                task_status.started()
                get = self._receive.get
                try:
                    while True:
                        # (`get`, not `async for`: its `__anext__` was a call more a message.)
                        try:
                            message = await get()
                        except anyio.EndOfStream:
                            break
                        self._current = message
                        if isinstance(message, _OWN_MESSAGES):
                            if isinstance(message, _HandlingFailed):
                                self._current = message.message
                                raise message.error
                            if message.child in self._children:
                                self._children.remove(message.child)
                            await self.on_child_failed(message.child, message.error)
                        else:
                            await self.receive(message)
                        self._current = None
                        # Drop the message before waiting for the next one: it may hold a
                        # request's tensors (views of a client's shared memory, which must
                        # not outlive the request).
                        del message
                finally:
                    # Helper tasks (timers) serve the mailbox, which is done: they end here.
                    for scope in list(self._helpers):
                        scope.cancel()
                    for child in self._children:
                        child.stop()
        except Exception as error:
            if self.running:
                # It failed after it started: what it holds (requests queued in a scheduler,
                # a backend) is answered and released by its `stopped` hook all the same.
                await self._stopped_after(_unwrap(error))
            raise
        else:
            await self.stopped()
        finally:
            self.running = False
            self._task_group = None
            self._fail_pending()
            self._finished.set()

    async def _stopped_after(self, error: Exception) -> None:
        """The `stopped` hook of an actor that failed with `error` (`self.failure` says so to
        the hook); what the hook raises is logged, the actor's own failure is what counts."""
        self.failure = error
        try:
            await self.stopped()
        except Exception:
            log.exception("actor '%s' failed in its stopped hook, after failing", self.name)

    def _handle_now(self, message: M) -> None:
        """`message`, sent while this actor is idle, handled on the sender's turn. What it
        raises fails the actor, in its own loop, before any message sent meanwhile (the
        sender goes on)."""
        self._current = message
        try:
            self.handle_now(message)
        except Exception as error:
            self._receive.put_failure(_HandlingFailed(message, error))
        finally:
            self._current = None

    def _fail_pending(self) -> None:
        self.ref.stop()
        error = self.stopped_error()
        current, self._current = self._current, None
        queued = []
        while True:
            try:
                queued.append(self._receive.get_nowait())
            except (anyio.WouldBlock, anyio.EndOfStream):
                break
        self._receive.leave()
        reply = getattr(current, "reply", None)
        if isinstance(reply, Reply):
            reply.fail(error)
        for message in queued:
            reply = getattr(message, "reply", None)
            if isinstance(reply, Reply):
                reply.fail(error)
            else:
                # A queued message answering several (a batch for an instance) names their
                # replies. (One being handled may have handed them on, as a batch is sent back
                # to its scheduler: what it names is its handler's to answer.)
                for each in getattr(message, "replies", ()):
                    each.fail(error)


async def _supervise(
    actor: Actor[Any],
    report: Callable[[ActorRef[Any], BaseException], Any],
    *,
    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    started = False

    def mark_started() -> None:
        nonlocal started
        started = True
        task_status.started()

    try:
        await actor._run(_StartedSignal(mark_started))
    except Exception as error:
        error = _unwrap(error)
        if not started:
            raise error from None
        log.warning("actor '%s' failed: %r", actor.name, error)
        await report(actor.ref, error)


def _unwrap(error: Exception) -> Exception:
    # An actor's task group wraps what its loop raised; report the error itself.
    while isinstance(error, ExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error


class _StartedSignal:
    """Adapts a callback to anyio's TaskStatus, so `_supervise` knows whether start finished."""

    def __init__(self, callback: Callable[[], None]) -> None:
        self._callback = callback

    def started(self, value: None = None) -> None:
        self._callback()


class ActorSystem:
    """The root owner: `async with ActorSystem() as system: ref = await system.spawn(actor)`.

    A child of the system that fails is logged and handed to `on_failure`; the system keeps
    running. Leaving the block stops every actor (gracefully, within `shutdown_timeout`)."""

    def __init__(
        self,
        on_failure: Callable[[ActorRef[Any], BaseException], Any] | None = None,
        shutdown_timeout: float = math.inf,
    ) -> None:
        self._on_failure = on_failure
        self._shutdown_timeout = shutdown_timeout
        self._task_group: TaskGroup | None = None
        self._children: list[ActorRef[Any]] = []

    async def __aenter__(self) -> ActorSystem:
        self._task_group = anyio.create_task_group()
        await self._task_group.__aenter__()
        return self

    async def __aexit__(self, *exc_info: object) -> bool | None:
        task_group = self._task_group
        assert task_group is not None
        self.stop()
        # Past the deadline the task group's own scope cancels whatever is still running.
        deadline = anyio.current_time() + self._shutdown_timeout
        task_group.cancel_scope.deadline = deadline
        try:
            return await task_group.__aexit__(*exc_info)
        finally:
            self._task_group = None
            if anyio.current_time() >= deadline:
                # Asked for (--exit-timeout-secs), so not an error; but work was cut short.
                log.warning(
                    "actors did not stop within %.1fs (the exit timeout); cancelled",
                    self._shutdown_timeout,
                )

    async def spawn(self, actor: Actor[Any]) -> ActorRef[Any]:
        if self._task_group is None:
            raise ActorStopped("the actor system is not running")
        await self._task_group.start(_supervise, actor, self._failed)
        self._children.append(actor.ref)
        return actor.ref

    def stop(self) -> None:
        for child in self._children:
            child.stop()

    async def _failed(self, child: ActorRef[Any], error: BaseException) -> None:
        if child in self._children:
            self._children.remove(child)
        log.error("actor '%s' failed: %r", child.name, error)
        if self._on_failure is not None:
            result = self._on_failure(child, error)
            if hasattr(result, "__await__"):
                await result
