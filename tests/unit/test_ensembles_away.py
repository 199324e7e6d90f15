"""An ensemble whose step model does not serve is away, as in Triton 2.51: the router serves it
only while every step finds the version it runs (through ensembles of ensembles), the index
lists it UNAVAILABLE "unloaded" meanwhile, and an ensemble's load is refused, in Triton's
words, when a step cannot serve (`unserved_step`)."""

from __future__ import annotations

import pytest

from tritonactor._proto.inference import ModelConfig, ModelEnsembling, ModelEnsemblingStep
from tritonactor.control import events as ev
from tritonactor.control.index import IndexEntry, index
from tritonactor.control.load_plan import unserved_step
from tritonactor.core.errors import TritonError
from tritonactor.scheduling.router import ModelHandle, Router
from tritonactor.scheduling.signature import ModelSignature


def handle(name: str, version: int = 1, step: str = "", step_version: int = -1) -> ModelHandle:
    """A version of `name`: an ensemble of one step when `step` is given."""
    config = ModelConfig(name=name, backend="python")
    if step:
        config = ModelConfig(
            name=name,
            platform="ensemble",
            ensemble_scheduling=ModelEnsembling(
                step=[ModelEnsemblingStep(model_name=step, model_version=step_version)]
            ),
        )
    signature = ModelSignature.from_config(config)
    return ModelHandle(name, version, config, signature, None)  # type: ignore[arg-type]


def serving(router: Router) -> dict[str, list[int]]:
    return {h.name: router.ready_versions(h.name) for h in router.handles()}


def test_an_ensemble_serves_only_while_its_steps_do() -> None:
    router = Router()
    router.known |= {"m", "inner", "outer", "pinned"}
    router.tried.update(dict.fromkeys(router.known, frozenset()))
    inner, outer = handle("inner", step="m"), handle("outer", step="inner")
    router.add(outer)  # before what it runs: away
    router.add(inner)
    assert serving(router) == {}
    assert router.hidden() == {("inner", 1), ("outer", 1)}
    assert router.resolve_exact("outer", 1) is outer  # added, though away
    m1 = handle("m")
    router.add(m1)
    assert serving(router) == {"inner": [1], "m": [1], "outer": [1]}
    assert router.hidden() == frozenset()
    pinned = handle("pinned", step="m", step_version=2)
    router.add(pinned)
    assert ("pinned", 1) in router.hidden()
    router.add(handle("m", 2))
    assert router.resolve("pinned") is pinned
    router.remove("m", 2)
    assert router.hidden() == {("pinned", 1)}
    router.remove("m", 1)
    assert router.hidden() == {("inner", 1), ("outer", 1), ("pinned", 1)}
    for name in ("inner", "outer"):
        with pytest.raises(TritonError, match=f"'{name}' has no available versions"):
            router.resolve(name)
    router.remove("inner", 1)  # unloaded while away: gone for good
    router.add(m1)
    assert serving(router) == {"m": [1]}
    assert router.hidden() == {("outer", 1), ("pinned", 1)}


def test_the_index_lists_an_ensemble_away_as_unloaded() -> None:
    ready = ev.VersionStatus(ev.VersionState.READY)
    state = {
        "e": ev.ModelStatus(versions={1: ready}, wanted=True),
        "m": ev.ModelStatus(
            versions={1: ev.VersionStatus(ev.VersionState.UNAVAILABLE, "unloaded", True)}
        ),
    }
    assert index(state, {("e", 1)}) == [
        IndexEntry("e", "1", "UNAVAILABLE", "unloaded"),
        IndexEntry("m", "1", "UNAVAILABLE", "unloaded"),
    ]
    assert index(state)[0] == IndexEntry("e", "1", "READY", "")


def ensemble(step: str, version: int = -1) -> ModelConfig:
    return handle("e", step=step, step_version=version).config


@pytest.mark.parametrize(
    ("config", "serving", "failures", "reason"),
    [
        (ensemble("m"), {"m": [1]}, {}, None),
        (ensemble("m", 1), {"m": [1]}, {}, None),
        (
            ensemble("nosuch"),
            {},
            {},
            "ensemble e contains models that are not available or ambiguous: nosuch",
        ),
        (
            ensemble("m", 7),
            {"m": [1]},
            {},
            "ensemble 'e' depends on 'm' whose required version 7 is not loaded.",
        ),
        (ensemble("m"), {}, {}, "ensemble 'e' depends on 'm' which has no loaded version."),
        (
            ensemble("m"),
            {},
            {"m": ("version 1 is at UNAVAILABLE state: boom;", False)},
            "ensemble 'e' depends on 'm' which has no loaded version. Model 'm' loading "
            "failed with error: version 1 is at UNAVAILABLE state: boom;",
        ),
        (
            ensemble("m"),
            {},
            {"m": ("bad config", True)},
            "ensemble 'e' depends on 'm' which is not valid. Model 'm' failed with error: "
            "bad config",
        ),
    ],
)
def test_an_ensemble_is_refused_in_tritons_words_when_a_step_cannot_serve(
    config: ModelConfig,
    serving: dict[str, list[int]],
    failures: dict[str, tuple[str, bool]],
    reason: str | None,
) -> None:
    assert unserved_step("e", config, {"m"}, serving, failures) == reason


@pytest.mark.anyio
async def test_lazy_loading_loads_an_ensemble_away_again() -> None:
    # Its load loads the step models it needs (Loading._ensemble_steps), which brings it back.
    router = Router()
    router.known |= {"m", "e"}
    router.add(handle("e", step="m"))
    asked: list[str] = []

    async def loader(name: str) -> None:
        asked.append(name)

    router.loader = loader
    await router.ensure_loaded("e")
    assert asked == ["e"]
