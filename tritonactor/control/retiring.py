"""The model manager's retiring part: versions leaving (versions coming are loading.py's). An
unload, a folder gone from the repository, a reload's predecessor: each version is taken out of
the router at once, finishes the requests it holds, stops, and its leaving is recorded (the
ensembles that run a model gone are the router's to take away: `Router._show`).

`Retiring` is mixed into `ModelManager` (tritonactor/control/manager.py), whose state it works
on: the serving table, the router, the owners of the version actors, the per-model locks, the
journal's record.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio

from tritonactor.control import events as ev
from tritonactor.control.override_folders import release
from tritonactor.control.serving import Serving, drain

if TYPE_CHECKING:
    from tritonactor.actors import ActorRef
    from tritonactor.control.operations import OperationTraces
    from tritonactor.scheduling.router import Router

__all__ = ["Retiring"]


class Retiring:
    """How versions leave; mixed into the model manager, which owns the state named here."""

    _serving: dict[str, dict[int, Serving]]
    _router: Router
    _owners: dict[ActorRef[Any], tuple[str, int]]
    _operations: OperationTraces
    state: ev.State
    _in_doubt: Callable[[str], bool]  # (Loading's)

    async def _unload(
        self,
        name: str,
        source: ev.Source,
        left: Callable[[], None] | None = None,
    ) -> None:
        """Unload `name`; `left()` is called once its versions left the router, before they
        finish their requests and stop. The loaded ensembles that run it leave the router with
        it and come back as it serves again (`Router._show`), with `unload_dependents` or
        without, as Triton 2.51's do."""
        try:
            async with self._lock(name):
                with self._operations.traced("unload", name, source):
                    await self._unload_versions(name, source, left)
        finally:
            self._forget_lock(name)

    async def _unload_versions(
        self, name: str, source: ev.Source, left: Callable[[], None] | None = None
    ) -> None:
        versions = tuple(sorted(self._serving.get(name, {})))
        if versions:
            self._record(ev.UnloadRequested(model=name, versions=versions, source=source))
            leaving = [(version, self._take_out(name, version)) for version in versions]
            if left is not None:
                left()
            async with anyio.create_task_group() as group:
                for version, serving in leaving:
                    group.start_soon(self._stop_retired, name, version, serving, "")
            return
        status = self.state.get(name)
        if (
            source == ev.Source.API
            and status is not None
            and (status.wanted or self._in_doubt(name))
        ):
            # Not loaded (a failed load), but asked for, or in doubt (an unreadable journal
            # line): no longer; on record, which settles the doubt as a load does. (A name the
            # server never knew gets no record: clients choose names.)
            self._record(ev.UnloadRequested(model=name, versions=(), source=source))

    async def _vanished(self, name: str, source: ev.Source) -> None:
        """The model's folder is gone: unload what serves and stop listing it."""
        versions = tuple(sorted(self._serving.get(name, {})))
        if versions:
            reason = "the model left the repository"
            self._record(
                ev.UnloadRequested(model=name, versions=versions, source=source, reason=reason)
            )
            async with anyio.create_task_group() as group:
                for version in versions:
                    group.start_soon(self._retire, name, version, reason)
        if name in self.state and source == ev.Source.POLL:
            self._record(ev.ModelRemoved(model=name))

    async def _retire(self, name: str, version: int, reason: str) -> None:
        """Take a version out of the router, let it finish its requests, stop it."""
        await self._stop_retired(name, version, self._take_out(name, version), reason)

    def _take_out(self, name: str, version: int) -> Serving | None:
        """The version no longer serves: out of the table and the router (None: it did not)."""
        versions = self._serving.get(name, {})
        serving = versions.pop(version, None)
        if not versions:
            self._serving.pop(name, None)
        if serving is not None and self._router.resolve_exact(name, version) is serving.handle:
            self._router.remove(name, version)
        return serving

    async def _stop_retired(
        self, name: str, version: int, serving: Serving | None, reason: str
    ) -> None:
        """Let a version taken out finish its requests, stop it, record it."""
        if serving is None:
            return
        await self._drain_and_stop(serving)
        await anyio.to_thread.run_sync(release, serving.folder, name)
        self._record(ev.ModelUnloaded(model=name, version=version, reason=reason))

    async def _replace(self, old: Serving) -> None:
        started = time.perf_counter()
        await self._drain_and_stop(old)
        await anyio.to_thread.run_sync(release, old.folder, old.handle.name)
        self._record(
            ev.VersionReplaced(
                model=old.handle.name,
                version=old.handle.version,
                drain_seconds=time.perf_counter() - started,
            )
        )

    async def _drain_and_stop(self, serving: Serving) -> None:
        await drain(serving)
        self._owners.pop(serving.ref, None)
        await self.stop_child(serving.ref)
