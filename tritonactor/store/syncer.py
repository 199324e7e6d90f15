"""The actor that keeps the server's mirrors of object-store repositories up to date.

In poll mode it lists each store every poll interval. A model whose objects differ from its
copy is copied once two listings in a row agree on them: a model still being uploaded is not
copied, as a local folder still being written is not loaded. The copy lands in the mirror
folder, where poll mode's watcher finds it as it finds any changed folder, settles it, and
the model manager reloads it. A store that cannot be listed changes nothing (no model is
taken for removed); the failure is logged when it starts and when it ends.

In explicit mode a load asks it to `Refresh` the model first (with the models its ensemble
steps name): its copy is brought up to date at once, as Triton reads the store at each load,
and no other model's files change under it. The repository index asks it to copy the models
that have no copy yet, so that it lists them. Each model is copied on its own: one that
cannot be copied fails its own load, not the others'.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from tritonactor.actors import Actor, Reply
from tritonactor.config.model_config import ConfigError, read_pbtxt
from tritonactor.store.mirror import Listing, StoreMirror
from tritonactor.store.remote import ObjectInfo, StoreError

__all__ = ["Refresh", "StoreSyncer"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Refresh:
    """Ask: bring a model's copy up to date with the stores now, settled or not, and copy the
    models its ensemble steps name that have no copy yet (`name`); or (None, what the index
    lists) copy the models no copy has yet and drop the copies of models gone from the store
    but those in `keep` (what is loaded). Other copies stay as they were loaded. Fails with a
    StoreError when a store cannot be listed or the named model cannot be copied."""

    reply: Reply[None]
    name: str | None = None
    keep: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class _Poll:
    pass


class StoreSyncer(Actor[Any]):
    """Keeps `mirrors` up to date: every `interval` seconds when given (poll mode), and on
    `Refresh`."""

    def __init__(self, mirrors: Sequence[StoreMirror], interval: float | None = None) -> None:
        super().__init__("store-syncer")
        self._mirrors = tuple(mirrors)
        self._interval = interval
        # (location, model) -> the objects the last listing showed (None: no model), while
        # they differ from the copy.
        self._probes: dict[tuple[str, str], dict[str, ObjectInfo] | None] = {}
        self._failing: set[str] = set()

    async def started(self) -> None:
        if self._interval:
            self.tell_later(_Poll(), self._interval)

    async def receive(self, message: Any) -> None:
        match message:
            case _Poll():
                try:
                    await self.poll()
                except Exception:  # never the end of polling: logged, tried at the next poll
                    log.exception("polling the object stores failed")
                assert self._interval is not None
                self.tell_later(_Poll(), self._interval)
            case Refresh(reply, name, keep):
                try:
                    await (self._refresh_new(keep) if name is None else self._refresh(name))
                except StoreError as error:
                    reply.fail(error)
                except Exception as error:
                    log.exception("refreshing the object stores failed")
                    reply.fail(StoreError(f"cannot read the object stores: {error}"))
                else:
                    reply.set(None)

    async def poll(self) -> list[str]:
        """One poll of every store: copies the models whose objects are the same as at the
        previous poll and differ from the copy. Returns "location/model" for each copied; a
        model that could not be copied is tried again once its objects change."""
        copied: list[str] = []
        for mirror in self._mirrors:
            listing = await self._list(mirror)
            if listing is None:
                continue
            settled: list[str] = []
            changed = mirror.changed(listing)
            for name in changed:
                key = (str(mirror), name)
                probe = listing.get(name)
                if key in self._probes and self._probes[key] == probe:
                    settled.append(name)
                    del self._probes[key]
                else:
                    self._probes[key] = probe  # new, or still changing: wait for the next poll
            for key in [key for key in self._probes if key[0] == str(mirror)]:
                if key[1] not in changed:
                    del self._probes[key]  # back as it was copied
            if settled:
                # A model that cannot be copied is logged, and tried again once it changes.
                result = await anyio.to_thread.run_sync(mirror.sync, listing, list(settled))
                copied += [f"{mirror}/{name}" for name in result.done]
        return copied

    async def _refresh(self, name: str) -> None:
        listings = [await self._list_or_raise(mirror) for mirror in self._mirrors]
        pending, seen = [name], set()
        while pending:
            model = pending.pop()
            if model in seen:
                continue
            seen.add(model)
            for mirror, listing in zip(self._mirrors, listings, strict=True):
                if model not in listing and mirror.synced(model) is None:
                    continue
                # A step that has a copy may serve: the manager loads only steps that do not,
                # so its copy stays as it was loaded.
                if model == name or mirror.synced(model) is None:
                    result = await anyio.to_thread.run_sync(mirror.sync, listing, [model])
                    if model == name and model in result.failed:
                        raise StoreError(result.failed[model])
                pending += await anyio.to_thread.run_sync(_steps, mirror.root / model)

    async def _refresh_new(self, keep: frozenset[str]) -> None:
        for mirror in self._mirrors:
            listing = await self._list_or_raise(mirror)
            names = mirror.new(listing) | (mirror.gone(listing) - keep)
            await anyio.to_thread.run_sync(mirror.sync, listing, names)

    async def _list_or_raise(self, mirror: StoreMirror) -> Listing:
        """The store's listing, or its StoreError with the reason (for a load to answer)."""
        return await anyio.to_thread.run_sync(mirror.listing)

    async def _list(self, mirror: StoreMirror) -> Listing | None:
        try:
            listing = await anyio.to_thread.run_sync(mirror.listing)
        except StoreError as error:
            if str(mirror) not in self._failing:
                log.error("%s; until it can be read, its models stay as they are", error)
                self._failing.add(str(mirror))
            return None
        if str(mirror) in self._failing:
            log.warning("%s can be read again", mirror)
            self._failing.discard(str(mirror))
        return listing


def _steps(folder: Path) -> list[str]:
    """The models an ensemble's steps name, read from its copied config (none for another
    model, or a config that cannot be read: its load says why)."""
    try:
        config = read_pbtxt(folder / "config.pbtxt")
    except ConfigError:
        return []
    scheduling = config.ensemble_scheduling
    return [step.model_name for step in scheduling.step] if scheduling is not None else []
