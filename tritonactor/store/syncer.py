"""The actor that keeps the server's mirrors of object-store repositories up to date.

In poll mode it lists each store every poll interval. A model whose objects differ from its
copy is copied once two listings in a row agree on them: a model still being uploaded is not
copied, as a local folder still being written is not loaded. The copy lands in the mirror
folder, where poll mode's watcher finds it as it finds any changed folder, settles it, and
the model manager reloads it. A store that cannot be listed changes nothing (no model is
taken for removed); the failure is logged when it starts and when it ends.

In explicit mode the loads and the repository index ask it to `Refresh` first: the changed
models are copied at once, as Triton reads the store at each load.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import anyio

from tritonactor.actors import Actor, Reply
from tritonactor.store.mirror import Listing, StoreMirror
from tritonactor.store.remote import StoreError

__all__ = ["Refresh", "StoreSyncer"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Refresh:
    """Ask: list every store now and copy each changed model, settled or not. Fails with
    the StoreError of a store that cannot be read (the others are still refreshed)."""

    reply: Reply[None]


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
        # (location, model) -> the digest of the objects the last listing showed, while they
        # differ from the copy.
        self._probes: dict[tuple[str, str], str] = {}
        self._failing: set[str] = set()

    async def started(self) -> None:
        if self._interval:
            self.tell_later(_Poll(), self._interval)

    async def receive(self, message: Any) -> None:
        match message:
            case _Poll():
                await self.poll()
                assert self._interval is not None
                self.tell_later(_Poll(), self._interval)
            case Refresh(reply):
                try:
                    await self._refresh()
                except StoreError as error:
                    reply.fail(error)
                else:
                    reply.set(None)

    async def poll(self) -> list[str]:
        """One poll of every store: copies the models whose objects are the same as at the
        previous poll and differ from the copy. Returns "location/model" for each copied."""
        copied: list[str] = []
        for mirror in self._mirrors:
            listing = await self._list(mirror)
            if listing is None:
                continue
            settled = []
            changed = mirror.changed(listing)
            for name in changed:
                key = (str(mirror), name)
                probe = _digest(listing.get(name))
                if self._probes.get(key) == probe:
                    settled.append(name)
                    del self._probes[key]
                else:
                    self._probes[key] = probe  # new, or still changing: wait for the next poll
            for key in [key for key in self._probes if key[0] == str(mirror)]:
                if key[1] not in changed:
                    del self._probes[key]  # back as it was copied
            if settled:
                copied += [
                    f"{mirror}/{name}" for name in await self._sync(mirror, listing, settled)
                ]
        return copied

    async def _refresh(self) -> None:
        failure: StoreError | None = None
        for mirror in self._mirrors:
            try:
                listing = await anyio.to_thread.run_sync(mirror.listing)
                await anyio.to_thread.run_sync(mirror.sync, listing)
            except StoreError as error:
                failure = failure or error
                log.error("%s", error)
        if failure is not None:
            raise failure

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

    async def _sync(self, mirror: StoreMirror, listing: Listing, names: list[str]) -> list[str]:
        try:
            return await anyio.to_thread.run_sync(mirror.sync, listing, names)
        except StoreError as error:
            log.warning("%s; tried again at the next poll", error)
            return []


def _digest(objects: dict[str, Any] | None) -> str:
    if objects is None:
        return ""
    text = "\n".join(f"{key}\0{info!r}" for key, info in sorted(objects.items()))
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()
