"""Triton's header forwarding: request headers (HTTP) or call metadata (gRPC) whose name matches
`--http-header-forward-pattern` / `--grpc-header-forward-pattern` reach the model as string
request parameters.

The pattern is matched as Triton's RE2 does it: anywhere in the name (a partial match) and
without regard to case, unless it starts with `(?-i)`, which makes it case-sensitive. HTTP
header names arrive lower-cased (hypercorn gives them so), gRPC metadata keys always are.
"""

from __future__ import annotations

from collections.abc import Iterable

from tritonactor.core.protocol import compile_forward_pattern
from tritonactor.core.types import InferenceRequest


class HeaderForwarder:
    """Copies the matching headers of a call into its request's parameters."""

    __slots__ = ("_pattern",)

    def __init__(self, pattern: str) -> None:
        self._pattern = compile_forward_pattern(pattern)

    @property
    def enabled(self) -> bool:
        return self._pattern is not None

    def forward(self, request: InferenceRequest, headers: Iterable[tuple[str, str]]) -> None:
        """Hand the model each header whose name matches, as a string parameter
        (`request.headers`, which the server itself never acts on)."""
        pattern = self._pattern
        if pattern is None:
            return
        for name, value in headers:
            if pattern.search(name):
                request.headers.setdefault(name, value)
