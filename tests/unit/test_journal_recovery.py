"""What a journal line that cannot be read does to the fold: the models it names are no longer
known for sure (`ModelStatus.unsure`), across restarts, until an API load or unload settles them;
and a restart says which of them it does not restore (`index.unrestored`), which the index and
strict readiness then show."""

from __future__ import annotations

from tritonactor.control import events as ev
from tritonactor.control.index import index, ready, unrestored

API = ev.Source.API


def skipped(*models: str, kind: str = "LoadRequested", line: int = 3) -> ev.JournalLineSkipped:
    return ev.JournalLineSkipped(
        model=models[0] if models else "", line=line, reason="not JSON", models=models, kind=kind
    )


def started() -> ev.ServerStarted:
    return ev.ServerStarted(model="", mode="explicit")


def loaded_by_api(name: str) -> list[ev.Event]:
    return [
        ev.LoadRequested(model=name, versions=(1,), source=API),
        ev.ModelLoaded(model=name, version=1),
    ]


def test_a_model_named_by_a_bad_line_is_unsure_across_restarts() -> None:
    history = [
        started(),
        *loaded_by_api("a"),
        skipped("b"),
        *loaded_by_api("c"),
        started(),
        started(),
    ]
    state = ev.fold(history)
    assert state["a"].requested is not None and state["c"].requested is not None
    assert state["b"].requested is None
    assert state["b"].unsure == "line 3 of the journal could not be read (not JSON)"
    assert not state["a"].unsure and not state["c"].unsure


def test_an_api_load_or_unload_settles_it_and_a_startup_load_does_not() -> None:
    base = [skipped("b")]
    startup = ev.LoadRequested(model="b", versions=(1,), source=ev.Source.STARTUP)
    assert ev.fold([*base, startup])["b"].unsure
    assert not ev.fold([*base, *loaded_by_api("b")])["b"].unsure
    unload = ev.UnloadRequested(model="b", versions=(1,), source=API)
    assert not ev.fold([*base, unload])["b"].unsure
    # Settled, it is no longer kept by a restart (nothing was asked of it).
    assert "b" not in ev.fold([*base, unload, started()])


def test_a_bad_line_of_a_kind_that_asks_nothing_leaves_no_doubt() -> None:
    for kind in ("ModelDiscovered", "InstanceFailed", "ModelUnloaded", "VersionReplaced"):
        assert ev.fold([skipped("b", kind=kind)]) == {}
    # A type that cannot be read, or one that may have asked something: in doubt.
    assert ev.fold([skipped("b", kind="")])["b"].unsure
    assert ev.fold([skipped("b", kind="ModelLoaded")])["b"].unsure
    # A line naming no model, of a kind that asks nothing: the journal's warning is all there is.
    assert ev.fold([skipped(kind="InstanceFailed")]) == {}
    assert ev.fold([skipped(kind="ServerStarted")]) == {}
    # A line naming several (two records run together): each is in doubt.
    state = ev.fold([skipped("b", "d", kind="")])
    assert state["b"].unsure and state["d"].unsure


def test_a_restart_says_what_it_does_not_restore_and_readiness_waits_for_it() -> None:
    state = ev.fold([*loaded_by_api("a"), skipped("b"), skipped("e"), started()])
    wanted = {"a": None, "e": None}  # the journal restores a; the startup list names e
    [(name, reason)] = unrestored(state, wanted)
    assert name == "b"
    assert reason.startswith("not restored: line 3 of the journal could not be read (not JSON)")
    assert "Load or unload it" in reason
    assert ready(state)  # before the manager records it
    state = ev.apply(state, ev.LoadFailed(model=name, version=None, reason=reason))
    [entry] = [entry for entry in index(state) if entry.name == "b"]
    assert (entry.state, entry.reason) == ("UNAVAILABLE", reason)
    assert not ready(state)
    # Settled by an unload through the API: ready again, and the doubt is gone, its report too.
    state = ev.apply(state, ev.UnloadRequested(model="b", versions=(), source=API))
    assert ready(state)
    assert unrestored(state, wanted) == []
    assert [entry.reason for entry in index(state) if entry.name == "b"] in ([], [""])


def test_nothing_unsure_nothing_unrestored() -> None:
    assert unrestored(ev.fold([*loaded_by_api("a"), started()]), {}) == []


def test_a_bad_line_naming_no_model_leaves_the_whole_restore_in_doubt() -> None:
    """Cut short before its model, or with a model that is not a string: it may have been any
    model's API load, so a restart reports the restore as not whole (under the name "") and
    strict readiness waits until an API load or unload settles it."""
    for kind in ("LoadRequested", "UnloadRequested", "ModelLoaded", "ModelRemoved", ""):
        found = ev.ModelDiscovered(model="a", repository="/models", versions=(1,))
        state = ev.fold(
            [*loaded_by_api("a"), skipped(kind=kind, line=4), started(), started(), found]
        )
        assert state[ev.UNNAMED].unsure == "line 4 of the journal could not be read (not JSON)"
        assert state["a"].requested is not None and not state["a"].unsure
        assert [entry.name for entry in index(state)] == ["a"]  # not reported yet: not listed
        [(name, reason)] = unrestored(state, {"a": None})
        assert name == ev.UNNAMED
        assert reason.startswith(
            "not fully restored: line 4 of the journal could not be read (not JSON) and names "
            "no model"
        )
        assert (
            "Any load through the API, or unload of a model this server knows, settles this"
            in reason
        )
        state = ev.apply(state, ev.LoadFailed(model=name, version=None, reason=reason))
        [entry] = [entry for entry in index(state) if entry.name == ""]
        assert (entry.state, entry.reason) == ("UNAVAILABLE", reason)
        assert not ready(state)
        # A startup load settles nothing; an API load or unload of any model does.
        startup = ev.LoadRequested(model="a", versions=(1,), source=ev.Source.STARTUP)
        assert not ready(ev.apply(state, startup))
        for settle in (
            ev.LoadRequested(model="z", versions=(1,), source=API),
            ev.UnloadRequested(model="a", versions=(1,), source=API),
        ):
            settled = ev.apply(state, settle)
            assert ev.UNNAMED not in settled
            assert unrestored(ev.fold([started()], settled), {}) == []
        # API requests between the bad line and the restart that reported it settle nothing
        # (they are not an answer to the report); one after the report settles it for good:
        # the next restart folds the same journal to the same answer.
        history = [*loaded_by_api("a"), skipped(kind=kind), *loaded_by_api("b"), started()]
        assert ev.fold(history)[ev.UNNAMED].unsure
        reported = ev.LoadFailed(model=name, version=None, reason=reason)
        history += [reported, *loaded_by_api("c"), started()]
        assert ev.UNNAMED not in ev.fold(history)
