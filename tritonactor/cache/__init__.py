"""Triton's response cache (`--cache-config local,size=N`): answers a request whose twin was
answered before without running the model.

- `key.py`: what makes two requests the same request (`request_key`).
- `entry.py`: a response as the cache keeps it, one immutable blob (`measure`, `pack`, `unpack`).
- `store.py`: the `local` cache itself, bounded in bytes, least recently used out first.
- `config.py`: which models use it, and the configs Triton refuses with it.

The router looks requests up and stores the answers of those it missed; the server owns the one
cache of its process. docs/response-cache.md says what is cached and counted."""

from tritonactor.cache.config import caches_responses, check_model_config
from tritonactor.cache.entry import Measure, measure, pack, rough_work, unpack
from tritonactor.cache.key import request_key
from tritonactor.cache.store import CacheSample, Inserted, ResponseCache

__all__ = [
    "CacheSample",
    "Inserted",
    "Measure",
    "ResponseCache",
    "caches_responses",
    "check_model_config",
    "measure",
    "pack",
    "request_key",
    "rough_work",
    "unpack",
]
