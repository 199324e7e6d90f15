"""The model manager's pure steps of a load: which versions to load, the ensemble cycles that
would deadlock it, a config override applied to a model, and the events and errors a load
records and answers in Triton's words."""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import replace
from pathlib import Path

from tritonactor._proto.inference import ModelConfig
from tritonactor.config.model_config import ConfigError, config_from_json
from tritonactor.control import events as ev
from tritonactor.control.messages import Override
from tritonactor.control.prepare import missing_version_reason, require_versions
from tritonactor.control.repository import ModelSource, select_versions
from tritonactor.core.errors import TritonError, invalid_arg

log = logging.getLogger(__name__)


def step_cycle(name: str, config: ModelConfig, found: dict[str, ModelSource]) -> list[str]:
    """A chain of ensemble steps from `name` back to itself ([] when there is none): loading its
    steps first would wait on itself (two ensembles naming each other would deadlock)."""

    def steps(model: str) -> list[str]:
        scheduling = config.ensemble_scheduling
        if model != name:
            source = found.get(model)
            scheduling = source.config.ensemble_scheduling if source and source.config else None
        return [step.model_name for step in scheduling.step] if scheduling else []

    stack, seen = [[name]], {name}
    while stack:
        path = stack.pop()
        for step in steps(path[-1]):
            if step == name:
                return [*path, step]
            if step not in seen:
                seen.add(step)
                stack.append([*path, step])
    return []


def unserved_step(
    name: str,
    config: ModelConfig,
    known: Collection[str],
    serving: dict[str, Collection[int]],
    failures: dict[str, tuple[str, bool]],
) -> str | None:
    """Why the ensemble `name` may not load, in Triton 2.51's words, once the manager loaded its
    steps: a step model no repository holds (`known`), or one that does not serve the version
    the step runs (`serving`: the versions that do, by model); None when every step is
    served. `failures`: the step models whose load failed just now, with the error's detail
    and whether the model failed as a whole (its config) rather than its versions."""
    assert config.ensemble_scheduling is not None
    steps = config.ensemble_scheduling.step
    absent = sorted({step.model_name for step in steps if step.model_name not in known})
    if absent:
        return f"ensemble {name} contains models that are not available or ambiguous: " + ", ".join(
            absent
        )
    for step in steps:
        model, versions = step.model_name, serving.get(step.model_name, ())
        if not versions:
            said = f"ensemble '{name}' depends on '{model}'"
            if model not in failures:
                return f"{said} which has no loaded version."
            detail, whole = failures[model]
            if whole:
                return f"{said} which is not valid. Model '{model}' failed with error: {detail}"
            return (
                f"{said} which has no loaded version. Model '{model}' loading failed with "
                f"error: {detail}"
            )
        if step.model_version > 0 and step.model_version not in versions:
            return (
                f"ensemble '{name}' depends on '{model}' whose required version "
                f"{step.model_version} is not loaded."
            )
    return None


def load_requested(
    name: str,
    versions: tuple[int, ...],
    source: ev.Source,
    digest: str,
    override: Override | None,
) -> ev.LoadRequested:
    return ev.LoadRequested(
        model=name,
        versions=versions,
        source=source,
        config_digest=digest,
        config_override=override.config_json if override is not None else "",
        override_repository=str(override.repository or "") if override is not None else "",
        options_digest=override.digest if override is not None else "",
    )


def override_of(requested: ev.Requested) -> Override | None:
    if not requested.config_override and not requested.override_repository:
        return None
    repository = Path(requested.override_repository) if requested.override_repository else None
    return Override(requested.config_override, repository, requested.options_digest)


def restored_overrides(state: ev.State) -> list[Path]:
    """The file-override folders a restart loads again (the journal's loads in force): what
    `override_folders.remove_stale_folders` keeps at start."""
    return [
        Path(status.requested.override_repository)
        for status in state.values()
        if status.requested is not None and status.requested.override_repository
    ]


def with_config(model: ModelSource, config_json: str) -> ModelSource:
    """The model with its config replaced by an override's (Triton ignores config.pbtxt then)."""
    try:
        config = config_from_json(config_json)
    except ConfigError as error:
        return replace(model, config=None, error=f"the config override is invalid: {error}")
    if not config.name:
        config.name = model.name
    return replace(model, config=config, has_config_file=True, error=None)


def load_failed(name: str, failures: list[tuple[int, str]]) -> TritonError:
    # Triton's wording: one clause per version, the message ended by a line break.
    detail = "".join(
        f"version {version} is at UNAVAILABLE state: {reason};" for version, reason in failures
    )
    return invalid_arg(f"load failed for model '{name}': {detail}\n")


def versions_to_load(model: ModelSource) -> tuple[int, ...]:
    assert model.config is not None
    selection = select_versions(model.config, model.versions)
    for missing in selection.missing:
        log.warning("%s", missing_version_reason(model.name, missing))
    return require_versions(model.name, selection)
