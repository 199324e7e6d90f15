"""The object store itself, through fsspec: list a folder's objects, download some of them.

fsspec with the store's own library (s3fs, gcsfs, adlfs) speaks the protocol; nothing here
does. Credentials and the endpoint come from where the store's library looks: for S3 the
`AWS_*` variables (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`,
`AWS_DEFAULT_REGION`, `AWS_PROFILE`, `AWS_ENDPOINT_URL`) and `~/.aws`; a location at an
address (`s3://host:port/…`) sets the endpoint itself. Blocking: called from worker threads.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tritonactor.store.location import StoreLocation

__all__ = ["ObjectInfo", "StoreError", "download", "list_objects", "open_filesystem"]

log = logging.getLogger(__name__)

# The module each fsspec protocol needs, to say which extra installs it when it is missing.
_MODULES = {"s3": "s3fs", "gcs": "gcsfs", "abfs": "adlfs"}


class StoreError(Exception):
    """An object store that cannot be read: its library missing, the bucket absent, no
    credentials, the endpoint unreachable. The message names the location."""


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """What says an object changed: its ETag (or the store's equivalent), size and modification
    time as the store reports them."""

    etag: str
    size: int
    modified: str

    def as_json(self) -> list[Any]:
        return [self.etag, self.size, self.modified]

    @classmethod
    def from_json(cls, value: Sequence[Any]) -> ObjectInfo:
        etag, size, modified = value
        return cls(str(etag), int(size), str(modified))


def open_filesystem(location: StoreLocation) -> Any:
    """An fsspec filesystem for `location`'s store, with no listing cache (every listing asks
    the store). StoreError when the store's library is not installed."""
    module = _MODULES[location.protocol]
    try:
        importlib.import_module(module)
    except ImportError:
        raise StoreError(
            f"{location}: reading {location.scheme}:// needs {module}: "
            f"pip install 'tritonactor[{location.extra}]'"
        ) from None
    import fsspec

    options: dict[str, Any] = {"skip_instance_cache": True, "use_listings_cache": False}
    if location.protocol == "s3":
        # botocore's defaults retry an unreachable endpoint for long before saying so.
        options["config_kwargs"] = {
            "connect_timeout": 5,
            "read_timeout": 60,
            "retries": {"max_attempts": 3, "mode": "standard"},
        }
    if location.endpoint is not None:
        options["endpoint_url"] = location.endpoint
    if location.account is not None:
        options["account_name"] = location.account
    return fsspec.filesystem(location.protocol, **options)


def list_objects(filesystem: Any, location: StoreLocation) -> dict[str, ObjectInfo]:
    """Every object under the location, by key relative to it ("model/1/model.onnx"); a
    folder marker (a key ending in "/", how a store keeps an empty folder) keeps its slash.
    StoreError when the bucket cannot be listed; an empty prefix lists nothing."""
    try:
        found: Mapping[str, Mapping[str, Any]] = filesystem.find(location.root, detail=True)
    except FileNotFoundError as missing:
        raise _not_found(filesystem, location, missing) from None
    except Exception as error:  # the store's library raises its own kinds
        raise StoreError(f"{location}: cannot list the objects: {_reason(error)}") from error
    root = location.root + "/"
    objects: dict[str, ObjectInfo] = {}
    for path, info in found.items():
        path = path.lstrip("/")
        if not path.startswith(root):
            continue
        key = path[len(root) :]
        if info.get("type") != "directory" and key.strip("/"):
            objects[key] = _info(info)
    return objects


def _not_found(filesystem: Any, location: StoreLocation, missing: Exception) -> StoreError:
    """s3fs ends a failed listing of an unreachable store, too, with FileNotFoundError: one
    small request of its own, under the same prefix (what a policy that grants listing by
    prefix allows), tells a missing bucket from the rest."""
    if location.protocol == "s3":
        prefix = location.prefix + "/" if location.prefix else ""
        try:
            filesystem.call_s3("list_objects_v2", Bucket=location.bucket, Prefix=prefix, MaxKeys=1)
        except FileNotFoundError:
            pass
        except Exception as error:
            return StoreError(f"{location}: cannot list the objects: {_reason(error)}")
        else:
            return StoreError(f"{location}: cannot list the objects: {_reason(missing)}")
    return StoreError(f"{location}: the bucket '{location.bucket}' does not exist")


def download(
    filesystem: Any, location: StoreLocation, keys: Sequence[str], targets: Sequence[str]
) -> None:
    """Each object `keys[i]` into the local file `targets[i]` (concurrently where the store's
    library can). StoreError when one cannot be read."""
    if not keys:
        return
    paths = [f"{location.root}/{key}" for key in keys]
    try:
        filesystem.get(paths, list(targets))
    except Exception as error:
        raise StoreError(f"{location}: cannot download the objects: {_reason(error)}") from error


def _info(info: Mapping[str, Any]) -> ObjectInfo:
    etag = info.get("ETag") or info.get("etag") or info.get("md5Hash") or ""
    modified = (
        info.get("LastModified")
        or info.get("updated")
        or info.get("last_modified")
        or info.get("mtime")
        or ""
    )
    return ObjectInfo(str(etag).strip('"'), int(info.get("size") or 0), str(modified))


def _reason(error: BaseException) -> str:
    text = str(error) or type(error).__name__
    return text if len(text) <= 300 else text[:300] + "…"
