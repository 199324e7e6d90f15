"""Where a model repository in object storage is: Triton's URL forms, read into parts.

- `s3://bucket/path`: Amazon S3, or the store `AWS_ENDPOINT_URL` names;
- `s3://host:port/bucket/path` (also `s3://http://host:port/…`, `s3://https://host:port/…`):
  an S3-compatible store at that address, plain HTTP unless `https://` is given, as in Triton;
- `gs://bucket/path`: Google Cloud Storage;
- `as://account/container/path`: Azure Storage.

Pure: nothing here touches the network, so the settings can read a URL without the store's
library installed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SCHEMES", "StoreLocation", "is_store_url", "parse_location"]

# The schemes Triton reads, each with the fsspec protocol and the extra that provides it.
SCHEMES: dict[str, tuple[str, str]] = {
    "s3": ("s3", "s3"),
    "gs": ("gcs", "gcs"),
    "as": ("abfs", "azure"),
}

_SCHEME = re.compile(r"([a-z][a-z0-9+.-]*)://", re.IGNORECASE)
# Triton's address form: an optional protocol, then host:port before the bucket.
_ADDRESS = re.compile(r"(?:(https?)://)?([0-9A-Za-z.-]+):([0-9]+)/(.*)")
# What any of the stores allows in a bucket (container) name: S3's legacy names have capitals
# and underscores, GCS's have underscores and up to 222 characters with dots. The store itself
# refuses a name it does not allow.
_BUCKET = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,221}")


@dataclass(frozen=True, slots=True)
class StoreLocation:
    """A folder in an object store: `bucket` and `prefix` ("" for the whole bucket; never a
    leading or trailing slash), and for S3 at an address, the `endpoint` URL. For Azure the
    bucket is the container and `account` the storage account. `str()` is the URL, in the form
    `parse_location` reads back to an equal location."""

    scheme: str
    bucket: str
    prefix: str = ""
    endpoint: str | None = None
    account: str | None = None

    def __str__(self) -> str:
        head = self.scheme + "://"
        if self.endpoint is not None:
            protocol, _, address = self.endpoint.partition("://")
            head += ("https://" if protocol == "https" else "") + address + "/"
        if self.account is not None:
            head += self.account + "/"
        return head + "/".join(part for part in (self.bucket, self.prefix) if part)

    @property
    def protocol(self) -> str:
        """fsspec's name for the store."""
        return SCHEMES[self.scheme][0]

    @property
    def extra(self) -> str:
        """The tritonactor extra that installs the store's library."""
        return SCHEMES[self.scheme][1]

    @property
    def root(self) -> str:
        """The folder as fsspec names it: bucket (container) and prefix."""
        return "/".join(part for part in (self.bucket, self.prefix) if part)


def is_store_url(text: str | Path) -> bool:
    """Whether `text` names a store by URL rather than a local folder (any `scheme://`)."""
    return isinstance(text, str) and _SCHEME.match(text) is not None


def parse_location(text: str) -> StoreLocation:
    """The location a URL names; ValueError with the rule it breaks."""
    match = _SCHEME.match(text)
    if match is None:
        raise ValueError("is not an object-store URL (s3://, gs:// or as://)")
    scheme = match.group(1).lower()
    if scheme not in SCHEMES:
        names = ", ".join(f"{name}://" for name in SCHEMES)
        raise ValueError(f"names the scheme '{scheme}://': the object stores read are {names}")
    rest = text[match.end() :]
    endpoint = account = None
    if scheme == "s3":
        address = _ADDRESS.fullmatch(rest)
        if address is not None:
            protocol, host, port, rest = address.groups()
            endpoint = f"{protocol or 'http'}://{host}:{port}"
    parts = [part for part in rest.split("/") if part]
    if scheme == "as":
        if not parts:
            raise ValueError("names no storage account: expected as://account/container/path")
        account, parts = parts[0], parts[1:]
    if not parts:
        expected = "as://account/container/path" if scheme == "as" else f"{scheme}://bucket/path"
        raise ValueError(f"names no bucket: expected {expected}")
    bucket, *path = parts
    if not _BUCKET.fullmatch(bucket):
        raise ValueError(
            f"names the bucket '{bucket}': a bucket name is letters, digits, dots, hyphens "
            "and underscores"
        )
    if any(part in (".", "..") for part in path):
        raise ValueError("has a '.' or '..' in its path: give the folder itself")
    return StoreLocation(scheme, bucket, "/".join(path), endpoint, account)
