"""Model repositories in object storage (`s3://`, `gs://`, `as://`): each copied into a local
mirror the rest of the server reads as an ordinary repository ([object-store.md])."""

from tritonactor.store.location import StoreLocation, is_store_url, parse_location

__all__ = ["StoreLocation", "is_store_url", "parse_location"]
