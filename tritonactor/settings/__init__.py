"""The server's settings: one frozen object, read from ``TRITONACTOR_*`` environment variables
(and, through ``tritonactor serve``, tritonserver's flags).

Each setting is declared once (`served.py`, `triton_only.py`): its type, default, kind of value,
flags, variable and help. The CLI's flags and --help, the variables, and docs/configuration.md's
table are all read from that declaration.
"""

from tritonactor.settings.common import (
    ControlMode,
    SettingsError,
    default_journal,
    example_repository,
)
from tritonactor.settings.docs import markdown_table
from tritonactor.settings.kinds import LOG_FORMATS, MAX_PORT, MIN_PORT
from tritonactor.settings.model import OPTIONS, VARIABLES, Settings
from tritonactor.settings.options import PREFIX, Option, Support, Switch
from tritonactor.settings.pairs import RESTRICTED_CATEGORIES, GroupSetting, Restriction
from tritonactor.settings.trace import TraceDefaults

__all__ = [
    "LOG_FORMATS",
    "MAX_PORT",
    "MIN_PORT",
    "OPTIONS",
    "PREFIX",
    "RESTRICTED_CATEGORIES",
    "VARIABLES",
    "ControlMode",
    "GroupSetting",
    "Option",
    "Restriction",
    "Settings",
    "SettingsError",
    "Support",
    "Switch",
    "TraceDefaults",
    "default_journal",
    "example_repository",
    "markdown_table",
]
