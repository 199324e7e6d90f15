"""The server's settings: one frozen object, read from ``TRITONACTOR_*`` environment variables.

The environment is the single channel because hypercorn imports the app afresh in every worker
process: the CLI turns its flags into variables (``Settings.to_env``) and each worker reads them
back (``Settings.from_env``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from pathlib import Path
from typing import Any

PREFIX = "TRITONACTOR_"

# A port of 0 asks the OS for a free one, as a bind to port 0 always does; tests use it to avoid
# collisions. Turning an endpoint off is what TRITONACTOR_ALLOW_GRPC / _ALLOW_METRICS are for.
MIN_PORT, MAX_PORT = 0, 65535

_TRUE = frozenset({"true", "1", "yes", "on"})
_FALSE = frozenset({"false", "0", "no", "off"})


class SettingsError(ValueError):
    """A setting that cannot be used; says which variable, its value and what is allowed."""

    def __init__(self, message: str, variable: str | None = None) -> None:
        super().__init__(message)
        # Lets the CLI say which flag set the bad value.
        self.variable = variable


class ControlMode(StrEnum):
    NONE = "none"
    POLL = "poll"
    EXPLICIT = "explicit"


def example_repository() -> Path:
    """The model repository shipped inside the package, served when no repository is given."""
    # Relative to this module rather than ``tritonactor.__file__``: the package may be a namespace
    # package, whose ``__file__`` is None.
    return Path(__file__).resolve().parent / "examples" / "models"


def default_journal(env: Mapping[str, str] | None = None) -> Path:
    """Where the control-plane journal lives unless TRITONACTOR_JOURNAL says otherwise.

    A per-user state directory, never inside a model repository: the repository watcher would
    take every journal write for a change to the models.
    """
    env = os.environ if env is None else env
    state_home = env.get("XDG_STATE_HOME", "")
    # The XDG spec says a relative XDG_STATE_HOME is invalid and must be ignored.
    if not state_home or not os.path.isabs(state_home):
        home = env.get("HOME") or str(Path.home())
        state_home = os.path.join(home, ".local", "state")
    return Path(state_home) / "tritonactor" / "journal.jsonl"


def _default_repositories() -> tuple[Path, ...]:
    return (example_repository(),)


@dataclass(frozen=True)
class Settings:
    """Everything the server is told at startup. Construct it with ``from_env`` in production."""

    model_repositories: tuple[Path, ...] = field(default_factory=_default_repositories)
    model_control_mode: ControlMode = ControlMode.NONE
    repository_poll_secs: float = 15.0
    # Names of models to load at startup, or ("*",) for all. Only explicit mode acts on it, as in
    # Triton; other modes load everything anyway.
    load_models: tuple[str, ...] = ()
    http_host: str = "0.0.0.0"
    http_port: int = 8000
    grpc_host: str = "0.0.0.0"
    grpc_port: int = 8001
    metrics_host: str = "0.0.0.0"
    metrics_port: int = 8002
    journal: Path = field(default_factory=default_journal)
    strict_model_config: bool = False
    grpc_enabled: bool = True
    metrics_enabled: bool = True
    log_verbose: int = 0
    # text (alias default), ISO8601 (text with ISO 8601 times) or json (one object a line); see
    # docs/logging.md. tritonserver's own values are accepted so its --log-format works unchanged.
    log_format: str = "text"
    # Empty: log to stderr. Fixed at start: as in Triton, the logging API cannot move it.
    log_file: str = ""
    # Load a model when its first request arrives instead of at startup.
    lazy_load: bool = False
    # Bytes that loaded models may take (0: no limit); see docs/configuration.md.
    memory_budget: int = 0

    def __post_init__(self) -> None:
        # Checked here rather than in from_env so that a Settings built directly in a test or by
        # another tool is held to the same rules.
        self._check_values()
        self._check_repositories()
        self._check_journal()
        self._check_port_clashes()

    # -- reading and writing the environment -------------------------------------------------

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read the settings from ``env`` (default ``os.environ``). Raises SettingsError."""
        env = os.environ if env is None else env
        given = {
            name: value.strip()
            for name, value in env.items()
            if name.startswith(PREFIX) and value.strip()  # an empty value counts as unset
        }
        unknown = sorted(set(given) - set(VARIABLES.values()))
        if unknown:
            # Rejected rather than ignored: a misspelt variable would otherwise silently fall
            # back to its default.
            raise SettingsError(
                f"unknown setting {', '.join(unknown)}; known: {', '.join(VARIABLES.values())}",
                variable=unknown[0],
            )
        values: dict[str, Any] = {}
        for name, variable in VARIABLES.items():
            if variable in given:
                value = _PARSERS[name](variable, given[variable])
                # Checked here too, although __post_init__ would catch it, so that the message
                # quotes the text as given ("0", not 0.0).
                broken = _RULES[name](value) if name in _RULES else None
                if broken:
                    raise _error(name, given[variable], broken)
                values[name] = value
        if "journal" not in values:
            # From ``env`` rather than os.environ, so that the result depends on its argument only.
            values["journal"] = default_journal(env)
        return cls(**values)

    def to_env(self) -> dict[str, str]:
        """Every setting as a variable, so that ``from_env(s.to_env()) == s``."""
        return {VARIABLES[f.name]: _format(getattr(self, f.name)) for f in fields(self)}

    def describe(self) -> list[tuple[str, str]]:
        """(variable, value) pairs in declaration order, for the startup log line."""
        return list(self.to_env().items())

    # -- validation --------------------------------------------------------------------------

    def _check_values(self) -> None:
        if not isinstance(self.model_control_mode, ControlMode):
            # Accept "poll" as well as ControlMode.POLL from direct callers; store the enum.
            object.__setattr__(self, "model_control_mode", _check_mode(self.model_control_mode))
        for name, rule_broken in _RULES.items():
            value = getattr(self, name)
            broken = rule_broken(value)
            if broken:
                raise _error(name, _format(value), broken)

    def _check_repositories(self) -> None:
        if not self.model_repositories:
            raise _error("model_repositories", "", "is empty: expected at least one directory")
        for path in self.model_repositories:
            if path == example_repository() and not path.is_dir():
                raise SettingsError(
                    f"{VARIABLES['model_repositories']} is unset and the bundled example "
                    f"repository {str(path)!r} is missing; set it to a model repository",
                    variable=VARIABLES["model_repositories"],
                )
            if not path.exists():
                raise _error("model_repositories", str(path), "does not exist")
            if not path.is_dir():
                raise _error("model_repositories", str(path), "is not a directory")
        resolved = [path.resolve() for path in self.model_repositories]
        if len(set(resolved)) != len(resolved):
            raise _error(
                "model_repositories",
                _format(self.model_repositories),
                "lists a directory twice: every model would be found twice",
            )

    def _check_journal(self) -> None:
        if self.journal.is_dir():
            raise _error("journal", str(self.journal), "is a directory: expected a file path")
        journal = self.journal.resolve()
        for repository in self.model_repositories:
            if journal.is_relative_to(repository.resolve()):
                raise _error(
                    "journal",
                    str(self.journal),
                    f"is inside model repository {str(repository)!r}: put it elsewhere, or "
                    "the repository watcher sees every write as a model change",
                )

    def _check_port_clashes(self) -> None:
        endpoints = [("http", self.http_host, self.http_port)]
        if self.grpc_enabled:
            endpoints.append(("grpc", self.grpc_host, self.grpc_port))
        if self.metrics_enabled:
            endpoints.append(("metrics", self.metrics_host, self.metrics_port))
        for i, (name_a, host_a, port_a) in enumerate(endpoints):
            for name_b, host_b, port_b in endpoints[i + 1 :]:
                # Port 0 never clashes: the OS gives each bind its own port.
                if port_a and port_a == port_b and _may_overlap(host_a, host_b):
                    raise _error(
                        f"{name_b}_port",
                        port_b,
                        f"is also {VARIABLES[f'{name_a}_port']}: each endpoint needs its own port",
                    )


