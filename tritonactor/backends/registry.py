"""Backends found through the `tritonactor.backends` entry-point group, so a third party can
add one by installing a package; `backend:` and `platform:` both resolve."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from pathlib import Path
from types import MappingProxyType

from tritonactor._proto.inference import ModelConfig
from tritonactor.backends.base import Backend
from tritonactor.config.normalize import BACKEND_PLATFORMS
from tritonactor.core.errors import TritonError, invalid_arg, unavailable

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "tritonactor.backends"

# Triton's platform names, and the model file each backend looks for by default: used when a
# config names neither a backend nor a platform.
# The platforms this server's own backends serve (config/normalize.py has Triton's table).
SERVED_PLATFORMS = {platform: backend for backend, platform in BACKEND_PLATFORMS.items()}
DEFAULT_FILES = {
    "model.onnx": "onnxruntime",
    "model.pt": "pytorch",
    "model.plan": "tensorrt",
    "model.py": "python",
}


class BackendRegistry:
    """Creates each backend once, on first use, hands it its `--backend-config` settings and
    calls its `initialize`. `config`: backend name -> settings, "" for those of every backend."""

    def __init__(
        self,
        factories: dict[str, Callable[[], Backend]] | None = None,
        config: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        if factories is None:
            factories = {ep.name: ep.load for ep in entry_points(group=ENTRY_POINT_GROUP)}
            factories = {name: _loaded(load) for name, load in factories.items()}
        self._factories = factories
        self._config = {} if config is None else config
        self._backends: dict[str, Backend] = {}
        self._lock = threading.Lock()

    @property
    def names(self) -> list[str]:
        return sorted(self._factories)

    def backend_name(self, config: ModelConfig, model_dir: Path, versions: list[int]) -> str:
        """Which backend serves this model: `backend:`, else `platform:`, else the model file
        found in its version folders."""
        if config.backend:
            return config.backend
        if config.platform:
            if config.platform == "ensemble":
                return "ensemble"
            name = SERVED_PLATFORMS.get(config.platform)
            if name is None:
                raise invalid_arg(
                    f"unexpected platform type '{config.platform}' for {config.name}; "
                    f"known platforms: {', '.join(sorted(SERVED_PLATFORMS))}"
                )
            return name
        for version in sorted(versions, reverse=True):
            for filename, name in DEFAULT_FILES.items():
                if (model_dir / str(version) / filename).exists():
                    return name
        raise invalid_arg(
            f"unable to find a backend for model '{config.name}': its config names no backend "
            f"or platform and no version folder holds {', '.join(DEFAULT_FILES)}"
        )

    def get(self, name: str) -> Backend:
        with self._lock:
            backend = self._backends.get(name)
            if backend is not None:
                return backend
            factory = self._factories.get(name)
            if factory is None:
                raise unavailable(
                    f"unable to find backend library for backend '{name}': it is not "
                    f"installed; installed backends: {', '.join(self.names) or 'none'}"
                )
            try:
                backend = factory()
                backend.backend_config = self.config_of(name)
                backend.initialize()
            except TritonError:
                raise
            except Exception as error:
                raise unavailable(f"backend '{name}' failed to initialize: {error}") from error
            self._backends[name] = backend
            return backend

    def config_of(self, name: str) -> Mapping[str, str]:
        """Backend `name`'s settings: the global ones, overlaid by its own."""
        return MappingProxyType({**self._config.get("", {}), **self._config.get(name, {})})

    def finalize(self) -> None:
        with self._lock:
            for name, backend in self._backends.items():
                try:
                    backend.finalize()
                except Exception:
                    log.exception("backend '%s' failed to finalize", name)
            self._backends.clear()


def _loaded(load: Callable[[], type[Backend]]) -> Callable[[], Backend]:
    def create() -> Backend:
        return load()()

    return create
