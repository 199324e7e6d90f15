"""What a model repository holds and what loading it would do, found without starting a server:
each model's versions (and which the policy selects), backend, instance count, bytes on disk,
and the reasons it would fail to load.

Nothing here creates a backend model or instance; a backend's auto-complete runs as at load,
except the python backend's, which would start the model's own code in a process.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tritonactor._proto.inference import ModelConfig
from tritonactor.backends.base import Backend
from tritonactor.backends.registry import BackendRegistry
from tritonactor.config.model_config import ConfigError
from tritonactor.config.normalize import instance_specs
from tritonactor.control.prepare import (
    failure_reason,
    missing_model_file,
    missing_version_reason,
    model_context,
    prepare_config,
    require_versions,
)
from tritonactor.control.repository import (
    ModelSource,
    scan_repositories,
    select_versions,
    version_path,
)
from tritonactor.core.devices import gpu_count
from tritonactor.core.errors import TritonError

__all__ = [
    "ModelReport",
    "Report",
    "VersionReport",
    "human_size",
    "inspect_repositories",
    "render_text",
    "report_to_json",
]

PYTHON_NOT_COMPLETED = "auto-complete not run for python models"

# A file on disk: (device, inode), so that one reached through several links counts once.
_FileId = tuple[int, int]


@dataclass(frozen=True, slots=True)
class VersionReport:
    version: int
    selected: bool  # the version policy would load it (False for a model that cannot load)
    bytes: int
    error: str | None = None


@dataclass(frozen=True, slots=True)
class ModelReport:
    name: str
    repository: Path
    path: Path
    backend: str | None
    instances: int | None  # after Triton's defaults; None when preparation did not get there
    versions: tuple[VersionReport, ...]
    other_bytes: int  # files of the model folder outside its version folders (config.pbtxt...)
    total_bytes: int  # every distinct file of the model folder
    errors: tuple[str, ...] = ()  # model-level reasons; a version's own is on the version
    notes: tuple[str, ...] = ()

    @property
    def loads(self) -> bool:
        return not self.errors and all(v.error is None for v in self.versions)


@dataclass(frozen=True, slots=True)
class Report:
    repositories: tuple[Path, ...]
    models: tuple[ModelReport, ...]  # by repository, in the order given, then by name
    total_bytes: int  # every distinct file of every model folder

    @property
    def loads(self) -> bool:
        return all(model.loads for model in self.models)


# ---------------------------------------------------------------------------------------------
# Inspecting


def inspect_repositories(
    paths: Sequence[Path],
    registry: BackendRegistry,
    strict: bool = False,
    *,
    gpus: int | None = None,
) -> Report:
    """Report on every model folder of `paths`. Raises RepositoryError for a path that is not a
    readable directory. `gpus` defaults to the CUDA devices this machine shows."""
    repositories = _unique(paths)
    visible_gpus = gpu_count() if gpus is None else gpus
    # Each repository on its own, so that every copy of a duplicated name is listed (with its
    # bytes); all together for the server's verdict on names found in several.
    per_repository = [scan_repositories([repository]) for repository in repositories]
    merged = scan_repositories(repositories)
    models: list[ModelReport] = []
    all_files: dict[_FileId, int] = {}
    for found in per_repository:
        for source in found.values():
            verdict = merged[source.name]
            if verdict.error is not None:
                source = replace(source, config=None, error=verdict.error)
            report, files = _inspect_model(source, registry, strict, visible_gpus)
            models.append(report)
            all_files.update(files)
    return Report(tuple(repositories), tuple(models), sum(all_files.values()))


def _unique(paths: Sequence[Path]) -> list[Path]:
    # As the server does: one directory named twice (or through a link) is one repository.
    unique: dict[Path, Path] = {}
    for path in paths:
        unique.setdefault(Path(path).resolve(), Path(path))
    return list(unique.values())


def _inspect_model(
    source: ModelSource, registry: BackendRegistry, strict: bool, gpus: int
) -> tuple[ModelReport, dict[_FileId, int]]:
    version_files = {v: _files_under(version_path(source, v)) for v in source.versions}
    other_files = _files_under(source.path, skip=[str(v) for v in source.versions])
    files: dict[_FileId, int] = {}
    for sizes in (*version_files.values(), other_files):
        files.update(sizes)
    outcome = _outcome(source, registry, strict, gpus)
    versions = tuple(
        VersionReport(
            version,
            version in outcome.selected,
            sum(version_files[version].values()),
            outcome.version_errors.get(version),
        )
        for version in source.versions
    )
    report = ModelReport(
        name=source.name,
        repository=source.repository,
        path=source.path,
        backend=outcome.backend,
        instances=outcome.instances,
        versions=versions,
        other_bytes=sum(other_files.values()),
        total_bytes=sum(files.values()),
        errors=tuple(outcome.errors),
        notes=tuple(outcome.notes),
    )
    return report, files


@dataclass(slots=True)
class _Outcome:
    """How far loading would get, and what it would hit on the way."""

    selected: tuple[int, ...] = ()
    backend: str | None = None
    instances: int | None = None
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    version_errors: dict[int, str] = field(default_factory=dict)


def _outcome(source: ModelSource, registry: BackendRegistry, strict: bool, gpus: int) -> _Outcome:
    # Step for step what the manager does, stopping where it would stop.
    outcome = _Outcome()
    if source.error is not None or source.config is None:
        outcome.errors.append(str(source.error))
        return outcome
    selection = select_versions(source.config, source.versions)
    outcome.notes.extend(missing_version_reason(source.name, v) for v in selection.missing)
    outcome.backend = _backend_name(source, registry)
    try:
        versions = require_versions(source.name, selection)
    except ConfigError as error:
        outcome.errors.append(failure_reason(error))
        return outcome
    outcome.selected = versions
    if outcome.backend == "python" and not strict:
        outcome.notes.append(PYTHON_NOT_COMPLETED)
    try:
        backend, config = prepare_config(
            source,
            source.config,
            registry,
            strict=strict,
            latest=versions[-1],
            gpus=gpus,
            skip_auto_complete=("python",),
        )
    except Exception as error:  # whatever the backend raises, as the manager catches it
        outcome.errors.append(failure_reason(error))
        return outcome
    outcome.backend = backend.name
    outcome.instances = len(instance_specs(config))
    for version in versions:
        reason = missing_model_file(source, config, version)
        if reason is None:
            reason = _model_file_refused(source, config, version, backend)
        if reason is not None:
            outcome.version_errors[version] = reason
    return outcome


def _model_file_refused(
    source: ModelSource, config: ModelConfig, version: int, backend: Backend
) -> str | None:
    """What the backend's load would refuse about the version's model file against its config
    (a config input the file lacks...), or None."""
    try:
        backend.check_model(model_context(source, config, version))
    except Exception as error:  # whatever the backend raises, as the manager catches it
        return failure_reason(error)
    return None


def _backend_name(source: ModelSource, registry: BackendRegistry) -> str | None:
    """The backend, when the config or files name one: shown even if the load fails."""
    assert source.config is not None
    try:
        return registry.backend_name(source.config, source.path, list(source.versions))
    except TritonError:
        return None


# ---------------------------------------------------------------------------------------------
# Bytes on disk


def _files_under(root: Path, skip: Collection[str] = ()) -> dict[_FileId, int]:
    """Size of every file under `root` (but not under its entries named in `skip`), by identity.

    Links are followed, since repositories are often assembled from them, but each real
    directory is walked once, so a link cycle ends; a dangling link has no bytes.
    """
    sizes: dict[_FileId, int] = {}
    walked: set[_FileId] = set()
    stack = [root]
    while stack:
        directory = stack.pop()
        try:
            stat = directory.stat()
            if (stat.st_dev, stat.st_ino) in walked:
                continue
            walked.add((stat.st_dev, stat.st_ino))
            with os.scandir(directory) as scan:
                entries = list(scan)
        except OSError:
            continue  # unreadable: the scan or the load reports what matters about it
        for entry in entries:
            if directory == root and entry.name in skip:
                continue
            try:
                if entry.is_dir():
                    stack.append(Path(entry.path))
                    continue
                stat = entry.stat()
            except OSError:
                continue
            sizes[(stat.st_dev, stat.st_ino)] = stat.st_size
    return sizes


# ---------------------------------------------------------------------------------------------
# Output


def human_size(size: int) -> str:
    """Bytes as a person reads them: "512 B", "1.5 KiB", "3.2 GiB"."""
    if size < 1024:
        return f"{size} B"
    value = float(size)
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if round(value, 1) < 1024:
            return f"{value:.1f} {unit}"
    return f"{value / 1024:.1f} TiB"


def report_to_json(report: Report, copies: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The report as JSON-ready data: paths as strings, sizes in exact bytes. `copies` names
    local copies of object-store repositories (folder -> URL): their paths are shown as URLs."""
    shown = _Shown(copies or {})
    return {
        "repositories": [shown(path) for path in report.repositories],
        "loads": report.loads,
        "total_bytes": report.total_bytes,
        "models": [_model_json(model, shown) for model in report.models],
    }


