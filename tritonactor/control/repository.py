"""The model repository as Triton lays it out: `<repository>/<model>/config.pbtxt` beside numbered
version folders `<repository>/<model>/<version>/`.

Only the filesystem is read here; nothing is loaded. What a scan finds, errors included, is data,
so the control plane can record it and report each model's state instead of stopping at the first
bad folder.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from tritonactor._proto.inference import ModelConfig, ModelVersionPolicy
from tritonactor.config.model_config import ConfigError, config_to_json, read_pbtxt

__all__ = [
    "CONFIG_FILENAME",
    "ModelSource",
    "RepositoryError",
    "VersionSelection",
    "config_digest",
    "folder_signature",
    "model_file_path",
    "model_folders",
    "scan_repositories",
    "select_versions",
    "version_path",
]

CONFIG_FILENAME = "config.pbtxt"

log = logging.getLogger(__name__)

# Triton reads a version folder's name as an integer but skips names with a leading zero ("01"),
# so "0" itself is a valid version. We also insist on ASCII digits only: Triton's `stoll` would
# read "1abc" as version 1, which no one means on purpose.
_VERSION_NAME = re.compile(r"0|[1-9][0-9]*")
_MAX_VERSION = 2**63 - 1  # versions are int64 on the wire


class RepositoryError(Exception):
    """A model repository that cannot be scanned at all (missing, not a directory, unreadable)."""


@dataclass(frozen=True, slots=True)
class ModelSource:
    """One model folder as found on disk.

    `error` is set when the folder cannot become a model (unparsable config, name mismatch, the
    name in several repositories); `config` is then None, so a caller never loads a half-valid
    config. Without a config.pbtxt the config holds only the name, for auto-complete to fill.
    """

    name: str
    repository: Path
    path: Path
    config: ModelConfig | None
    has_config_file: bool
    versions: tuple[int, ...]
    error: str | None = None


@dataclass(frozen=True, slots=True)
class VersionSelection:
    """The versions a version policy picks (ascending), and the `specific` ones absent on disk.

    Triton logs each missing specific version and loads the rest; the load only fails when
    nothing is selected ("at least one version must be available under the version policy of
    model 'x'"). Callers should do the same: report `missing`, and fail when `versions` is empty.
    """

    versions: tuple[int, ...]
    missing: tuple[int, ...] = ()


# ---------------------------------------------------------------------------------------------
# Scanning


def scan_repositories(repositories: Sequence[Path]) -> dict[str, ModelSource]:
    """Every model folder in every repository, keyed (and ordered) by model name.

    Raises RepositoryError if a repository path is missing or not a directory.
    """
    found: dict[str, list[ModelSource]] = {}
    for repository in _unique_repositories(repositories):
        for model_dir in model_folders(repository):
            found.setdefault(model_dir.name, []).append(_scan_model(repository, model_dir))
    return {name: _resolve_duplicates(found[name]) for name in sorted(found)}


def _unique_repositories(repositories: Sequence[Path]) -> list[Path]:
    # The same repository named twice is one repository (Triton keeps its paths in a set);
    # otherwise every model in it would count as a duplicate of itself.
    unique: dict[Path, Path] = {}
    for repository in repositories:
        unique.setdefault(Path(repository).resolve(), Path(repository))
    return list(unique.values())


def model_folders(repository: Path) -> list[Path]:
    if not repository.is_dir():
        reason = "does not exist" if not repository.exists() else "is not a directory"
        raise RepositoryError(f"model repository '{repository}' {reason}")
    try:
        with os.scandir(repository) as entries:
            folders = [
                entry for entry in entries if not entry.name.startswith(".") and _is_dir(entry)
            ]
    except OSError as exc:
        raise RepositoryError(f"cannot read model repository '{repository}': {exc}") from None
    named = []
    for entry in folders:
        try:
            entry.name.encode("utf-8")
        except UnicodeEncodeError:
            # A model's name travels as protobuf and JSON strings: it must be text.
            log.warning(
                "ignoring folder %r in model repository '%s': its name is not UTF-8",
                entry.name.encode("utf-8", "surrogateescape"),
                repository,
            )
            continue
        named.append(Path(entry.path))
    return sorted(named)


def _scan_model(repository: Path, model_dir: Path) -> ModelSource:
    name = model_dir.name
    config_file = model_dir / CONFIG_FILENAME
    has_config_file = config_file.exists()
    source = ModelSource(name, repository, model_dir, None, has_config_file, ())
    try:
        versions = _version_folders(model_dir)
    except OSError as exc:
        return replace(source, error=f"cannot read model folder '{model_dir}': {exc}")
    source = replace(source, versions=versions)
    if not has_config_file:
        return replace(source, config=ModelConfig(name=name))
    try:
        config = read_pbtxt(config_file)
    except ConfigError as exc:
        return replace(source, error=str(exc))
    if not config.name:
        config.name = name
    elif config.name != name:
        return replace(source, error=_name_mismatch(config.name, config_file, name))
    return replace(source, config=config)


def _name_mismatch(config_name: str, config_file: Path, folder: str) -> str:
    return (
        f"unexpected directory name '{folder}' for model '{config_name}', directory name must "
        f"equal model name ({config_file}: give the folder's name, or none)"
    )


def _version_folders(model_dir: Path) -> tuple[int, ...]:
    with os.scandir(model_dir) as entries:
        numbers = (_version_number(entry.name) for entry in entries if _is_dir(entry))
        return tuple(sorted(n for n in numbers if n is not None))


def _version_number(folder_name: str) -> int | None:
    if not _VERSION_NAME.fullmatch(folder_name):
        return None
    number = int(folder_name)
    return number if number <= _MAX_VERSION else None


def _resolve_duplicates(sources: list[ModelSource]) -> ModelSource:
    # Triton serves none of the copies: the name is ambiguous, so the model is unavailable until
    # all but one copy is removed. The first copy stands in so callers know where to point.
    first = sources[0]
    if len(sources) == 1:
        return first
    # Triton's words (the copies are where `TRITONACTOR_MODEL_REPOSITORY` points).
    return replace(first, config=None, error="model appears in two or more repositories")


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()  # follows symlinks: repositories are often assembled from links
    except OSError:
        return False


# ---------------------------------------------------------------------------------------------
# Versions and files


def select_versions(config: ModelConfig, available: Sequence[int]) -> VersionSelection:
    """The versions of `available` that the config's version_policy asks for.

    No policy means Triton's default, `latest { num_versions: 1 }`. `latest { num_versions: 0 }`
    selects nothing, as in Triton, so that load fails loudly rather than quietly serving one.
    """
    on_disk = sorted(set(available))
    policy = config.version_policy if config.version_policy is not None else ModelVersionPolicy()
    if policy.all is not None:
        return VersionSelection(tuple(on_disk))
    if policy.specific is None:
        count = policy.latest.num_versions if policy.latest is not None else 1
        return VersionSelection(tuple(on_disk[-count:]) if count > 0 else ())
    wanted = sorted(set(policy.specific.versions))
    present = set(on_disk)
    return VersionSelection(
        versions=tuple(v for v in wanted if v in present),
        missing=tuple(v for v in wanted if v not in present),
    )


def version_path(source: ModelSource, version: int) -> Path:
    return source.path / str(version)


def model_file_path(source: ModelSource, version: int, default_filename: str) -> Path:
    """`<model>/<version>/<default_model_filename>`, the backend's own default name if unset."""
    configured = source.config.default_model_filename if source.config is not None else ""
    return version_path(source, version) / (configured or default_filename)


# ---------------------------------------------------------------------------------------------
# Change detection


def folder_signature(path: Path) -> str:
    """A short digest that changes when anything in a model folder changes.

    It covers config.pbtxt's text and every entry's relative path, plus size and mtime for files,
    so a poll can compare signatures without reading model files (which can be gigabytes).
    Config text is hashed too because an edit within the mtime granularity keeps size and mtime.
    A missing folder has a signature of its own rather than raising: a poll races deletions.
    """
    digest = hashlib.sha256()
    try:
        digest.update((path / CONFIG_FILENAME).read_bytes())
    except OSError:
        digest.update(b"\0no-config")
    for line in _listing(path):
        digest.update(line.encode("utf-8", "surrogateescape"))
        digest.update(b"\n")
    return digest.hexdigest()[:16]


def _listing(root: Path) -> Iterator[str]:
    # Sorted walk, so the signature does not depend on directory order. Symlinked folders are
    # followed (links are common in repositories) but each real directory is walked once, so a
    # link cycle cannot recurse forever.
    seen: set[tuple[int, int]] = set()
    stack = [(root, "")]
    while stack:
        directory, prefix = stack.pop()
        try:
            identity = _identity(directory)
            if identity in seen:
                yield f"{prefix}/ cycle"
                continue
            seen.add(identity)
            with os.scandir(directory) as scan:
                entries = sorted(scan, key=lambda entry: entry.name)
        except OSError as exc:
            yield f"{prefix}/ unreadable {type(exc).__name__}"
            continue
        subdirs = []
        for entry in entries:
            if entry.name == "__pycache__":
                continue  # written by Python itself when a python model is imported
            relative = f"{prefix}/{entry.name}"
            if _is_dir(entry):
                yield f"{relative}/"
                subdirs.append((Path(entry.path), relative))
            else:
                yield f"{relative} {_file_stamp(entry)}"
        stack.extend(reversed(subdirs))


def _identity(directory: Path) -> tuple[int, int]:
    stat = directory.stat()
    return stat.st_dev, stat.st_ino


def _file_stamp(entry: os.DirEntry[str]) -> str:
    try:
        stat = entry.stat()
    except OSError:  # a dangling link, or a file removed mid-scan
        return "missing"
    return f"{stat.st_size} {stat.st_mtime_ns}"


def config_digest(config: ModelConfig, *, policy: bool = True) -> str:
    """A short digest of a config's content, for events that record which config was loaded
    (`policy` False: of all of it but its version policy).

    Taken over canonical JSON (sorted keys) so that equal configs digest equally whether they
    came from config.pbtxt, JSON or auto-complete, whatever the order of their map entries.
    """
    document = config_to_json(config)
    if not policy:
        document.pop("version_policy", None)
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]
