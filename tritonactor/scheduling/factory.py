"""Which scheduler actor serves a model version, chosen from its config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tritonactor._proto.inference import ModelConfig
from tritonactor.actors import Actor
from tritonactor.backends.base import InferFunction
from tritonactor.core.errors import unavailable
from tritonactor.scheduling.default import DefaultScheduler
from tritonactor.scheduling.dynamic import DynamicBatcher
from tritonactor.scheduling.ensemble import EnsembleScheduler
from tritonactor.scheduling.sequence import SequenceBatcher


def scheduler_for(
    config: ModelConfig, infer: InferFunction | None = None, model_dir: Path | None = None
) -> Actor[Any]:
    """The ensemble scheduler for an ensemble (its steps go through `infer`, the router's);
    the sequence batcher for a stateful model (`sequence_batching`; it reads implicit state's
    `initial_state/` files from `model_dir`); the dynamic batcher for a model that asks for it
    (one that does not batch too, for its queues' priorities and policies, as in Triton); else
    the default scheduler: one request per execute, on whichever instance is idle."""
    if config.ensemble_scheduling is not None:
        if infer is None:
            raise unavailable(f"ensemble '{config.name}' needs the router to run its steps")
        return EnsembleScheduler(config.name, config, infer)
    if config.sequence_batching is not None:
        return SequenceBatcher(config.name, config, model_dir)
    if config.dynamic_batching is not None:  # (max_batch_size 0 too: its queue policies)
        return DynamicBatcher(config.name, config)
    return DefaultScheduler(config.name)
