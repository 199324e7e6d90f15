"""A one-shot reply slot: how `ask` gets its answer back from an actor."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class Reply(Generic[T]):
    """Set once, with a value or an error; awaited by whoever asked."""

    __slots__ = ("_callbacks", "_done", "_error", "_value", "_waiters")

    def __init__(self) -> None:
        # One future per waiting task, made only when someone waits before the answer (a
        # cancelled waiter cancels its own future, never another's).
        self._waiters: list[asyncio.Future[None]] | None = None
        self._done = False
        self._value: T | None = None
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[Reply[T]], None]] = []

    @property
    def done(self) -> bool:
        return self._done

    @property
    def error(self) -> BaseException | None:
        """The error it was failed with (None while unanswered or when it has a value)."""
        return self._error

    def set(self, value: T) -> None:
        if not self._done:
            self._done = True
            self._value = value
            self._finish()

    def fail(self, error: BaseException) -> None:
        if not self._done:
            self._done = True
            self._error = error
            self._finish()

    def add_done_callback(self, callback: Callable[[Reply[T]], None]) -> None:
        """Call `callback(reply)` once it is answered (at once if it already is): a way to
        collect many answers without a waiting task for each."""
        if self._done:
            callback(self)
        else:
            self._callbacks.append(callback)

    def result(self) -> T:
        """The answer of a done reply; raises its error."""
        if not self._done:
            raise RuntimeError("the reply has no answer yet")
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]

    def _finish(self) -> None:
        waiters, self._waiters = self._waiters, None
        if waiters is not None:
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            # A callback runs inside whichever actor answered: its failure is the caller's
            # problem, logged here, never that actor's.
            try:
                callback(self)
            except Exception:
                log.exception("a reply callback failed")

    async def wait(self) -> T:
        if not self._done:
            waiter = asyncio.get_running_loop().create_future()
            if self._waiters is None:
                self._waiters = [waiter]
            else:
                self._waiters.append(waiter)
            try:
                await waiter
            finally:
                if self._waiters is not None and waiter in self._waiters:
                    self._waiters.remove(waiter)
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]
