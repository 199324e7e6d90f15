"""A ready model version as the router serves it (what the front ends and the response cache's
work hold of a version)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tritonactor._proto.inference import ModelConfig
from tritonactor.actors import ActorRef
from tritonactor.scheduling.signature import ModelSignature
from tritonactor.scheduling.statistics import VersionStatistics


@dataclass(frozen=True, slots=True)
class ModelHandle:
    """A ready model version as the router serves it."""

    name: str
    version: int
    config: ModelConfig
    signature: ModelSignature
    scheduler: ActorRef[Any]
    # Shared with the version's instance actors, which record into it.
    statistics: VersionStatistics = field(default_factory=lambda: VersionStatistics(False))

    @property
    def decoupled(self) -> bool:
        """Whether the model may answer a request with any number of responses."""
        policy = self.config.model_transaction_policy
        return policy is not None and policy.decoupled
