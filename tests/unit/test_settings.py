from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

from tritonactor import settings as settings_module
from tritonactor.settings import (
    OPTIONS,
    VARIABLES,
    ControlMode,
    Settings,
    SettingsError,
    Support,
    default_journal,
    example_repository,
)
from tritonactor.settings import common as settings_common


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "models"
    path.mkdir()
    return path


@pytest.fixture
def env(repo: Path, tmp_path: Path) -> dict[str, str]:
    """The smallest environment that is valid wherever the tests run."""
    return {
        "TRITONACTOR_MODEL_REPOSITORY": str(repo),
        "HOME": str(tmp_path / "home"),
    }


@pytest.fixture
def bundled(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Stand in for the example repository, which another part of the package provides."""
    path = tmp_path / "bundled"
    path.mkdir()
    monkeypatch.setattr(settings_common, "example_repository", lambda: path)
    return path


def error_for(env: dict[str, str]) -> str:
    with pytest.raises(SettingsError) as caught:
        Settings.from_env(env)
    return str(caught.value)


def test_variables_cover_every_field() -> None:
    assert set(Settings.model_fields) == set(VARIABLES)
    assert all(name.startswith("TRITONACTOR_") for name in VARIABLES.values())
    assert len(set(VARIABLES.values())) == len(VARIABLES)


def test_defaults(env: dict[str, str], repo: Path, tmp_path: Path) -> None:
    s = Settings.from_env(env)
    assert s.model_repositories == (repo,)
    assert s.model_control_mode is ControlMode.NONE
    assert s.repository_poll_secs == 15.0
    assert s.load_models == ()
    assert (s.http_host, s.http_port) == ("0.0.0.0", 8000)
    assert (s.grpc_host, s.grpc_port) == ("0.0.0.0", 8001)
    assert (s.metrics_host, s.metrics_port) == ("0.0.0.0", 8002)
    assert s.journal == tmp_path / "home" / ".local" / "state" / "tritonactor" / "journal.jsonl"
    assert s.strict_model_config is False
    assert s.grpc_enabled is True
    assert s.metrics_enabled is True
    assert s.log_verbose == 0
    assert s.log_format == "text"
    assert s.log_file == ""


def test_unset_repository_serves_the_bundled_examples(bundled: Path, tmp_path: Path) -> None:
    s = Settings.from_env({"HOME": str(tmp_path)})
    assert s.model_repositories == (bundled,)
    assert not s.journal.is_relative_to(bundled)


def test_example_repository_is_inside_the_package() -> None:
    package = Path(settings_module.__file__).resolve().parent.parent
    assert example_repository() == package / "examples" / "models"


def test_missing_bundled_repository_is_explained(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(settings_common, "example_repository", lambda: tmp_path / "absent")
    message = error_for({"HOME": str(tmp_path)})
    assert "TRITONACTOR_MODEL_REPOSITORY" in message
    assert "absent" in message


def test_journal_default_follows_xdg_state_home(env: dict[str, str], tmp_path: Path) -> None:
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    s = Settings.from_env(env)
    assert s.journal == tmp_path / "state" / "tritonactor" / "journal.jsonl"


def test_journal_default_ignores_relative_xdg_state_home(tmp_path: Path) -> None:
    journal = default_journal({"XDG_STATE_HOME": "relative/state", "HOME": str(tmp_path)})
    assert journal == tmp_path / ".local" / "state" / "tritonactor" / "journal.jsonl"


def test_every_variable_is_read(env: dict[str, str], repo: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    env |= {
        "TRITONACTOR_MODEL_REPOSITORY": f" {repo} , {other} ,",
        "TRITONACTOR_MODEL_CONTROL_MODE": "EXPLICIT",
        "TRITONACTOR_REPOSITORY_POLL_SECS": "0.5",
        "TRITONACTOR_LOAD_MODEL": "simple, densenet ,,",
        "TRITONACTOR_HTTP_HOST": "127.0.0.1",
        "TRITONACTOR_HTTP_PORT": "9000",
        "TRITONACTOR_GRPC_HOST": "[::1]",
        "TRITONACTOR_GRPC_PORT": "9001",
        "TRITONACTOR_METRICS_HOST": "localhost",
        "TRITONACTOR_METRICS_PORT": "9002",
        "TRITONACTOR_JOURNAL": str(tmp_path / "j.jsonl"),
        "TRITONACTOR_STRICT_MODEL_CONFIG": "Yes",
        "TRITONACTOR_ALLOW_GRPC": "off",
        "TRITONACTOR_ALLOW_METRICS": "0",
        "TRITONACTOR_LOG_VERBOSE": "2",
        "TRITONACTOR_LOG_FORMAT": "JSON",
        "TRITONACTOR_LOG_FILE": str(tmp_path / "server.log"),
    }
    s = Settings.from_env(env)
    assert s == Settings(
        model_repositories=(repo, other),
        model_control_mode=ControlMode.EXPLICIT,
        repository_poll_secs=0.5,
        load_models=("simple", "densenet"),
        http_host="127.0.0.1",
        http_port=9000,
        grpc_host="::1",
        grpc_port=9001,
        metrics_host="localhost",
        metrics_port=9002,
        journal=tmp_path / "j.jsonl",
        strict_model_config=True,
        grpc_enabled=False,
        metrics_enabled=False,
        log_verbose=2,
        log_format="json",
        log_file=str(tmp_path / "server.log"),
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("text", "text"),
        ("default", "text"),  # tritonserver's --log-format=default
        ("ISO8601", "ISO8601"),
        ("iso8601", "ISO8601"),
        ("json", "json"),
        ("Json", "json"),
    ],
)
def test_log_format(env: dict[str, str], text: str, expected: str) -> None:
    env["TRITONACTOR_LOG_FORMAT"] = text
    assert Settings.from_env(env).log_format == expected


def test_relative_log_file_becomes_absolute(
    env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    env["TRITONACTOR_LOG_FILE"] = "server.log"
    assert Settings.from_env(env).log_file == str(tmp_path / "server.log")


def test_load_model_star(env: dict[str, str]) -> None:
    env["TRITONACTOR_LOAD_MODEL"] = "*"
    assert Settings.from_env(env).load_models == ("*",)


def test_load_model_is_kept_outside_explicit_mode(env: dict[str, str]) -> None:
    env |= {"TRITONACTOR_LOAD_MODEL": "simple", "TRITONACTOR_MODEL_CONTROL_MODE": "poll"}
    assert Settings.from_env(env).load_models == ("simple",)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (text, expected)
        for expected, spellings in [
            (True, ["true", "TRUE", "1", "yes", "On"]),
            (False, ["false", "False", "0", "no", "OFF"]),
        ]
        for text in spellings
    ],
)
@pytest.mark.parametrize(
    ("variable", "field"),
    [
        ("TRITONACTOR_STRICT_MODEL_CONFIG", "strict_model_config"),
        ("TRITONACTOR_ALLOW_GRPC", "grpc_enabled"),
        ("TRITONACTOR_ALLOW_METRICS", "metrics_enabled"),
    ],
)
def test_booleans(
    env: dict[str, str], variable: str, field: str, text: str, expected: bool
) -> None:
    env[variable] = text
    assert getattr(Settings.from_env(env), field) is expected


def test_empty_values_count_as_unset(env: dict[str, str]) -> None:
    env |= {name: "" for name in VARIABLES.values() if name != "TRITONACTOR_MODEL_REPOSITORY"}
    env["TRITONACTOR_HTTP_PORT"] = "   "
    env["TRITONACTOR_NOT_A_SETTING"] = ""
    s = Settings.from_env(env)
    assert s.http_port == 8000
    assert s.model_control_mode is ControlMode.NONE


def test_port_zero_is_allowed(env: dict[str, str]) -> None:
    env |= {"TRITONACTOR_HTTP_PORT": "0", "TRITONACTOR_GRPC_PORT": "0"}
    s = Settings.from_env(env)
    assert (s.http_port, s.grpc_port) == (0, 0)


def test_ports_may_repeat_on_different_addresses(env: dict[str, str]) -> None:
    env |= {
        "TRITONACTOR_HTTP_HOST": "127.0.0.1",
        "TRITONACTOR_GRPC_HOST": "127.0.0.2",
        "TRITONACTOR_GRPC_PORT": "8000",
    }
    assert Settings.from_env(env).grpc_port == 8000


def test_a_disabled_endpoint_does_not_hold_its_port(env: dict[str, str]) -> None:
    env |= {"TRITONACTOR_GRPC_PORT": "8000", "TRITONACTOR_ALLOW_GRPC": "false"}
    assert Settings.from_env(env).grpc_port == 8000


@pytest.mark.parametrize(
    ("variable", "value", "allowed"),
    [
        ("TRITONACTOR_MODEL_CONTROL_MODE", "sometimes", "is not one of: none, poll, explicit"),
        ("TRITONACTOR_REPOSITORY_POLL_SECS", "soon", "seconds >= 0"),
        ("TRITONACTOR_REPOSITORY_POLL_SECS", "-1", "seconds >= 0"),
        ("TRITONACTOR_REPOSITORY_POLL_SECS", "nan", "seconds >= 0"),
        ("TRITONACTOR_REPOSITORY_POLL_SECS", "inf", "seconds >= 0"),
        ("TRITONACTOR_LOAD_MODEL", "*,simple", "'*' alone"),
        ("TRITONACTOR_HTTP_PORT", "http", "0..65535"),
        ("TRITONACTOR_HTTP_PORT", "65536", "0..65535"),
        ("TRITONACTOR_GRPC_PORT", "-1", "0..65535"),
        ("TRITONACTOR_METRICS_PORT", "80.5", "0..65535"),
        ("TRITONACTOR_HTTP_HOST", "[]", "host name or IP address"),
        ("TRITONACTOR_STRICT_MODEL_CONFIG", "maybe", "true/false"),
        ("TRITONACTOR_ALLOW_GRPC", "2", "true/false"),
        ("TRITONACTOR_ALLOW_METRICS", "yep", "true/false"),
        ("TRITONACTOR_LOG_VERBOSE", "loud", "integer"),
        ("TRITONACTOR_LOG_VERBOSE", "-1", "integer >= 0"),
        ("TRITONACTOR_LOG_FORMAT", "xml", "is not one of: text, ISO8601, json"),
        ("TRITONACTOR_LOG_FILE", "/", "is a directory"),
        ("TRITONACTOR_LOG_FILE", "/no/such/dir/x.log", "directory that does not exist"),
    ],
)
def test_bad_values_name_variable_value_and_rule(
    env: dict[str, str], variable: str, value: str, allowed: str
) -> None:
    env[variable] = value
    message = error_for(env)
    assert message.startswith(f"{variable}='{value}' ")
    assert allowed in message


def test_control_mode_message_is_exact(env: dict[str, str]) -> None:
    env["TRITONACTOR_MODEL_CONTROL_MODE"] = "sometimes"
    assert error_for(env) == (
        "TRITONACTOR_MODEL_CONTROL_MODE='sometimes' is not one of: none, poll, explicit"
    )


def test_error_carries_its_variable(env: dict[str, str]) -> None:
    env["TRITONACTOR_GRPC_PORT"] = "x"
    with pytest.raises(SettingsError) as caught:
        Settings.from_env(env)
    assert caught.value.variable == "TRITONACTOR_GRPC_PORT"
    assert isinstance(caught.value, ValueError)


def test_missing_repository_is_named(env: dict[str, str], repo: Path, tmp_path: Path) -> None:
    env["TRITONACTOR_MODEL_REPOSITORY"] = f"{repo},{tmp_path / 'nowhere'}"
    message = error_for(env)
    assert "TRITONACTOR_MODEL_REPOSITORY" in message
    assert str(tmp_path / "nowhere") in message
    assert "does not exist" in message


def test_repository_must_be_a_directory(env: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    env["TRITONACTOR_MODEL_REPOSITORY"] = str(tmp_path / "file")
    message = error_for(env)
    assert "TRITONACTOR_MODEL_REPOSITORY" in message
    assert "is not a directory" in message


def test_a_repository_listed_twice_counts_once(env: dict[str, str], repo: Path) -> None:
    # Triton serves a repository given twice once; so does every spelling of it here.
    env["TRITONACTOR_MODEL_REPOSITORY"] = f"{repo},{repo}/,{repo}/."
    assert Settings.from_env(env).model_repositories == (repo,)


def test_relative_repository_becomes_absolute(
    env: dict[str, str], repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(repo.parent)
    env["TRITONACTOR_MODEL_REPOSITORY"] = repo.name
    assert Settings.from_env(env).model_repositories == (repo,)


def test_journal_inside_a_repository_is_rejected(env: dict[str, str], repo: Path) -> None:
    env["TRITONACTOR_JOURNAL"] = str(repo / "state" / "journal.jsonl")
    message = error_for(env)
    assert message.startswith("TRITONACTOR_JOURNAL=")
    assert "inside model repository" in message


def test_journal_must_not_be_a_directory(env: dict[str, str], tmp_path: Path) -> None:
    env["TRITONACTOR_JOURNAL"] = str(tmp_path)
    message = error_for(env)
    assert message.startswith("TRITONACTOR_JOURNAL=")
    assert "is a directory" in message


def test_default_journal_is_outside_the_repository(
    env: dict[str, str], repo: Path, tmp_path: Path
) -> None:
    # Even when HOME would put it there, the clash is reported rather than written into the repo.
    env["HOME"] = str(repo)
    message = error_for(env)
    assert "TRITONACTOR_JOURNAL" in message
    env["HOME"] = str(tmp_path / "home")
    assert not Settings.from_env(env).journal.is_relative_to(repo)


@pytest.mark.parametrize(
    ("http_host", "other_host"),
    [("0.0.0.0", "0.0.0.0"), ("0.0.0.0", "127.0.0.1"), ("::", "127.0.0.1"), ("::1", "::1")],
)
def test_port_clash_is_reported(env: dict[str, str], http_host: str, other_host: str) -> None:
    env |= {
        "TRITONACTOR_HTTP_HOST": http_host,
        "TRITONACTOR_METRICS_HOST": other_host,
        "TRITONACTOR_METRICS_PORT": "8000",
    }
    message = error_for(env)
    assert message.startswith("TRITONACTOR_METRICS_PORT='8000' ")
    assert "TRITONACTOR_HTTP_PORT" in message


def test_ipv4_wildcard_does_not_clash_with_ipv6_address(env: dict[str, str]) -> None:
    env |= {"TRITONACTOR_GRPC_HOST": "::1", "TRITONACTOR_GRPC_PORT": "8000"}
    assert Settings.from_env(env).grpc_port == 8000


def test_unknown_variable_is_rejected(env: dict[str, str]) -> None:
    env["TRITONACTOR_MODEL_REPOSITORIES"] = "/models"
    env["TRITONACTOR_HTTP_PROT"] = "8000"
    message = error_for(env)
    assert message.startswith(
        "unknown setting TRITONACTOR_HTTP_PROT, TRITONACTOR_MODEL_REPOSITORIES; known: "
    )
    assert "TRITONACTOR_MODEL_REPOSITORY" in message.split("known: ")[1]


def test_other_variables_are_ignored(env: dict[str, str]) -> None:
    env |= {"PATH": "/bin", "TRITON_SERVER": "x", "tritonactor_http_port": "1"}
    assert Settings.from_env(env).http_port == 8000


def test_reads_os_environ_by_default(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("TRITONACTOR_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TRITONACTOR_HTTP_PORT", "8123")
    assert Settings.from_env().http_port == 8123


def test_round_trip(env: dict[str, str], repo: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    original = Settings(
        model_repositories=(repo, other),
        model_control_mode=ControlMode.POLL,
        repository_poll_secs=2.25,
        load_models=("a", "b"),
        http_host="::",
        http_port=0,
        grpc_host="127.0.0.1",
        grpc_port=18001,
        journal=tmp_path / "j.jsonl",
        strict_model_config=True,
        metrics_enabled=False,
        log_verbose=3,
        log_format="ISO8601",
        log_file=str(tmp_path / "server.log"),
    )
    exported = original.to_env()
    assert set(exported) == set(VARIABLES.values())
    assert exported["TRITONACTOR_MODEL_REPOSITORY"] == f"{repo},{other}"
    assert exported["TRITONACTOR_STRICT_MODEL_CONFIG"] == "true"
    assert exported["TRITONACTOR_ALLOW_METRICS"] == "false"
    assert Settings.from_env(exported) == original
    assert Settings.from_env(Settings.from_env(env).to_env()) == Settings.from_env(env)


def test_round_trip_of_defaults_needs_no_home(bundled: Path) -> None:
    original = Settings()
    assert Settings.from_env(original.to_env()) == original


def test_describe_lists_every_honoured_variable_in_order(env: dict[str, str]) -> None:
    described = Settings.from_env(env).describe()
    honoured = [
        VARIABLES[name] for name, option in OPTIONS.items() if option.support is Support.HONOURED
    ]
    assert [name for name, _ in described] == honoured
    assert ("TRITONACTOR_MODEL_CONTROL_MODE", "none") in described
    assert all(isinstance(value, str) for _, value in described)


def test_describe_adds_the_ignored_settings_given(env: dict[str, str]) -> None:
    env |= {"TRITONACTOR_HTTP_THREAD_COUNT": "4", "TRITONACTOR_CACHE_CONFIG": "local,size=1048576"}
    described = dict(Settings.from_env(env).describe())
    assert described["TRITONACTOR_HTTP_THREAD_COUNT"] == "4"
    assert described["TRITONACTOR_CACHE_CONFIG"] == '["local,size=1048576"]'
    assert "TRITONACTOR_REUSE_GRPC_PORT" not in described


def test_direct_construction_is_checked(repo: Path, tmp_path: Path) -> None:
    journal = tmp_path / "j.jsonl"
    with pytest.raises(SettingsError, match="TRITONACTOR_HTTP_PORT"):
        Settings(model_repositories=(repo,), journal=journal, http_port=70000)
    with pytest.raises(SettingsError, match="TRITONACTOR_REPOSITORY_POLL_SECS"):
        Settings(model_repositories=(repo,), journal=journal, repository_poll_secs=math.nan)
    with pytest.raises(SettingsError, match="TRITONACTOR_MODEL_CONTROL_MODE"):
        Settings(model_repositories=(repo,), journal=journal, model_control_mode="later")  # type: ignore[arg-type]
    s = Settings(model_repositories=(repo,), journal=journal, model_control_mode="poll")  # type: ignore[arg-type]
    assert s.model_control_mode is ControlMode.POLL


def test_settings_are_frozen(env: dict[str, str]) -> None:
    s = Settings.from_env(env)
    with pytest.raises(AttributeError):
        s.http_port = 1  # type: ignore[misc]


def test_import_has_no_global_instance() -> None:
    assert not any(isinstance(value, Settings) for value in vars(settings_module).values())
