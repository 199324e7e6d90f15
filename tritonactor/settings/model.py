"""`Settings`: one frozen object, read from ``TRITONACTOR_*`` environment variables.

The environment is the single channel because hypercorn imports the app afresh in every worker
process: the CLI turns its flags into variables (``Settings.to_env``) and each worker reads them
back (``Settings.from_env``). The fields, with their kinds, flags and help, are declared in
`served.py` (what tritonactor honours) and `triton_only.py` (tritonserver's options it accepts
and ignores); this module adds the rules that hold between them and the ways in and out.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError, ValidationInfo, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from tritonactor.settings import common
from tritonactor.settings.common import SettingsError, default_journal
from tritonactor.settings.options import PREFIX, Option, Support, plain
from tritonactor.settings.served import ServedSettings
from tritonactor.settings.trace import TraceDefaults, trace_defaults
from tritonactor.settings.triton_only import TritonOnlySettings
from tritonactor.store.location import StoreLocation

# The smallest local response cache (bytes) Triton 2.51 starts with; the cache's own
# `tritonactor.cache.store.MIN_SIZE`, repeated so that reading settings needs no numpy.
LOCAL_CACHE_MIN_SIZE = 192

# Settings whose restrictions' header values the log masks.
SECRET_RESTRICTIONS = frozenset({"http_restricted_api", "grpc_restricted_protocol"})


class Settings(ServedSettings, TritonOnlySettings):
    """Everything the server is told at startup. Construct it with ``from_env`` in production;
    ``Settings(field=value, ...)`` (tests, tools) is held to the same rules."""

    model_config = SettingsConfigDict(
        frozen=True,
        extra="forbid",
        validate_default=True,
        protected_namespaces=(),
    )

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as error:
            raise _settings_error(error) from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"Settings are frozen: cannot set {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"Settings are frozen: cannot delete {name!r}")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Built from its arguments alone: `from_env` reads the mapping it is given (os.environ by
        # default) through `VariablesSource`, so that nothing depends on the process's
        # environment behind a caller's back.
        return (init_settings,)

    # -- reading and writing the environment -------------------------------------------------

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read the settings from ``env`` (default ``os.environ``). Raises SettingsError."""
        env = os.environ if env is None else env
        source = VariablesSource(cls, env)
        unknown = source.unknown()
        if unknown:
            # Rejected rather than ignored: a misspelt variable would otherwise silently fall
            # back to its default.
            raise SettingsError(
                f"unknown setting {', '.join(unknown)}; known: {', '.join(VARIABLES.values())}",
                variable=unknown[0],
            )
        values = source()
        # From ``env`` rather than os.environ, so that the result depends on its argument only.
        values.setdefault("journal", default_journal(env))
        return cls(**values)

    def to_env(self) -> dict[str, str]:
        """Every setting as a variable, so that ``from_env(s.to_env()) == s`` (a setting that
        is not given is an empty variable, which counts as unset)."""
        return {variable: self._text(name) for name, variable in VARIABLES.items()}

    def describe(self) -> list[tuple[str, str]]:
        """(variable, value) pairs for the startup log: every setting tritonactor honours, in
        declaration order, then the others that were given."""
        return [
            (variable, self._shown(name))
            for name, variable in VARIABLES.items()
            if OPTIONS[name].support is Support.HONOURED or self.given(name)
        ]

    def _shown(self, name: str) -> str:
        """A setting's value as the log may show it: a restricted API's header value is a
        secret, so it is masked (Triton does not log it either)."""
        value = getattr(self, name)
        if name in SECRET_RESTRICTIONS and value:
            masked = tuple(replace(restriction, value="***") for restriction in value)
            return OPTIONS[name].kind.format(masked)
        return self._text(name)

    def given(self, name: str) -> bool:
        """Whether a setting that has no value unless given (None, empty) was given."""
        return getattr(self, name) not in (None, (), {})

    def warnings(self) -> list[str]:
        """One line for each setting given that tritonactor does not act on, naming its flag
        and variable: the server logs them at startup."""
        lines = []
        for name, option in OPTIONS.items():
            if option.support is Support.HONOURED or not self.given(name):
                continue
            where = f"{option.flags_for(name)[0]} ({VARIABLES[name]}={self._shown(name)})"
            lines.append(f"{where}: {plain(option.notice)}")
        if self.response_cache_byte_size is not None:
            lines.append(
                f"--response-cache-byte-size ({VARIABLES['response_cache_byte_size']}="
                f"{self.response_cache_byte_size}) is deprecated, as in Triton: it is "
                f"--cache-config=local,size={self.response_cache_byte_size}"
            )
        if self.store_repositories() and os.environ.get("TRITON_CLOUD_CREDENTIAL_PATH"):
            lines.append(
                "TRITON_CLOUD_CREDENTIAL_PATH is set and not read: object stores take their "
                "credentials from the store's own variables (AWS_*, GOOGLE_APPLICATION_"
                "CREDENTIALS, AZURE_STORAGE_*; docs/object-store.md)"
            )
        return lines + list(self.trace_defaults().notes)

    def response_cache_size(self) -> int | None:
        """The size in bytes of the server's response cache (the `local` one), None for none."""
        if self.response_cache_byte_size is not None:
            return self.response_cache_byte_size
        local = self.cache_config.get("local")
        return None if local is None else int(local["size"])

    def local_repositories(self) -> tuple[Path, ...]:
        """The model repositories that are local folders."""
        return tuple(path for path in self.model_repositories if isinstance(path, Path))

    def store_repositories(self) -> tuple[StoreLocation, ...]:
        """The model repositories in object storage."""
        return tuple(path for path in self.model_repositories if isinstance(path, StoreLocation))

    def trace_defaults(self) -> TraceDefaults:
        """The initial trace settings the trace flags ask for, and warnings for the rest."""
        return trace_defaults(
            self.trace_level,
            self.trace_rate,
            self.trace_count,
            self.trace_log_frequency,
            self.trace_config,
        )

    def _text(self, name: str) -> str:
        value = getattr(self, name)
        return "" if value is None else OPTIONS[name].kind.format(value)

    # -- validation --------------------------------------------------------------------------

    @field_validator("*", mode="before")
    @classmethod
    def _read(cls, value: Any, info: ValidationInfo) -> Any:
        # Text (a variable, a flag, or a string given directly) is read by the field's kind;
        # other values are the field's type already, for pydantic to check. An empty text is
        # an empty value (a variable that is empty is not given at all).
        if isinstance(value, str) and value and info.field_name is not None:
            return OPTIONS[info.field_name].kind.parse(value)
        return value

    @field_validator("*", mode="after")
    @classmethod
    def _check(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None and info.field_name is not None:
            broken = OPTIONS[info.field_name].kind.check(value)
            if broken:
                raise ValueError(broken)
        return value

    @model_validator(mode="after")
    def _check_together(self) -> Settings:
        # Unless told otherwise every endpoint binds where the HTTP one does (Triton's default
        # for metrics; for gRPC ours: one address, however the server was started).
        for name in ("grpc_host", "metrics_host"):
            if getattr(self, name) is None:
                self.__dict__[name] = self.http_host
        self._check_repositories()
        self._check_journal()
        self._check_repository_cache()
        self._check_port_clashes()
        self._check_response_cache()
        return self

    def _check_repositories(self) -> None:
        if not self.model_repositories:
            raise _error("model_repositories", "", "is empty: expected at least one directory")
        for path in self.model_repositories:
            if isinstance(path, StoreLocation):
                continue  # read at the start, when the server opens the store
            if path == common.example_repository() and not path.is_dir():
                raise SettingsError(
                    f"{VARIABLES['model_repositories']} is unset and the bundled example "
                    f"repository {str(path)!r} is missing; set it to a model repository",
                    variable=VARIABLES["model_repositories"],
                )
            if not path.exists():
                raise _error("model_repositories", str(path), "does not exist")
            if not path.is_dir():
                raise _error("model_repositories", str(path), "is not a directory")
        # A repository listed twice (the same folder or store however spelled) counts once:
        # Triton serves a path given twice once too.
        seen: set[Path | StoreLocation] = set()
        unique = []
        for path in self.model_repositories:
            key = path if isinstance(path, StoreLocation) else path.resolve()
            if key not in seen:
                seen.add(key)
                unique.append(path)
        if len(unique) != len(self.model_repositories):
            self.__dict__["model_repositories"] = tuple(unique)

    def _check_response_cache(self) -> None:
        if self.response_cache_byte_size is not None and self.cache_config:
            raise SettingsError(
                f"{VARIABLES['response_cache_byte_size']} and {VARIABLES['cache_config']} are "
                "both set, incompatible flags: give one or the other "
                "(--response-cache-byte-size=N is --cache-config=local,size=N)",
                variable=VARIABLES["response_cache_byte_size"],
            )
        text = self._text("cache_config")
        if len(self.cache_config) > 1:
            raise _error(
                "cache_config",
                text,
                "found multiple cache configurations, but only a single cache is currently "
                "supported (Triton's words; the one cache here is 'local')",
            )
        for name, settings in self.cache_config.items():
            if name != "local":
                raise _error(
                    "cache_config", text, f"names the cache {name!r}: the one cache is 'local'"
                )
            if set(settings) != {"size"}:
                raise _error(
                    "cache_config",
                    text,
                    "needs the local cache's one setting, its size in bytes: local,size=<bytes>",
                )
            if not settings["size"].isdigit():
                raise _error("cache_config", text, "gives a size that is not a number of bytes")
        size = self.response_cache_size()
        if size is not None and size < LOCAL_CACHE_MIN_SIZE:
            name = "cache_config" if self.cache_config else "response_cache_byte_size"
            raise _error(
                name,
                self._text(name),
                f"is too small: the local cache needs at least {LOCAL_CACHE_MIN_SIZE} bytes "
                "(128 of them for its own bookkeeping), as in Triton",
            )
        memory = physical_memory()
        if size is not None and memory is not None and size > memory:
            name = "cache_config" if self.cache_config else "response_cache_byte_size"
            raise _error(
                name,
                self._text(name),
                f"is larger than this machine's memory ({memory} bytes): the size bounds the "
                "memory the cache takes (Triton: 'Internal: Failed to initialize LocalCache: "
                "failed to allocate buffer')",
            )

    def _check_journal(self) -> None:
        if self.journal.is_dir():
            raise _error("journal", str(self.journal), "is a directory: expected a file path")
        journal = self.journal.resolve()
        for repository in self.local_repositories():
            if journal.is_relative_to(repository.resolve()):
                raise _error(
                    "journal",
                    str(self.journal),
                    f"is inside model repository {str(repository)!r}: put it elsewhere, or "
                    "the repository watcher sees every write as a model change",
                )

    def _check_repository_cache(self) -> None:
        if not self.store_repositories():
            return
        cache = self.repository_cache_dir.resolve()
        for repository in self.local_repositories():
            local = repository.resolve()
            if cache.is_relative_to(local) or local.is_relative_to(cache):
                raise _error(
                    "repository_cache_dir",
                    str(self.repository_cache_dir),
                    f"overlaps model repository {str(repository)!r}: the copies of the "
                    "object stores would be served as models of it; put it elsewhere",
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


class VariablesSource(PydanticBaseSettingsSource):
    """The settings' variables in one mapping: ``TRITONACTOR_<NAME>`` by the declaration, an
    empty (or blank) value counting as unset. Values stay text, for the fields' kinds to read."""

    def __init__(self, settings_cls: type[BaseSettings], env: Mapping[str, str]) -> None:
        super().__init__(settings_cls)
        self._given = {
            name: value.strip()
            for name, value in env.items()
            if name.startswith(PREFIX) and value.strip()
        }

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        variable = VARIABLES[field_name]
        return self._given.get(variable), variable, False

    def __call__(self) -> dict[str, Any]:
        values = {}
        for name, field in self.settings_cls.model_fields.items():
            value, _, _ = self.get_field_value(field, name)
            if value is not None:
                values[name] = value
        return values

    def unknown(self) -> list[str]:
        """The given ``TRITONACTOR_*`` variables that name no setting."""
        return sorted(set(self._given) - set(VARIABLES.values()))


def _option(field: FieldInfo) -> Option:
    return next(item for item in field.metadata if isinstance(item, Option))


# Field name -> its Option and its variable, in declaration order: what tritonactor honours
# first, then tritonserver's options it ignores.
_FIELDS = [*ServedSettings.model_fields, *TritonOnlySettings.model_fields]
OPTIONS: dict[str, Option] = {name: _option(Settings.model_fields[name]) for name in _FIELDS}
VARIABLES: dict[str, str] = {name: option.variable_for(name) for name, option in OPTIONS.items()}


def _settings_error(error: ValidationError) -> SettingsError:
    """The first problem pydantic found, as `VARIABLE='value' rule`."""
    first = error.errors()[0]
    cause = first.get("ctx", {}).get("error")
    if isinstance(cause, SettingsError):
        return cause
    name = first["loc"][0] if first["loc"] else None
    if not isinstance(name, str) or name not in OPTIONS:
        return SettingsError(f"{name or 'settings'}: {first['msg']}")
    raw = first["input"]
    if not isinstance(raw, str):
        try:
            raw = OPTIONS[name].kind.format(raw)
        except (TypeError, ValueError, AttributeError):
            raw = str(raw)
    rule = str(cause) if cause is not None else first["msg"]
    return _error(name, raw, rule)


def physical_memory() -> int | None:
    """This machine's physical memory in bytes, None where the system does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


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
