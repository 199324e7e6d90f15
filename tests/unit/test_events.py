"""The control plane's state is a pure fold of its events."""

from __future__ import annotations

from tritonactor.control import events as ev
from tritonactor.control.manager import IndexEntry, index


def test_fold_load_then_unload() -> None:
    events: list[ev.Event] = [
        ev.ModelDiscovered(model="m", repository="/r", versions=(1, 2)),
        ev.LoadRequested(model="m", versions=(1, 2), source=ev.Source.STARTUP),
        ev.ModelLoaded(model="m", version=2, load_seconds=0.1),
        ev.LoadFailed(model="m", version=1, reason="bad file"),
    ]
    state = ev.fold(events)
    assert state["m"].versions == {
        1: ev.VersionStatus(ev.VersionState.UNAVAILABLE, "bad file"),
        2: ev.VersionStatus(ev.VersionState.READY),
    }
    state = ev.fold(
        [
            ev.UnloadRequested(model="m", versions=(2,), source=ev.Source.API),
            ev.ModelUnloaded(model="m", version=2),
        ],
        state,
    )
    assert state["m"].versions[2].state == ev.VersionState.UNAVAILABLE
    assert state["m"].versions[2].reason == "unloaded"


def test_apply_does_not_change_its_input() -> None:
    before = ev.fold([ev.LoadRequested(model="m", versions=(1,), source=ev.Source.STARTUP)])
    snapshot = dict(before)
    after = ev.apply(before, ev.ModelLoaded(model="m", version=1))
    assert before == snapshot
    assert before["m"].versions[1].state == ev.VersionState.LOADING
    assert after["m"].versions[1].state == ev.VersionState.READY


def test_model_level_failure_and_reload_clears_it() -> None:
    state = ev.fold([ev.LoadFailed(model="m", version=None, reason="config.pbtxt:3:1: oops")])
    assert index(state) == [IndexEntry("m", "", "UNAVAILABLE", "config.pbtxt:3:1: oops")]
    state = ev.fold(
        [
            ev.LoadRequested(model="m", versions=(1,), source=ev.Source.POLL),
            ev.ModelLoaded(model="m", version=1),
        ],
        state,
    )
    assert index(state) == [IndexEntry("m", "1", "READY", "")]


def test_replaying_the_same_events_gives_the_same_state() -> None:
    events: list[ev.Event] = [
        ev.LoadRequested(model=name, versions=(1,), source=ev.Source.STARTUP) for name in ("a", "b")
    ] + [ev.ModelLoaded(model="a", version=1), ev.LoadFailed(model="b", version=1, reason="x")]
    assert ev.fold(events) == ev.fold(list(events))
    assert [e.state for e in index(ev.fold(events))] == ["READY", "UNAVAILABLE"]
