"""The settings table of docs/configuration.md, written from the declaration.

`python -m tritonactor.settings --markdown` prints it; `--update docs/configuration.md` writes it
between the document's markers; a unit test fails when the document's table differs."""

from __future__ import annotations

from typing import Any

from tritonactor.settings.model import OPTIONS, VARIABLES, Settings
from tritonactor.settings.options import Option

TABLE_START = "<!-- settings table: written by `python -m tritonactor.settings --update` -->"
TABLE_END = "<!-- end of settings table -->"


def markdown_table() -> str:
    """One row per setting: its variable, flags, default and meaning."""
    rows = ["| variable | flag | default | meaning |", "| --- | --- | --- | --- |"]
    for name, option in OPTIONS.items():
        cells = (f"`{VARIABLES[name]}`", _flags(name, option), default_text(name, option))
        rows.append("| " + " | ".join(_cell(text) for text in (*cells, option.meaning)) + " |")
    return "\n".join(rows) + "\n"


def replace_table(document: str) -> str:
    """`document` with the text between its table markers replaced by the current table."""
    start = document.index(TABLE_START) + len(TABLE_START)
    end = document.index(TABLE_END, start)
    return f"{document[:start]}\n{markdown_table()}{document[end:]}"


def documented_table(document: str) -> str:
    """The table as `document` has it, between its markers."""
    start = document.index(TABLE_START) + len(TABLE_START)
    return document[start : document.index(TABLE_END, start)].strip("\n") + "\n"


def _flags(name: str, option: Option) -> str:
    first, *aliases = option.flags_for(name)
    text = f"`{first}[=true|false]`" if option.kind.boolean else f"`{first}`"
    notes = []
    if option.kind.many:
        notes.append("repeatable")
    notes.extend(f"alias `{alias}`" for alias in aliases)
    text += f" ({'; '.join(notes)})" if notes else ""
    for switch in option.switches:
        text += f"; `{switch.flag}` sets `{switch.value}`"
    return text


def default_text(name: str, option: Option) -> str:
    """The default as the docs (and --help) show it."""
    if option.default:
        return option.default
    value: Any = Settings.model_fields[name].get_default(call_default_factory=True)
    if value is None:
        return "unset"
    if value in ("", (), {}):
        return "empty"
    return f"`{option.kind.format(value)}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
