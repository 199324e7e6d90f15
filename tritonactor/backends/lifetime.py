"""An instance that can die on its own (a python model's process) and how it says so.

In-process backends (ONNX Runtime, PyTorch, TensorRT) cannot die apart from the server: they
have nothing to report. A backend instance that runs elsewhere implements `WatchedInstance`, so
that its death is noticed when it happens, not when the next batch meets it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from tritonactor.backends.base import InstanceDied


class BatchNotRun(InstanceDied):
    """Raised by `execute` when the instance was already dead before the batch reached it: no
    part of the batch ran, so its requests may run on another instance (the replacement)."""


@runtime_checkable
class WatchedInstance(Protocol):
    """A backend instance that reports its own death."""

    def on_death(self, callback: Callable[[str], None]) -> None:
        """Call `callback(reason)` once, from any thread, when the instance dies (at once when
        it already has). Not called when it ends because it was finalized."""
