"""What the declaration says about each setting besides its type and default: its kind of value,
its flags, its variable, and whether tritonactor honours it. The CLI, `--help`, the docs table
and the startup warnings are all read from these."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from tritonactor.settings.kinds import Kind

PREFIX = "TRITONACTOR_"


class Support(Enum):
    """What tritonactor does with a setting."""

    HONOURED = "honoured"
    # Accepted and kept, but what it configures does not exist yet: warned about when given.
    KEPT = "kept"
    # A tritonserver option with no meaning here: accepted, warned about when given.
    IGNORED = "ignored"


@dataclass(frozen=True, slots=True)
class Switch:
    """A flag that takes no value and sets its setting to `value` (tritonserver's
    `--disable-auto-complete-config`)."""

    flag: str
    value: str
    help: str


@dataclass(frozen=True, slots=True)
class Option:
    """A setting's declaration, beside its type and default in `Settings`:

    `help` says what it does (in --help and the docs table; markdown is fine, --help shows it as
    written). `flags` default to the field's name in kebab case; `variable` (after the prefix)
    to it in upper case. `default` is how the docs show a default that is not a plain value.
    `why`: for a setting that is not honoured, the reason, shown as "accepted, ignored: why"."""

    help: str
    kind: Kind
    group: str
    flags: tuple[str, ...] = ()
    variable: str = ""
    default: str = ""
    support: Support = Support.HONOURED
    why: str = ""
    switches: tuple[Switch, ...] = ()

    def flags_for(self, field: str) -> tuple[str, ...]:
        return self.flags or ("--" + field.replace("_", "-"),)

    def variable_for(self, field: str) -> str:
        return PREFIX + (self.variable or field.upper())

    @property
    def notice(self) -> str:
        """What a setting that is not honoured says about itself."""
        if self.support is Support.IGNORED:
            return f"accepted, ignored: {self.why}"
        return f"accepted, {self.why}"

    @property
    def meaning(self) -> str:
        """The docs table's and --help's text."""
        if self.support is Support.IGNORED:
            return self.notice
        if self.support is Support.KEPT:
            return f"{self.help}. {self.notice[0].upper()}{self.notice[1:]}"
        return self.help


_LINK = re.compile(r"\[([^\]]+)\]\([^)]*\)")


def plain(text: str) -> str:
    """Markdown help as a terminal or a log line shows it: links as their text, no backticks."""
    return _LINK.sub(r"\1", text).replace("`", "")


def honoured(
    help: str,
    kind: Kind,
    group: str,
    *flags: str,
    variable: str = "",
    default: str = "",
    switches: tuple[Switch, ...] = (),
) -> Option:
    return Option(help, kind, group, flags, variable, default, switches=switches)


def kept(help: str, kind: Kind, group: str, why: str) -> Option:
    """Accepted and kept for a feature still to come; a warning names it when given."""
    return Option(help, kind, group, support=Support.KEPT, why=why)


def ignored(kind: Kind, why: str, group: str = "tritonserver options ignored") -> Option:
    """A tritonserver option tritonactor accepts (its value checked) and ignores, with a
    warning naming it when given."""
    return Option("", kind, group, support=Support.IGNORED, why=why)
