"""Settings shared by every test."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    """The server runs on asyncio (grpclib and the ASGI servers need it), so async tests do too.

    anyio's own fixture would run each test once per event loop installed, trio included,
    wherever trio happens to be importable (CI's interpreter has an old one)."""
    return "asyncio"
