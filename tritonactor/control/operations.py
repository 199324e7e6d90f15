"""Control-plane operations as OpenTelemetry spans: one span per load, reload or unload of a
model, with the events it recorded as span events (nothing at all when tracing is off)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry.trace import Span

from tritonactor.control import events as ev
from tritonactor.observability.tracing import MODEL_NAME, Tracing


@dataclasses.dataclass(eq=False, slots=True)
class _Operation:
    """A traced control-plane operation: its span, and what its events said."""

    span: Span
    versions: set[int] = dataclasses.field(default_factory=set)
    changed: bool = False
    outcome: str = "failed"

    def saw(self, event: ev.Event) -> None:
        attributes: dict[str, Any] = {}
        for item in dataclasses.fields(event):
            value = getattr(event, item.name)
            if item.name in ("model", "time") or value in (None, "", ()):
                continue
            if isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, str):
                value = str(value)  # an enum's value, plain
            attributes[item.name] = value
            if item.name == "version":
                self.versions.add(value)
            elif item.name == "versions":
                self.versions.update(value)
        if isinstance(event, ev.LoadRequested | ev.UnloadRequested):
            self.changed = True
        self.span.add_event(type(event).__name__, attributes)

    def close(self) -> None:
        self.span.set_attribute("tritonactor.versions", sorted(self.versions))
        self.span.set_attribute("tritonactor.outcome", self.outcome)


class OperationTraces:
    """The spans of the operations in progress, one per model at most (the manager runs one
    operation per model at a time)."""

    def __init__(self, tracing: Tracing | None) -> None:
        self._tracing = tracing
        self._running: dict[str, _Operation] = {}

    @contextmanager
    def traced(self, operation: str, name: str, source: ev.Source) -> Iterator[None]:
        """A span for one operation on one model."""
        if self._tracing is None:
            yield
            return
        attributes = {
            MODEL_NAME: name,
            "tritonactor.operation": operation,
            "tritonactor.source": source.value,
        }
        with self._tracing.operation(f"model {operation}", attributes) as span:
            current = self._running[name] = _Operation(span)
            try:
                yield
                current.outcome = "done" if current.changed else "unchanged"
            finally:
                del self._running[name]
                current.close()

    def saw(self, event: ev.Event) -> None:
        """Add a recorded event to its model's operation span, if one is running."""
        if self._running:
            operation = self._running.get(event.model)
            if operation is not None:
                operation.saw(event)
