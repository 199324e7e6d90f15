"""The control-plane journal: records, replay, torn and corrupt files, concurrent writers."""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
import multiprocessing
import os
import re
import stat
import types
import typing
from pathlib import Path
from typing import Any

import pytest

from tritonactor.control import events as ev
from tritonactor.control.journal import (
    EVENT_TYPES,
    Journal,
    JournalEntry,
    JournalError,
    JournalLocationError,
    decode,
    encode,
    open_journal,
)

SCALARS: dict[Any, tuple[Any, Any]] = {
    # A non-ASCII character, a JSON-hostile line separator and a lone surrogate (what an
    # undecodable file name becomes) must all survive.
    str: ("text é \u2028 \udcff", ""),
    int: (7, 0),
    float: (0.1, 2.0),
    bool: (True, False),
    type(None): (None, None),
}


def sample(hint: Any, variant: int) -> Any:
    """A value of `hint`; variant 1 takes the other branch where there is one (None, not int)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        if variant == 1 and type(None) in args:
            return None
        return sample(next(arg for arg in args if arg is not type(None)), variant)
    if origin is tuple:
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            return (sample(args[0], 0), sample(args[0], 1))[: 2 - variant]
        return tuple(sample(arg, variant) for arg in args)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        members = list(hint)
        return members[-1 - variant % len(members)]
    return SCALARS[hint][variant]


def every_event(variant: int) -> list[ev.Event]:
    built = []
    for cls in EVENT_TYPES.values():
        hints = typing.get_type_hints(cls)
        values = {f.name: sample(hints[f.name], variant) for f in dataclasses.fields(cls)}
        built.append(cls(**values))
    return built


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "journal.jsonl"


def lines(path: Path) -> list[bytes]:
    data = path.read_bytes()
    assert data == b"" or data.endswith(b"\n")
    return data.split(b"\n")[:-1]


def test_every_event_class_of_events_is_journaled() -> None:
    defined = {
        name
        for name, value in vars(ev).items()
        if isinstance(value, type) and issubclass(value, ev.Event) and value is not ev.Event
    }
    assert set(EVENT_TYPES) == defined
    assert "ModelLoaded" in EVENT_TYPES


@pytest.mark.parametrize("variant", [0, 1])
def test_every_event_round_trips_through_a_json_line(variant: int) -> None:
    for event in every_event(variant):
        line = json.dumps(encode(event))
        back = decode(json.loads(line))
        assert back == event
        assert type(back) is type(event)
        for field in dataclasses.fields(event):
            # Equal is not enough: a list equals no tuple, but a str equals its StrEnum member.
            assert type(getattr(back, field.name)) is type(getattr(event, field.name))


def test_record_shape() -> None:
    event = ev.ModelLoaded(model="simple", version=1, config_digest="ab", time=12.5)
    record = encode(event)
    assert record == {"v": 1, "type": "ModelLoaded", "fields": record["fields"]}
    assert record["fields"]["model"] == "simple" and record["fields"]["time"] == 12.5
    assert {"version": 1, "config_digest": "ab"}.items() <= record["fields"].items()
    entry = JournalEntry(3, event).as_json()
    assert entry["seq"] == 3 and entry["type"] == "ModelLoaded"
    assert entry["model"] == "simple" and entry["time"] == 12.5
    assert entry["fields"]["version"] == 1 and "model" not in entry["fields"]


def test_unknown_fields_are_ignored_and_defaults_may_be_absent() -> None:
    record = {
        "v": 1,
        "type": "ModelLoaded",
        "written_by": "a newer server",
        "fields": {"model": "m", "time": 3, "version": 2, "gpu_uuid": "GPU-1"},
    }
    assert decode(record) == ev.ModelLoaded(model="m", time=3.0, version=2)


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"v": 2, "type": "ModelLoaded", "fields": {}}, "unknown schema version 2"),
        ({"v": True, "type": "ModelLoaded", "fields": {}}, "unknown schema version True"),
        ({"type": "ModelLoaded", "fields": {}}, "unknown schema version None"),
        ({"v": 1, "type": "ModelExploded", "fields": {"model": "m"}}, "unknown event type"),
        ({"v": 1, "type": "Event", "fields": {"model": "m"}}, "unknown event type"),
        ({"v": 1, "type": "ModelLoaded", "fields": {"model": "m"}}, "missing field 'version'"),
        ({"v": 1, "type": "ModelLoaded"}, "'fields'"),
        ([1, 2], "JSON object"),
        (
            {"v": 1, "type": "ModelLoaded", "fields": {"model": "m", "version": "1"}},
            "ModelLoaded.version: expected int",
        ),
        (
            {"v": 1, "type": "ModelLoaded", "fields": {"model": "m", "version": True}},
            "expected int",
        ),
        (
            {
                "v": 1,
                "type": "UnloadRequested",
                "fields": {"model": "m", "versions": [1], "source": "x"},
            },
            "UnloadRequested.source: expected Source",
        ),
    ],
)
def test_bad_records_are_journal_errors(record: Any, message: str) -> None:
    with pytest.raises(JournalError, match=re.escape(message)):
        decode(record)


def test_events_that_could_not_be_read_back_are_refused(path: Path) -> None:
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Elsewhere(ev.Event):
        pass

    with Journal(path) as journal:
        with pytest.raises(JournalError, match="not an event"):
            journal.append(Elsewhere(model="m"))
        with pytest.raises(JournalError, match="expected"):
            journal.append(ev.ModelLoaded(model="m", version=[1]))  # type: ignore[arg-type]
        with pytest.raises(JournalError):
            journal.append(ev.ModelLoaded(model="m", version=1, load_seconds=float("nan")))
        assert journal.last_seq == 0
    assert path.read_bytes() == b""


def test_appends_are_durable_and_replayed(path: Path) -> None:
    written = every_event(0) + every_event(1)
    journal, replayed = open_journal(path)
    assert replayed == []
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with journal:
        seqs = [journal.append(event) for event in written]
        assert seqs == list(range(1, len(written) + 1))
        # On disk before close: another reader sees every line.
        assert len(lines(path)) == len(written)
    assert journal.closed
    again, replayed = open_journal(path)
    with again:
        assert replayed == written
        assert again.read() == written
        assert again.append(ev.InstanceRestarted(model="m", version=1)) == len(written) + 1


@pytest.mark.parametrize("tail", [b'{"v":1,"type":"Model', b"\x00\x00\x00", b"{not json"])
def test_a_torn_last_line_is_dropped_and_the_next_append_starts_a_line(
    path: Path, tail: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    first = ev.ModelDiscovered(model="a", repository="/r", versions=(1,))
    with Journal(path) as journal:
        journal.append(first)
    with path.open("ab") as file:
        file.write(tail)
    with Journal(path) as reader, caplog.at_level(logging.WARNING):
        assert reader.read() == [first]
    assert "torn last line" in caplog.text
    caplog.clear()
    journal, replayed = open_journal(path)
    with journal:
        assert replayed == [first]
        assert "torn last line" in caplog.text
        second = ev.ModelLoaded(model="a", version=1)
        assert journal.append(second) == 2
    assert [decode(json.loads(line)) for line in lines(path)] == [first, second]


@pytest.mark.parametrize("bad", [b"{not json\n", b'{"v":1,"type":"LoadRequested","fields":{\n'])
def test_a_whole_bad_last_line_is_skipped_and_kept_not_truncated(
    path: Path, bad: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    """Only bytes after the last newline are torn: a last line that has its newline was
    written whole, so it is skipped, kept aside and left in place like any other bad line."""
    first = ev.ModelDiscovered(model="a", repository="/r", versions=(1,))
    with Journal(path) as journal:
        journal.append(first)
    with path.open("ab") as file:
        file.write(bad)
    original = path.read_bytes()
    with Journal(path) as reader:
        [event, skipped] = reader.read()
    assert event == first and isinstance(skipped, ev.JournalLineSkipped) and skipped.line == 2
    with caplog.at_level(logging.WARNING):
        journal, replayed = open_journal(path)
    with journal:
        assert replayed == [first, skipped]
        assert path.read_bytes() == original
        assert "torn" not in caplog.text and "line 2 cannot be read" in caplog.text
        kept = path.with_name("journal.jsonl.rejected")
        [record] = [json.loads(line) for line in kept.read_text().splitlines()]
        assert record["line"] == 2 and record["text"] == bad.rstrip(b"\n").decode()
        second = ev.ModelLoaded(model="a", version=1)
        assert journal.append(second) == 3
    assert path.read_bytes() == original + lines(path)[-1] + b"\n"


def test_a_line_left_unfinished_after_open_is_dropped_by_the_next_append(path: Path) -> None:
    journal, _ = open_journal(path)
    with journal:
        journal.append(ev.InstanceRestarted(model="a", version=1))
        # Another process died in the middle of its write.
        with path.open("ab") as file:
            file.write(b'{"v":1,"type":"Mod')
        assert journal.append(ev.InstanceRestarted(model="b", version=1)) == 2
    assert [decode(json.loads(line)).model for line in lines(path)] == ["a", "b"]


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (b"{not json\n", "not JSON"),
        (b"\n", "not JSON"),
        (b'{"v":1,"type":"ModelExploded","fields":{"model":"m"}}\n', "unknown event type"),
        (
            b'{"v":9,"type":"InstanceRestarted","fields":{"model":"m","version":1}}\n',
            "unknown schema version",
        ),
    ],
)
def test_a_bad_line_is_skipped_kept_aside_and_the_lines_around_it_still_count(
    path: Path, bad: bytes, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    before = ev.InstanceRestarted(model="a", version=1)
    after = ev.InstanceRestarted(model="c", version=1)
    with Journal(path) as journal:
        journal.append(before)
    with path.open("ab") as file:
        file.write(bad)
    # Not torn: it has a good record after it.
    with Journal(path) as journal:
        journal.append(after)
    original = path.read_bytes()
    with Journal(path) as reader:
        [first, skipped, last] = reader.read()
    assert (first, last) == (before, after)
    assert isinstance(skipped, ev.JournalLineSkipped)
    assert skipped.line == 2 and reason in skipped.reason

    with caplog.at_level(logging.WARNING):
        journal, replayed = open_journal(path)
    with journal:
        assert replayed == [before, skipped, after]
        assert path.read_bytes() == original  # lines are never rewritten: seqs stay
        kept = path.with_name("journal.jsonl.rejected")
        [record] = [json.loads(line) for line in kept.read_text().splitlines()]
        assert record["line"] == 2 and reason in record["reason"]
        assert record["text"] == bad.rstrip(b"\n").decode()
        assert stat.S_IMODE(kept.stat().st_mode) == 0o600
        [warning] = [r for r in caplog.records if "cannot be read" in r.getMessage()]
        assert warning.levelno == logging.WARNING
        assert "line 2" in warning.getMessage() and str(kept) in warning.getMessage()
        assert journal.append(ev.InstanceRestarted(model="d", version=1)) == 4
        # Listed at its seq as what it replays as.
        assert [(e.seq, type(e.event).__name__) for e in journal.page(0, 10)] == [
            (1, "InstanceRestarted"),
            (2, "JournalLineSkipped"),
            (3, "InstanceRestarted"),
            (4, "InstanceRestarted"),
        ]
    journal, replayed = open_journal(path)
    journal.close()
    assert [event.model for event in replayed] == ["a", skipped.model, "c", "d"]


def test_what_a_bad_line_still_shows_is_kept(path: Path) -> None:
    """The model names and the event type of a line that cannot be read, as far as they can be
    read: the fold needs them to know which models it can no longer be sure of."""
    good = encode(ev.LoadRequested(model="b", versions=(1,), source=ev.Source.API))
    text = json.dumps(good, separators=(",", ":")).encode()
    garbled = text.replace(b'"versions":[1]', b'"versions":[1\x00')
    assert garbled != text
    merged = b'{"v":1,"type":"LoadRequ{"v":1,"type":"UnloadRequested","fields":{"model":"x\\"y"'
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\n".join([garbled, b"\xff\xfe", merged, b"{}", b""]))
    journal, replayed = open_journal(path)
    journal.close()
    assert [(e.line, e.models, e.kind) for e in replayed] == [  # type: ignore[attr-defined]
        (1, ("b",), "LoadRequested"),
        (2, (), ""),
        (3, ('x"y',), "UnloadRequested"),
        (4, (), ""),
    ]
    assert [e.model for e in replayed] == ["b", "", 'x"y', ""]


def test_a_blank_line_is_skipped_and_said_but_leaves_no_doubt(path: Path) -> None:
    """A line of white space alone (a stray edit) holds no lost record: it is warned of and
    kept aside like any bad line, and the fold is sure of everything (it made the whole restore
    doubtful before). The history pages it with the same reason the start gave."""
    good = encode(ev.LoadRequested(model="b", versions=(1,), source=ev.Source.API))
    text = json.dumps(good, separators=(",", ":")).encode()
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\n".join([text, b"", b"  \t", b"not json", b""]))
    journal, replayed = open_journal(path)
    try:
        kinds = [getattr(e, "kind", type(e).__name__) for e in replayed]
        assert kinds == ["LoadRequested", ev.BLANK_LINE, ev.BLANK_LINE, ""]
        state = ev.fold(replayed)
        assert ev.UNNAMED in state  # the line of text that is no record still leaves a doubt
        assert ev.fold(replayed[:3]) == ev.fold(replayed[:1])  # the blank ones leave none
        paged = [entry.event for entry in journal.page(0, 10)]
        assert [getattr(e, "reason", "") for e in paged] == [
            getattr(e, "reason", "") for e in replayed
        ]
    finally:
        journal.close()


def test_two_records_run_together_are_judged_by_the_one_that_asked(path: Path) -> None:
    """A line of a record that asks nothing run into an API unload's: the line may have lost
    that unload, so its model is in doubt, whichever record comes first."""
    discovered = b'{"v":1,"type":"ModelDiscovered","fields":{"model":"x","time":1.0'
    unload = (
        b'{"v":1,"type":"UnloadRequested","fields":{"model":"ident","time":1.0,'
        b'"versions":[1],"source":"api","reason":""}}'
    )
    path.parent.mkdir(parents=True)
    path.write_bytes(discovered + unload + b"\n" + unload + discovered + b"\n")
    journal, replayed = open_journal(path)
    journal.close()
    assert [e.kind for e in replayed] == ["UnloadRequested", "UnloadRequested"]  # type: ignore[attr-defined]
    assert ev.fold(replayed)["ident"].unsure


def test_the_rejected_file_says_what_is_bad_now(path: Path) -> None:
    good = json.dumps(encode(ev.ModelRemoved(model="a"))).encode() + b"\n"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"garbage\n" + good)
    open_journal(path)[0].close()
    kept = path.with_name("journal.jsonl.rejected")
    assert [json.loads(line)["line"] for line in kept.read_text().splitlines()] == [1]
    # Mended by hand: nothing is kept aside any more.
    path.write_bytes(good)
    open_journal(path)[0].close()
    assert not kept.exists()


def test_many_bad_lines_are_counted_past_the_first_ones(
    path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path.parent.mkdir(parents=True)
    path.write_bytes(b"garbage\n" * 30 + b"{}\n")
    with caplog.at_level(logging.WARNING):
        journal, replayed = open_journal(path)
    journal.close()
    assert len(replayed) == 31
    assert len([r for r in caplog.records if "cannot be read:" in r.getMessage()]) == 20
    assert "11 more lines cannot be read" in caplog.text
    kept = path.with_name("journal.jsonl.rejected")
    assert len(kept.read_text().splitlines()) == 31


def test_a_writer_follows_the_file_when_it_is_moved_away(path: Path) -> None:
    older, _ = open_journal(path)
    with older:
        older.append(ev.InstanceRestarted(model="before", version=1))
        os.rename(path, path.with_name("moved.jsonl"))
        newer, replayed = open_journal(path)
        with newer:
            assert replayed == []
            assert older.append(ev.InstanceRestarted(model="after", version=1)) == 1
            assert [e.model for e in newer.read()] == ["after"]
            assert [entry.seq for entry in newer.page(0, 10)] == [1]


def test_paging(path: Path) -> None:
    journal, _ = open_journal(path)
    with journal, Journal(path) as other:
        for number in range(10):
            journal.append(ev.InstanceRestarted(model=f"m{number}", version=1))
        assert [(e.seq, e.event.model) for e in other.page(0, 4)] == [
            (1, "m0"),
            (2, "m1"),
            (3, "m2"),
            (4, "m3"),
        ]
        assert [e.seq for e in other.page(4, 4)] == [5, 6, 7, 8]
        assert [e.seq for e in other.page(8, 4)] == [9, 10]
        assert other.page(10, 4) == []
        # Appended by another writer after this one indexed the file.
        assert journal.append(ev.InstanceRestarted(model="m10", version=1)) == 11
        assert [(e.seq, e.event.model) for e in other.page(10, 4)] == [(11, "m10")]
        assert other.last_seq == 11
        assert other.append(ev.InstanceRestarted(model="m11", version=1)) == 12
        assert [e.seq for e in journal.page(9, 100)] == [10, 11, 12]
        with pytest.raises(ValueError):
            journal.page(-1, 10)
        with pytest.raises(ValueError):
            journal.page(0, 0)


def append_many(path: str, writer: int, count: int, start: Any) -> None:
    start.wait()
    seqs = []
    with Journal(path) as journal:
        for number in range(count):
            # Long lines: more bytes in flight per write, more chance to interleave if unlocked.
            event = ev.LoadFailed(model=f"w{writer}", version=number, reason=str(writer) * 4000)
            seqs.append(journal.append(event))
    Path(f"{path}.seqs-{writer}").write_text(json.dumps(seqs))


def test_two_processes_appending_never_interleave(path: Path) -> None:
    open_journal(path)[0].close()
    context = multiprocessing.get_context("fork")
    start = context.Event()
    count = 300
    writers = [
        context.Process(target=append_many, args=(str(path), writer, count, start))
        for writer in range(2)
    ]
    for process in writers:
        process.start()
    start.set()
    for process in writers:
        process.join(timeout=60)
        assert process.exitcode == 0
    journal, replayed = open_journal(path)
    with journal:
        assert len(lines(path)) == 2 * count
        for writer in range(2):
            mine = [e for e in replayed if e.model == f"w{writer}"]
            assert [e.version for e in mine] == list(range(count))  # type: ignore[attr-defined]
            assert all(e.reason == str(writer) * 4000 for e in mine)  # type: ignore[attr-defined]
        assert journal.last_seq == 2 * count
        # Each writer was told the line its event landed on.
        for writer in range(2):
            seqs = json.loads(Path(f"{path}.seqs-{writer}").read_text())
            assert [replayed[seq - 1].model for seq in seqs] == [f"w{writer}"] * count
            assert [replayed[seq - 1].version for seq in seqs] == list(range(count))  # type: ignore[attr-defined]


def test_an_unwritable_location_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    target = blocker / "journal.jsonl"
    with pytest.raises(JournalLocationError, match=re.escape(str(target))):
        open_journal(target)
    with pytest.raises(JournalLocationError, match=re.escape(str(tmp_path))):
        open_journal(tmp_path)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through permissions")
def test_a_read_only_folder_is_a_clear_error(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir(mode=0o500)
    with pytest.raises(JournalLocationError, match="Permission denied"):
        open_journal(folder / "journal.jsonl")


def test_parents_are_created_private(path: Path) -> None:
    open_journal(path)[0].close()
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    closed = Journal(path)
    closed.close()
    closed.close()
    with pytest.raises(ValueError, match="closed"):
        closed.append(ev.InstanceRestarted(model="m", version=1))
