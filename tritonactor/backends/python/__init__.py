"""Triton's python backend: each model instance runs `model.py` in a stub process of its own.

The stub imports this package too, possibly under another interpreter, so the server side
(`backend`, which needs anyio and the rest of tritonactor) is imported only when asked for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tritonactor.backends.python.backend import PythonBackend, PythonInstance, PythonModel

__all__ = ["PythonBackend", "PythonInstance", "PythonModel"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from tritonactor.backends.python import backend

        return getattr(backend, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
