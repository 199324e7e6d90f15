"""What --exit-on-error stops the server for, read from the control plane's state."""

from __future__ import annotations

from tritonactor.control import events as ev
from tritonactor.server import startup_failures

READY = ev.VersionStatus(ev.VersionState.READY)


def broken(reason: str) -> ev.VersionStatus:
    return ev.VersionStatus(ev.VersionState.UNAVAILABLE, reason)


STATE: ev.State = {
    "good": ev.ModelStatus({1: READY}, wanted=True),
    "bad": ev.ModelStatus({1: READY, 2: broken("no file")}, wanted=True),
    "unparsable": ev.ModelStatus(
        reason="bad config", state=ev.VersionState.UNAVAILABLE, wanted=True
    ),
    # Known but never asked for (explicit mode): not a failure.
    "idle": ev.ModelStatus({1: broken("never loaded")}, wanted=False),
    # A version unloaded on purpose is not a failure either.
    "unloaded": ev.ModelStatus(
        {1: READY, 2: ev.VersionStatus(ev.VersionState.UNAVAILABLE, "unloaded", unloaded=True)},
        wanted=True,
    ),
}


def test_every_wanted_model_that_did_not_load_is_a_failure() -> None:
    assert startup_failures(STATE) == [
        ("bad", "version 2: no file"),
        ("unparsable", "bad config"),
    ]


def test_only_the_startup_list_counts_not_what_the_journal_restored() -> None:
    # Explicit mode: `bad` was loaded through the API before the restart and restored from the
    # journal; only the --load-model list can stop the server.
    assert startup_failures(STATE, ("good", "unparsable")) == [("unparsable", "bad config")]
    assert startup_failures(STATE, ("good",)) == []
