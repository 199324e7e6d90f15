"""The control plane's state is a pure fold of its events."""

from __future__ import annotations

from pathlib import Path

from tritonactor.control import events as ev
from tritonactor.control.index import IndexEntry, index, ready
from tritonactor.control.journal import open_journal


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


def test_a_restart_forgets_what_was_loaded_but_keeps_what_the_api_asked_for() -> None:
    events: list[ev.Event] = [
        ev.ServerStarted(model="", mode="explicit"),
        ev.LoadRequested(
            model="a", versions=(1,), source=ev.Source.API, config_override='{"x": 1}'
        ),
        ev.ModelLoaded(model="a", version=1),
        ev.LoadRequested(model="b", versions=(1,), source=ev.Source.API),
        ev.ModelLoaded(model="b", version=1),
        ev.UnloadRequested(model="b", versions=(1,), source=ev.Source.API),
        ev.ModelUnloaded(model="b", version=1),
        ev.LoadRequested(model="c", versions=(1,), source=ev.Source.STARTUP),
        ev.ModelLoaded(model="c", version=1),
    ]
    before = ev.fold(events)
    assert before["a"].requested == ev.Requested(config_override='{"x": 1}')
    assert before["b"].requested is None and not before["b"].wanted
    assert before["c"].requested is None  # the startup list is this start's, not a request
    assert ready(before)  # b was unloaded on purpose
    after = ev.apply(before, ev.ServerStarted(model="", mode="explicit"))
    assert after == {"a": ev.ModelStatus(requested=ev.Requested(config_override='{"x": 1}'))}
    assert ready(after)


def test_a_version_the_policy_drops_in_a_load_is_no_unload_of_the_model() -> None:
    """An API load that finds version 2 (policy `latest 1`) retires version 1: the model is
    still what the API asked for, and a restart loads it again (it was forgotten before)."""
    dropped = "no longer selected by the version policy"
    events: list[ev.Event] = [
        ev.ServerStarted(model="", mode="explicit"),
        ev.LoadRequested(model="vm", versions=(1,), source=ev.Source.API),
        ev.ModelLoaded(model="vm", version=1),
        ev.LoadRequested(model="vm", versions=(2,), source=ev.Source.API),
        ev.ModelLoaded(model="vm", version=2),
        ev.UnloadRequested(model="vm", versions=(1,), source=ev.Source.API, reason=dropped),
        ev.ModelUnloaded(model="vm", version=1, reason=dropped),
    ]
    state = ev.fold(events)
    assert state["vm"].requested is not None and state["vm"].wanted
    after = ev.apply(state, ev.ServerStarted(model="", mode="explicit"))
    assert after["vm"].requested is not None
    # an unload the API asked for still ends it
    unloaded = ev.fold(
        [
            ev.UnloadRequested(model="vm", versions=(2,), source=ev.Source.API),
            ev.ModelUnloaded(model="vm", version=2),
        ],
        state,
    )
    assert unloaded["vm"].requested is None and not unloaded["vm"].wanted


def test_a_failed_reload_keeps_the_serving_version_ready() -> None:
    state = ev.fold(
        [
            ev.LoadRequested(model="m", versions=(1,), source=ev.Source.POLL),
            ev.ModelLoaded(model="m", version=1),
            ev.LoadRequested(model="m", versions=(1,), source=ev.Source.POLL),
        ]
    )
    assert state["m"].versions[1].state == ev.VersionState.READY  # reloading: still serving
    failed = ev.apply(state, ev.LoadFailed(model="m", version=1, reason="bad config", serving=True))
    assert failed == state and ready(failed)
    broken = ev.apply(state, ev.LoadFailed(model="m", version=1, reason="bad config"))
    assert broken["m"].versions[1] == ev.VersionStatus(ev.VersionState.UNAVAILABLE, "bad config")
    assert not ready(broken)