class _Shown:
    """A path as the user named it: inside a copy of an object-store folder, its URL."""

    def __init__(self, copies: Mapping[str, str]) -> None:
        self._copies = copies

    def __call__(self, path: Path) -> str:
        text = str(path)
        for root, url in self._copies.items():
            if text == root or text.startswith(root + os.sep):
                return url + text[len(root) :]
        return text


def _model_json(model: ModelReport, shown: _Shown) -> dict[str, Any]:
    return {
        "name": model.name,
        "repository": shown(model.repository),
        "path": shown(model.path),
        "loads": model.loads,
        "backend": model.backend,
        "instances": model.instances,
        "total_bytes": model.total_bytes,
        "other_bytes": model.other_bytes,
        "versions": [
            {
                "version": version.version,
                "selected": version.selected,
                "bytes": version.bytes,
                "error": version.error,
            }
            for version in model.versions
        ],
        "errors": list(model.errors),
        "notes": list(model.notes),
    }


_HEADER = ("MODEL", "VERSION", "SELECTED", "BACKEND", "INSTANCES", "SIZE")
_RIGHT_ALIGNED = {4, 5}


def render_text(report: Report, copies: Mapping[str, str] | None = None) -> str:
    """A table per repository: a row per model (its total size), a row per version, then the
    model's errors and notes; a summary line closes it. `copies` as for `report_to_json`."""
    shown = _Shown(copies or {})
    groups = [
        (repository, [m for m in report.models if m.repository == repository])
        for repository in report.repositories
    ]
    rows = [row for _, models in groups for model in models for row in _model_rows(model)]
    widths = [max(len(row[i]) for row in [_HEADER, *rows]) for i in range(len(_HEADER))]
    lines: list[str] = []
    for repository, models in groups:
        lines.append(f"repository {shown(repository)}")
        if not models:
            lines.extend(["  (no models)", ""])
            continue
        lines.append(_line(_HEADER, widths))
        for model in models:
            lines.extend(_line(row, widths) for row in _model_rows(model))
            lines.extend(f"    error: {reason}" for reason in model.errors)
            lines.extend(
                f"    error (version {v.version}): {v.error}" for v in model.versions if v.error
            )
            lines.extend(f"    note: {note}" for note in model.notes)
        lines.append("")
    lines.append(_summary(report))
    return "\n".join(lines) + "\n"


def _model_rows(model: ModelReport) -> Iterable[tuple[str, ...]]:
    instances = "-" if model.instances is None else str(model.instances)
    yield (model.name, "", "", model.backend or "-", instances, human_size(model.total_bytes))
    for version in model.versions:
        selected = "yes" if version.selected else "no"
        yield ("", str(version.version), selected, "", "", human_size(version.bytes))


def _line(cells: Sequence[str], widths: Sequence[int]) -> str:
    padded = (
        cell.rjust(width) if index in _RIGHT_ALIGNED else cell.ljust(width)
        for index, (cell, width) in enumerate(zip(cells, widths, strict=True))
    )
    return "  ".join(padded).rstrip()


def _summary(report: Report) -> str:
    failing = sum(not model.loads for model in report.models)
    models = f"{len(report.models)} model{'s' if len(report.models) != 1 else ''}"
    repositories = len(report.repositories)
    where = f"{repositories} repositor{'ies' if repositories != 1 else 'y'}"
    verdict = f"{len(report.models) - failing} would load, {failing} with errors"
    return f"{models} in {where}: {verdict}; {human_size(report.total_bytes)} in all"