# Field name -> variable, in the order the fields are declared (and described).
VARIABLES: dict[str, str] = {
    "model_repositories": "TRITONACTOR_MODEL_REPOSITORY",
    "model_control_mode": "TRITONACTOR_MODEL_CONTROL_MODE",
    "repository_poll_secs": "TRITONACTOR_REPOSITORY_POLL_SECS",
    "load_models": "TRITONACTOR_LOAD_MODEL",
    "http_host": "TRITONACTOR_HTTP_HOST",
    "http_port": "TRITONACTOR_HTTP_PORT",
    "grpc_host": "TRITONACTOR_GRPC_HOST",
    "grpc_port": "TRITONACTOR_GRPC_PORT",
    "metrics_host": "TRITONACTOR_METRICS_HOST",
    "metrics_port": "TRITONACTOR_METRICS_PORT",
    "journal": "TRITONACTOR_JOURNAL",
    "strict_model_config": "TRITONACTOR_STRICT_MODEL_CONFIG",
    "grpc_enabled": "TRITONACTOR_ALLOW_GRPC",
    "metrics_enabled": "TRITONACTOR_ALLOW_METRICS",
    "log_verbose": "TRITONACTOR_LOG_VERBOSE",
    "log_format": "TRITONACTOR_LOG_FORMAT",
    "log_file": "TRITONACTOR_LOG_FILE",
    "lazy_load": "TRITONACTOR_LAZY_LOAD",
    "memory_budget": "TRITONACTOR_MEMORY_BUDGET",
}

