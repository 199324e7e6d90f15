"""The one rule for a file a model's config names: it stays inside its model's folder.

A config names files (the model file, label files, warmup data, initial sequence state...);
`inside` turns such a name into a path under its folder, or refuses it with the one error. A
name is joined as Triton joins it (a leading `/` is not the filesystem's root: `/x` names
`<folder>/x`). Then:

- lexically, `..` may not climb out of the folder;
- unless `trust_links` is set, symlinks are resolved too, and the target must still be inside
  the folder (itself resolved). A name an API caller's config override changes is always
  checked this way; a name from the repository's own config.pbtxt (or one an override gives
  just as that config does) may go through a link an operator placed in the repository
  (`trust_links=True`).

The error says the same whatever is outside: it is raised before anything outside is opened,
and its text depends only on the name as given, never on whether the target exists.
"""

from __future__ import annotations

import os
from pathlib import Path

from tritonactor.core.errors import TritonError, invalid_arg

__all__ = ["MODEL_FOLDER", "inside", "outside_error"]


MODEL_FOLDER = "the model's folder"


def outside_error(what: str, where: str = MODEL_FOLDER) -> TritonError:
    """The one refusal: `what` describes the name ("default_model_filename '../x.py'"),
    `where` the folder it must stay in."""
    return invalid_arg(f"{what} is outside {where}")


def inside(
    folder: Path,
    name: str,
    *,
    what: str | None = None,
    where: str = MODEL_FOLDER,
    trust_links: bool = False,
) -> Path:
    """`name` joined to `folder` (normalised; links are not replaced in the result), or the
    one INVALID_ARG error when it leaves the folder. `what` describes the name in that error
    (default: "file '<name>'"), `where` the folder (default: "the model's folder")."""
    description = what if what is not None else f"file {_quoted(name)}"
    if not name or "\x00" in name:
        raise outside_error(description, where)
    relative = os.path.normpath(name.lstrip("/"))
    if relative == ".." or relative.startswith("../") or os.path.isabs(relative):
        raise outside_error(description, where)
    path = folder if relative == "." else folder / relative
    if trust_links:
        return path
    root = os.path.realpath(folder)
    target = os.path.realpath(path)
    if target != root and not target.startswith(root.rstrip("/") + "/"):
        raise outside_error(description, where)
    return path


def _quoted(text: str) -> str:
    # Names come from configs and clients: control characters are shown escaped.
    return f"'{text}'" if text.isprintable() else repr(text)
