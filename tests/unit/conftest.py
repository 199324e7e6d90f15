"""Fixtures the python backend's unit tests share (test_python_backend*.py): one backend per
module, and the model processes a test starts, finalized after it."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.python_backend_support import Started
from tritonactor.backends.python import PythonBackend, PythonInstance, ipc
from tritonactor.backends.python.process import StubSettings


@pytest.fixture(scope="module")
def backend() -> PythonBackend:
    return PythonBackend()


@pytest.fixture(scope="module")
def arena_backend() -> PythonBackend:
    """A backend whose executes send every tensor, however small, through shared memory (the
    arenas), where the served one sends tensors of a few KiB inside the messages."""
    backend = PythonBackend()
    backend.settings = StubSettings(inline_limit=0)  # type: ignore[misc]
    return backend


@pytest.fixture
def start(backend: PythonBackend) -> Iterator[Started]:
    started = Started(backend)
    yield started
    started.finalize_all()


@pytest.fixture(params=["inline", "arenas"])
def start_either(
    request: pytest.FixtureRequest, backend: PythonBackend, arena_backend: PythonBackend
) -> Iterator[Started]:
    """`start` twice: small tensors inside the messages, as served, then every tensor through
    both sides' arenas; each run checks the path it took (the arenas' files exist or not)."""
    arenas = request.param == "arenas"
    started = Started(arena_backend if arenas else backend)
    yield started
    try:
        for instance in started.instances:
            made = arena_files(instance)
            if arenas:
                assert made["server"] and made["stub"], made
            else:
                assert not made["server"] and not made["stub"], made
    finally:
        started.finalize_all()


def arena_files(instance: PythonInstance) -> dict[str, list[str]]:
    """The arena files of an instance's server side (its inputs) and its stub's (results)."""
    prefix = instance._stub.shm_prefix
    sides = {
        "server": f"{prefix}{ipc.SERVER_SIDE}-arena-",
        "stub": f"{prefix}{ipc.STUB_SIDE}-arena-",
    }
    names = os.listdir(ipc.SHM_DIR)
    return {side: [n for n in names if n.startswith(start)] for side, start in sides.items()}