_PORT_RULE = f"is not a port: expected an integer {MIN_PORT}..{MAX_PORT} (0: any free port)"


def _error(name: str, value: object, rule: str) -> SettingsError:
    variable = VARIABLES[name]
    return SettingsError(f"{variable}={str(value)!r} {rule}", variable=variable)


def _may_overlap(host_a: str, host_b: str) -> bool:
    """Whether binds to the same port on these two hosts would collide."""
    if host_a == host_b or "::" in (host_a, host_b):
        return True  # On Linux "::" is dual-stack: it takes the port on IPv4 addresses too.
    if "0.0.0.0" in (host_a, host_b):
        return ":" not in host_a + host_b  # Every IPv4 address, but no IPv6 one.
    return False


def _format(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        # Commas separate items, so a path or model name containing one cannot be expressed.
        return ",".join(str(item) for item in value)
    return str(value)


def _split(value: str) -> list[str]:
    # Blank items are dropped so that "a, b," and "a,,b" mean what they obviously mean.
    return [item.strip() for item in value.split(",") if item.strip()]


def _parse_paths(variable: str, value: str) -> tuple[Path, ...]:
    # Absolute so that the paths mean the same in every worker, whatever its working directory.
    return tuple(Path(os.path.abspath(os.path.expanduser(item))) for item in _split(value))


def _parse_path(variable: str, value: str) -> Path:
    return Path(os.path.abspath(os.path.expanduser(value)))


def _parse_names(variable: str, value: str) -> tuple[str, ...]:
    return tuple(_split(value))


def _check_mode(value: object) -> ControlMode:
    try:
        return ControlMode(str(value).lower())
    except ValueError:
        allowed = ", ".join(mode.value for mode in ControlMode)
        raise SettingsError(
            f"{VARIABLES['model_control_mode']}={str(value)!r} is not one of: {allowed}",
            variable=VARIABLES["model_control_mode"],
        ) from None


def _parse_mode(variable: str, value: str) -> ControlMode:
    return _check_mode(value)


def _parse_bool(variable: str, value: str) -> bool:
    lowered = value.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise SettingsError(
        f"{variable}={value!r} is not a boolean: expected true/false, 1/0, yes/no or on/off",
        variable=variable,
    )


def _parse_int(variable: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise SettingsError(f"{variable}={value!r} is not an integer", variable=variable) from None


_SIZE_UNITS = {
    "": 1,
    "k": 1000,
    "m": 1000**2,
    "g": 1000**3,
    "t": 1000**4,
    "ki": 1024,
    "mi": 1024**2,
    "gi": 1024**3,
    "ti": 1024**4,
}


def _parse_size(variable: str, value: str) -> int:
    """Bytes, with an optional unit: 512MiB, 4GiB, 2G (powers of 1000), 100000."""
    text = value.strip().lower().removesuffix("b").strip()
    number = text.rstrip("kmgti")
    unit = text[len(number) :]
    try:
        amount = float(number)
    except ValueError:
        amount = -1.0
    if unit not in _SIZE_UNITS or not math.isfinite(amount) or amount < 0:
        raise SettingsError(
            f"{variable}={value!r} is not a size: expected bytes, optionally with a unit "
            "(KiB, MiB, GiB, TiB or K, M, G, T), e.g. 4GiB; 0 for no limit",
            variable=variable,
        )
    return int(amount * _SIZE_UNITS[unit])


def _parse_port(variable: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise SettingsError(f"{variable}={value!r} {_PORT_RULE}", variable=variable) from None


def _parse_float(variable: str, value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise SettingsError(
            f"{variable}={value!r} is not a number: expected seconds > 0", variable=variable
        ) from None


LOG_FORMATS = ("text", "ISO8601", "json")
# tritonserver's name for plain text lines.
_LOG_FORMAT_ALIASES = {"default": "text"}


def _parse_log_format(variable: str, value: str) -> str:
    # Matched without case ("iso8601", "JSON") but stored in one spelling, so that to_env and
    # from_env agree.
    by_lower = {name.lower(): name for name in LOG_FORMATS} | _LOG_FORMAT_ALIASES
    return by_lower.get(value.lower(), value)


def _parse_log_file(variable: str, value: str) -> str:
    # Absolute, so that every worker writes to the same file whatever its working directory.
    return os.path.abspath(os.path.expanduser(value))


def _parse_host(variable: str, value: str) -> str:
    # Stored bare ("::1", not "[::1]"): grpclib and socket APIs want it so, and the CLI adds the
    # brackets that hypercorn's --bind needs.
    if value.startswith("[") and value.endswith("]"):
        value = value[1:-1]
    return value


def _poll_secs_rule(secs: float) -> str | None:
    if math.isfinite(secs) and secs > 0:
        return None
    return "is not a poll interval: expected seconds > 0"


def _port_rule(port: int) -> str | None:
    return None if MIN_PORT <= port <= MAX_PORT else _PORT_RULE


def _host_rule(host: str) -> str | None:
    return None if host else "is empty: expected a host name or IP address"


def _load_models_rule(names: tuple[str, ...]) -> str | None:
    # Triton too refuses "*" next to names: it is unclear whether the names were meant alone.
    if "*" in names and len(names) > 1:
        return "mixes '*' with model names: give either '*' alone or a list of names"
    return None


def _log_verbose_rule(level: int) -> str | None:
    return None if level >= 0 else "is negative: expected an integer >= 0"


def _log_format_rule(name: str) -> str | None:
    if name in LOG_FORMATS:
        return None
    return f"is not one of: {', '.join(LOG_FORMATS)} (default is an alias of text)"


def _log_file_rule(path: str) -> str | None:
    if not path:
        return None
    if os.path.isdir(path):
        return "is a directory: expected a file path"
    if not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        return "is in a directory that does not exist"
    return None


def _memory_budget_rule(size: int) -> str | None:
    return None if size >= 0 else "is negative: expected bytes >= 0 (0: no limit)"


# Field -> a check of its value alone, returning the rule it breaks (None: it breaks none).
_RULES: dict[str, Callable[[Any], str | None]] = {
    "repository_poll_secs": _poll_secs_rule,
    "load_models": _load_models_rule,
    "http_host": _host_rule,
    "http_port": _port_rule,
    "grpc_host": _host_rule,
    "grpc_port": _port_rule,
    "metrics_host": _host_rule,
    "metrics_port": _port_rule,
    "log_verbose": _log_verbose_rule,
    "log_format": _log_format_rule,
    "log_file": _log_file_rule,
    "memory_budget": _memory_budget_rule,
}

_PARSERS: dict[str, Callable[[str, str], Any]] = {
    "model_repositories": _parse_paths,
    "model_control_mode": _parse_mode,
    "repository_poll_secs": _parse_float,
    "load_models": _parse_names,
    "http_host": _parse_host,
    "http_port": _parse_port,
    "grpc_host": _parse_host,
    "grpc_port": _parse_port,
    "metrics_host": _parse_host,
    "metrics_port": _parse_port,
    "journal": _parse_path,
    "strict_model_config": _parse_bool,
    "grpc_enabled": _parse_bool,
    "metrics_enabled": _parse_bool,
    "log_verbose": _parse_int,
    "log_format": _parse_log_format,
    "log_file": _parse_log_file,
    "lazy_load": _parse_bool,
    "memory_budget": _parse_size,
}
