"""Facts of Triton's protocol that both the settings (which check what a user gives) and the
front ends (which act on it) rely on: one home for each, below both."""

from __future__ import annotations

import re

# Request parameter keys starting with this are Triton's own (a client may not send them).
RESERVED_PARAMETER_PREFIX = "triton_"

# The endpoint categories of `--http-restricted-api` / `--grpc-restricted-protocol`.
RESTRICTED_CATEGORIES = (
    "health",
    "metadata",
    "inference",
    "shared-memory",
    "model-config",
    "model-repository",
    "statistics",
    "trace",
    "logging",
)

# A repository named by a load, an unload or (over gRPC) an index: Triton's answer, UNSUPPORTED.
NAMED_REPOSITORY = "'repository_name' specification is not supported"

# RE2 (Triton's) turns case-sensitivity back on for the rest of a pattern with `(?-i)`;
# Python's re takes a flag change only at the very start (`(?i)`) or scoped (`(?-i:...)`).
_CASE_SENSITIVE = "(?-i)"


def compile_forward_pattern(pattern: str) -> re.Pattern[str] | None:
    """A `--*-header-forward-pattern` as Triton means it: case-insensitive unless it starts with
    `(?-i)`. None when empty (nothing is forwarded). Raises re.error."""
    if not pattern:
        return None
    if pattern.startswith(_CASE_SENSITIVE):
        return re.compile(pattern[len(_CASE_SENSITIVE) :])
    return re.compile(pattern, re.IGNORECASE)
