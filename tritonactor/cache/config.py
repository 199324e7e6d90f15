"""Which models use the response cache, and the model configs Triton refuses with it."""

from __future__ import annotations

from collections.abc import Iterable

from tritonactor._proto.inference import ModelConfig
from tritonactor.config.model_config import ConfigError


def caches_responses(config: ModelConfig) -> bool:
    """Whether the config asks for the response cache (`response_cache { enable: true }`)."""
    cache = config.response_cache
    return cache is not None and cache.enable


def check_model_config(config: ModelConfig, steps: Iterable[ModelConfig] = ()) -> None:
    """Refuse (ConfigError), as Triton 2.51 does and in its words, a config that asks for the
    response cache on a model with the sequence batcher or a decoupled transaction policy; an
    ensemble counts as decoupled when one of its step models (`steps`: the configs of those
    loaded) is, as Triton makes it. Refused whether or not the server has a cache, as in
    Triton, where it is a rule of the model config."""
    if not caches_responses(config):
        return
    if config.sequence_batching is not None:
        raise ConfigError(
            f"Response Cache does not currently support model {config.name} with sequence "
            "batching scheduler. Please disable the response cache."
        )
    if _decoupled(config) or (
        config.ensemble_scheduling is not None and any(_decoupled(step) for step in steps)
    ):
        raise ConfigError(
            f"Response Cache does not currently support model {config.name} with 'decoupled' "
            "transaction policy. Please disable the response cache."
        )


def _decoupled(config: ModelConfig) -> bool:
    policy = config.model_transaction_policy
    return policy is not None and policy.decoupled
