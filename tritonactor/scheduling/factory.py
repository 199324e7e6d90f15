"""Which scheduler actor serves a model version, chosen from its config."""

from __future__ import annotations

from typing import Any

from tritonactor._proto.inference import ModelConfig
from tritonactor.actors import Actor
from tritonactor.scheduling.default import DefaultScheduler


def scheduler_for(config: ModelConfig) -> Actor[Any]:
    """The default scheduler: one request per execute, on whichever instance is idle."""
    return DefaultScheduler(config.name)
