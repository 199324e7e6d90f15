"""Loads and unloads that a model asks for (Triton's BLS model loading: `pb_utils.load_model`,
`unload_model`, `is_model_ready`). They go through the model manager's mailbox exactly as the
repository API's do, so they are recorded, serialised per model and refused alike: only in
explicit model control mode, as in Triton."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tritonactor.actors import ActorRef
from tritonactor.config.model_config import ConfigError
from tritonactor.control import events as ev
from tritonactor.control.load_parameters import LoadOptions, options_digest
from tritonactor.control.messages import Load, Override, Unload
from tritonactor.core.errors import invalid_arg, unavailable, unsupported
from tritonactor.scheduling.router import Router, parse_version


class ManagerControl:
    """`backends.base.ModelControl` on the model manager: what its instances are given."""

    def __init__(self, manager: ActorRef[Any], router: Router, mode: str) -> None:
        self._manager = manager
        self._router = router
        self._mode = mode

    def _check_explicit(self) -> None:
        if self._mode != "explicit":
            raise unavailable("explicit model load / unload is not allowed if polling is enabled")

    async def load(
        self, name: str, config: str = "", files: Mapping[str, bytes] | None = None
    ) -> None:
        self._check_explicit()
        if files:
            raise unsupported(
                f"load_model('{name}') with files: a model cannot load files through BLS in "
                "tritonactor; use the repository API's load"
            )
        override = None
        if config:
            try:
                digest = options_digest(LoadOptions(config_json=config))
            except (ConfigError, ValueError) as error:
                raise invalid_arg(f"load_model('{name}'): invalid config: {error}") from None
            override = Override(config, None, digest)
        await self._manager.ask(lambda reply: Load(reply, name, override, ev.Source.API))

    async def unload(self, name: str, unload_dependents: bool = False) -> None:
        """As Triton's: returns once the model left the router, not once it stopped (a model
        may unload itself, or one whose requests wait on it). `unload_dependents` changes
        nothing: the ensembles that run the model are away with it either way."""
        self._check_explicit()
        await self._manager.ask(lambda reply: Unload(reply, name, ev.Source.API, wait=False))

    async def ready(self, name: str, version: str = "") -> bool:
        versions = self._router.ready_versions(name)
        if not version:
            return bool(versions)
        return parse_version(version) in versions
