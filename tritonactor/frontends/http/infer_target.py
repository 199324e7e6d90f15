"""What an infer request is addressed to, and its headers as the infer route reads them: shared by
the direct route (direct.py) and the infer lane (infer_lane.py)."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote

from starlette.datastructures import Headers


def infer_path(path: str) -> dict[str, Any] | None:
    """The path parameters of `/v2/models/{model}[/versions/{version:int}]/infer`, as starlette's
    routes would give them; None for another path."""
    if not path.startswith("/v2/models/") or not path.endswith("/infer"):
        return None
    parts = path[11:-6].split("/")
    if len(parts) == 1 and parts[0]:
        return {"model": parts[0]}
    if len(parts) == 3 and parts[0] and parts[1] == "versions" and _DIGITS.fullmatch(parts[2]):
        return {"model": parts[0], "version": int(parts[2])}
    return None


_DIGITS = re.compile("[0-9]+")
_ENCODED_SLASH = re.compile("(%2f)", re.IGNORECASE)


def keep_encoded_slashes(scope: dict[str, Any]) -> None:
    """Let a path's encoded slashes (`%2F`) stay in its `path`, which the ASGI server gave
    decoded: `/v2%2Fmodels%2Fm%2Fconfig` is no route and `/v2/models/a%2Fb/infer` addresses
    model `a%2Fb`, as Triton reads them, not `/v2/models/m/config` and model `a`'s version
    route (which a proxy's rule over the raw path would not have seen). Other escapes stay
    decoded (`%5F` is `_`): the same character either way."""
    raw = scope.get("raw_path")
    if raw is not None and b"%" in raw and (b"%2F" in raw or b"%2f" in raw):
        # (split keeps each `%2F` as it was written, at odd places: left as they are)
        parts = _ENCODED_SLASH.split(raw.decode("latin-1"))
        scope["path"] = "".join(
            part if index % 2 else unquote(part, encoding="utf-8", errors="replace")
            for index, part in enumerate(parts)
        )


class LookupHeaders(Headers):
    """A request's headers, as starlette's `Headers`, whose `get` looks a header up in one call
    (starlette's goes through `Mapping.get` and `__getitem__`, and raises and catches a
    KeyError for a header the request lacks: three of the infer route's lookups a request
    usually miss)."""

    def get(self, key: str, default: Any = None) -> Any:
        wanted = key.lower().encode("latin-1")
        for name, value in self._list:
            if name == wanted:
                return value.decode("latin-1")
        return default


def url_path(path: str) -> str:
    """A request's `path` as starlette's `request.url.path` gives it, without building the
    URL (what the infer route logs): `?`, `#` and `\\` escaped, and tabs and line breaks
    dropped (as `urllib.parse.urlsplit` drops them)."""
    path = path.replace("?", "%3F").replace("#", "%23").replace("\\", "%5C")
    if "\t" in path or "\r" in path or "\n" in path:
        path = path.replace("\t", "").replace("\r", "").replace("\n", "")
    return path
