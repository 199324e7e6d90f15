"""A one-shot reply slot: how `ask` gets its answer back from an actor."""

from __future__ import annotations

from typing import Generic, TypeVar

import anyio

T = TypeVar("T")


class Reply(Generic[T]):
    """Set once, with a value or an error; awaited by whoever asked."""

    __slots__ = ("_done", "_error", "_event", "_value")

    def __init__(self) -> None:
        self._event = anyio.Event()
        self._done = False
        self._value: T | None = None
        self._error: BaseException | None = None

    @property
    def done(self) -> bool:
        return self._done

    def set(self, value: T) -> None:
        if not self._done:
            self._done = True
            self._value = value
            self._event.set()

    def fail(self, error: BaseException) -> None:
        if not self._done:
            self._done = True
            self._error = error
            self._event.set()

    async def wait(self) -> T:
        await self._event.wait()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]
