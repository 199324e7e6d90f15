"""What the settings' modules share: their error, the control modes, and the default places."""

from __future__ import annotations

import os
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path


class SettingsError(ValueError):
    """A setting that cannot be used; says which variable, its value and what is allowed."""

    def __init__(self, message: str, variable: str | None = None) -> None:
        super().__init__(message)
        # Lets the CLI say which flag set the bad value.
        self.variable = variable


class ControlMode(StrEnum):
    NONE = "none"
    POLL = "poll"
    EXPLICIT = "explicit"


def example_repository() -> Path:
    """The model repository shipped inside the package, served when no repository is given."""
    # Relative to this module rather than ``tritonactor.__file__``: the package may be a namespace
    # package, whose ``__file__`` is None.
    return Path(__file__).resolve().parent.parent / "examples" / "models"


def default_journal(env: Mapping[str, str] | None = None) -> Path:
    """Where the control-plane journal lives unless TRITONACTOR_JOURNAL says otherwise.

    A per-user state directory, never inside a model repository: the repository watcher would
    take every journal write for a change to the models.
    """
    env = os.environ if env is None else env
    state_home = env.get("XDG_STATE_HOME", "")
    # The XDG spec says a relative XDG_STATE_HOME is invalid and must be ignored.
    if not state_home or not os.path.isabs(state_home):
        home = env.get("HOME") or str(Path.home())
        state_home = os.path.join(home, ".local", "state")
    return Path(state_home) / "tritonactor" / "journal.jsonl"


def default_repository_cache(env: Mapping[str, str] | None = None) -> Path:
    """Where object-store repositories are copied unless TRITONACTOR_REPOSITORY_CACHE_DIR says
    otherwise: Triton's TRITON_AWS_MOUNT_DIRECTORY when set (its folder for what it downloads
    from S3), else a per-user cache directory."""
    env = os.environ if env is None else env
    mount = env.get("TRITON_AWS_MOUNT_DIRECTORY", "")
    if mount and os.path.isabs(mount):
        return Path(mount)
    cache_home = env.get("XDG_CACHE_HOME", "")
    if not cache_home or not os.path.isabs(cache_home):
        home = env.get("HOME") or str(Path.home())
        cache_home = os.path.join(home, ".cache")
    return Path(cache_home) / "tritonactor" / "repositories"
