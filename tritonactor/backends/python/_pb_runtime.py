"""The link between `triton_python_backend_utils` and the stub that runs this process's model.
Inside a stub process `stub` is set at start; imported anywhere else it stays None, and what
needs the server (BLS, response senders, the logger's server side) says so."""

from __future__ import annotations

from typing import Any

from tritonactor.backends.python._pb_tensors import TritonModelException

# The stub that runs this process's model: set by tritonactor.backends.python.stub.
stub: Any = None


def require(what: str) -> Any:
    if stub is None:
        raise TritonModelException(f"{what} works only inside a model served by tritonactor")
    return stub
