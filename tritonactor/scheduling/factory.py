"""Which scheduler actor serves a model version, chosen from its config."""

from __future__ import annotations

from typing import Any

from tritonactor._proto.inference import ModelConfig
from tritonactor.actors import Actor
from tritonactor.scheduling.default import DefaultScheduler
from tritonactor.scheduling.dynamic import DynamicBatcher


def scheduler_for(config: ModelConfig) -> Actor[Any]:
    """The dynamic batcher for a batching model that asks for it; else the default scheduler:
    one request per execute, on whichever instance is idle."""
    if config.dynamic_batching is not None and config.max_batch_size > 0:
        return DynamicBatcher(config.name, config)
    return DefaultScheduler(config.name)
