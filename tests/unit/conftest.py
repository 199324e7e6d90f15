"""Fixtures the python backend's unit tests share (test_python_backend*.py): one backend per
module, and the model processes a test starts, finalized after it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.python_backend_support import Started
from tritonactor.backends.python import PythonBackend


@pytest.fixture(scope="module")
def backend() -> PythonBackend:
    return PythonBackend()


@pytest.fixture
def start(backend: PythonBackend) -> Iterator[Started]:
    started = Started(backend)
    yield started
    started.finalize_all()