def test_strict_readiness_waits_for_a_model_only_where_triton_has_one() -> None:
    # Refused before any version (its config, its name): no version to wait for. Its policy
    # selecting no version: Triton has the model, with no version, and is not ready.
    refused = ev.fold([ev.LoadFailed(model="m", version=None, reason="bad config")])
    assert refused["m"].state == ev.VersionState.UNAVAILABLE and ready(refused)
    versionless = ev.fold(
        [ev.LoadFailed(model="m", version=None, reason="no version", versionless=True)]
    )
    assert not ready(versionless)
    # A later load starts afresh.
    loaded = ev.fold(
        [
            ev.LoadFailed(model="m", version=None, reason="no version", versionless=True),
            ev.LoadRequested(model="m", versions=(1,), source=ev.Source.POLL),
            ev.ModelLoaded(model="m", version=1),
        ]
    )
    assert ready(loaded)


def test_a_removed_model_is_no_longer_listed_and_a_replaced_version_changes_nothing() -> None:
    state = ev.fold(
        [
            ev.ModelDiscovered(model="m", repository="/r", versions=(1,)),
            ev.LoadRequested(model="m", versions=(1,), source=ev.Source.POLL),
            ev.ModelLoaded(model="m", version=1),
        ]
    )
    assert ev.apply(state, ev.VersionReplaced(model="m", version=1)) == state
    gone = ev.fold(
        [
            ev.UnloadRequested(model="m", versions=(1,), source=ev.Source.POLL),
            ev.ModelUnloaded(model="m", version=1, reason="the model left the repository"),
            ev.ModelRemoved(model="m"),
        ],
        state,
    )
    assert gone == {}


def test_the_journal_replays_to_the_same_state(tmp_path: Path) -> None:
    events: list[ev.Event] = [
        ev.ServerStarted(model="", mode="poll", repositories=("/r",)),
        ev.ModelDiscovered(model="m", repository="/r", versions=(1, 2)),
        ev.LoadRequested(model="m", versions=(1, 2), source=ev.Source.STARTUP),
        ev.ModelLoaded(model="m", version=2, load_seconds=0.5, memory_bytes=10),
        ev.LoadFailed(model="m", version=1, reason="bad file"),
    ]
    journal, replayed = open_journal(tmp_path / "journal.jsonl")
    assert replayed == []
    for event in events:
        journal.append(event)
    journal.close()
    journal, replayed = open_journal(tmp_path / "journal.jsonl")
    journal.close()
    assert replayed == events
    assert ev.fold(replayed) == ev.fold(events)


def test_an_api_request_is_in_force_only_once_it_loaded() -> None:
    good = ev.Requested(config_override='{"max_batch_size": 2}')
    state = ev.fold(
        [
            ev.LoadRequested(model="m", versions=(1,), source=ev.Source.API, **_fields(good)),
            ev.ModelLoaded(model="m", version=1),
        ]
    )
    assert state["m"].requested == good
    bad = ev.Requested(config_override='{"max_batch_size": 999}')
    reload = ev.LoadRequested(model="m", versions=(1,), source=ev.Source.API, **_fields(bad))
    failed = ev.fold(
        [reload, ev.LoadFailed(model="m", version=1, reason="no", serving=True)], state
    )
    # The old copy serves with the old override, and that is what a restart loads again.
    assert failed["m"].requested == good
    restarted = ev.apply(failed, ev.ServerStarted(model="", mode="explicit"))
    assert restarted["m"].requested == good
    loaded = ev.fold([reload, ev.ModelLoaded(model="m", version=1)], state)
    assert loaded["m"].requested == bad


def _fields(requested: ev.Requested) -> dict[str, str]:
    return {
        "config_override": requested.config_override,
        "override_repository": requested.override_repository,
        "options_digest": requested.options_digest,
    }


def test_a_model_only_an_earlier_api_load_knew_is_not_listed_until_a_repository_holds_it() -> None:
    """Restarted (in poll mode, say) with a model that only an API load with its own files
    made: no repository holds it, nothing loads it: not listed, as Triton lists its
    repositories' folders. One a repository holds is listed, loaded or not."""
    state = ev.fold(
        [
            ev.LoadRequested(
                model="fo", versions=(1,), source=ev.Source.API, override_repository="/o/fo"
            ),
            ev.ModelLoaded(model="fo", version=1),
            ev.ServerStarted(model="", mode="poll"),
            ev.ModelDiscovered(model="plain", repository="/models", versions=(1,)),
        ]
    )
    assert state["fo"].requested is not None  # kept for a start in explicit mode
    assert [entry.name for entry in index(state)] == ["plain"]
