from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tritonactor import cli
from tritonactor.settings import OPTIONS, VARIABLES, Settings


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "models"
    path.mkdir()
    return path


@pytest.fixture
def clean_environ(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """os.environ without any TRITONACTOR_ variable the developer may have set."""
    for name in list(os.environ):
        if name.startswith("TRITONACTOR_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)


@pytest.fixture
def execs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[str], dict[str, str]]]:
    """Records what serve would exec instead of replacing the test process."""
    calls: list[tuple[list[str], dict[str, str]]] = []

    def record(command: list[str], env: dict[str, str]) -> None:
        calls.append((command, env))

    monkeypatch.setattr(cli, "_exec", record)
    # Nor bind the server's ports (tests/unit/test_tls_cli.py checks that it does).
    monkeypatch.setattr(cli, "claim_addresses", lambda settings, bind_http=False: None)
    # Nor start an engine process (the topologies are tested end to end).
    monkeypatch.setattr(cli, "start_engine", lambda settings: "/engine-not-started.sock")
    return calls


def parse(*argv: str) -> argparse.Namespace:
    return cli.build_parser().parse_args(["serve", *argv])


def test_no_flags_leave_the_environment_alone() -> None:
    base = {"PATH": "/bin", "TRITONACTOR_HTTP_PORT": "9000"}
    assert cli.build_env(parse(), base) == base


def test_every_flag_sets_its_variable(tmp_path: Path) -> None:
    args = parse(
        "--model-repository=/a",
        "--model-control-mode",
        "poll",
        "--repository-poll-secs=3",
        "--load-model=x",
        "--http-address=127.0.0.1",
        "--http-port=1",
        "--grpc-address=::1",
        "--grpc-port=2",
        "--metrics-address=localhost",
        "--metrics-port=3",
        "--journal=/j.jsonl",
        "--strict-model-config=false",
        "--allow-grpc=true",
        "--allow-metrics=no",
        "--log-verbose=1",
        "--log-format=json",
        "--log-file=/tmp/tritonactor.log",
        "--lazy-load=true",
        "--memory-budget=2GiB",
    )
    assert cli.build_env(args, {}) == {
        "TRITONACTOR_MODEL_REPOSITORY": "/a",
        "TRITONACTOR_MODEL_CONTROL_MODE": "poll",
        "TRITONACTOR_REPOSITORY_POLL_SECS": "3",
        "TRITONACTOR_LOAD_MODEL": "x",
        "TRITONACTOR_HTTP_HOST": "127.0.0.1",
        "TRITONACTOR_HTTP_PORT": "1",
        "TRITONACTOR_GRPC_HOST": "::1",
        "TRITONACTOR_GRPC_PORT": "2",
        "TRITONACTOR_METRICS_HOST": "localhost",
        "TRITONACTOR_METRICS_PORT": "3",
        "TRITONACTOR_JOURNAL": "/j.jsonl",
        "TRITONACTOR_STRICT_MODEL_CONFIG": "false",
        "TRITONACTOR_ALLOW_GRPC": "true",
        "TRITONACTOR_ALLOW_METRICS": "no",
        "TRITONACTOR_LOG_VERBOSE": "1",
        "TRITONACTOR_LOG_FORMAT": "json",
        "TRITONACTOR_LOG_FILE": "/tmp/tritonactor.log",
        "TRITONACTOR_LAZY_LOAD": "true",
        "TRITONACTOR_MEMORY_BUDGET": "2GiB",
    }


def test_every_setting_has_a_flag() -> None:
    argv = [f"{option.flags_for(name)[0]}=x" for name, option in OPTIONS.items()]
    env = cli.build_env(parse(*argv), {})
    assert set(env) == set(VARIABLES.values())


def test_repeated_flags_join_with_commas() -> None:
    args = parse(
        "--model-repository=/a",
        "--model-store",
        "/b",
        "--model-repository=/c",
        "--load-model=x",
        "--load-model=y",
    )
    env = cli.build_env(args, {"TRITONACTOR_MODEL_REPOSITORY": "/from-env"})
    assert env["TRITONACTOR_MODEL_REPOSITORY"] == "/a,/b,/c"
    assert env["TRITONACTOR_LOAD_MODEL"] == "x,y"


def test_flags_override_the_environment() -> None:
    env = cli.build_env(parse("--http-port=1"), {"TRITONACTOR_HTTP_PORT": "2", "OTHER": "kept"})
    assert env == {"TRITONACTOR_HTTP_PORT": "1", "OTHER": "kept"}


@pytest.mark.parametrize("flag", ["--strict-model-config", "--allow-grpc", "--allow-metrics"])
def test_bare_boolean_flag_means_true(flag: str) -> None:
    env = cli.build_env(parse(flag), {})
    assert list(env.values()) == ["true"]


def test_build_env_defaults_to_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITONACTOR_TEST_MARKER", "here")
    assert cli.build_env(parse())["TRITONACTOR_TEST_MARKER"] == "here"


def test_abbreviated_flags_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["serve", "--grpc", "1"]) == 2
    assert "--grpc" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("host", "bind"),
    [
        ("0.0.0.0", "0.0.0.0:8000"),
        ("localhost", "localhost:8000"),
        ("::", "[::]:8000"),
        ("::1", "[::1]:8000"),
        ("fe80::1%eth0", "[fe80::1%eth0]:8000"),
    ],
)
def test_bind_address(host: str, bind: str) -> None:
    assert cli.bind_address(host, 8000) == bind


def test_hypercorn_command(repo: Path, tmp_path: Path) -> None:
    settings = Settings(
        model_repositories=(repo,), journal=tmp_path / "j", http_host="::", http_port=9000
    )
    assert cli.hypercorn_command(settings, 4) == [
        sys.executable,
        "-m",
        "hypercorn",
        "tritonactor.app:app",
        "--bind",
        "[::]:9000",
        "--workers",
        "4",
        "--graceful-timeout",
        "30",
    ]


def test_uvicorn_command(repo: Path, tmp_path: Path) -> None:
    settings = Settings(
        model_repositories=(repo,), journal=tmp_path / "j", http_host="::", http_port=9000
    )
    assert cli.uvicorn_command(settings, 4) == [
        sys.executable,
        "-m",
        "uvicorn",
        "tritonactor.app:app",
        "--host",
        "::",
        "--port",
        "9000",
        "--workers",
        "4",
        "--loop",
        "uvloop",
        "--http",
        cli.UVICORN_PROTOCOL,
        "--no-access-log",
        "--log-config",
        str(cli.UVICORN_LOG_CONFIG),
        "--lifespan",
        "on",
        "--timeout-graceful-shutdown",
        "30",
    ]


@pytest.mark.usefixtures("clean_environ")
@pytest.mark.parametrize(
    ("cores", "flags", "uvicorn_workers", "front_ends"),
    [
        (1, [], "1", "0"),  # one core: one process does everything
        (2, [], "1", "1"),  # one front end, the engine on the other core
        (4, [], "3", "3"),
        (4, ["--workers=0"], "1", "0"),
        (1, ["--workers=2"], "2", "2"),
    ],
)
def test_serve_execs_uvicorn_with_a_front_end_per_core_less_the_engines(
    cores: int,
    flags: list[str],
    uvicorn_workers: str,
    front_ends: str,
    repo: Path,
    execs: list[tuple[list[str], dict[str, str]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cli, "usable_cpus", lambda: cores)
    engines: list[Settings] = []
    monkeypatch.setattr(cli, "start_engine", lambda settings: engines.append(settings) or "/e")
    monkeypatch.chdir(repo.parent)
    cli.main(["serve", "--model-repository", repo.name, "--http-port=9100", *flags])
    [(command, env)] = execs
    assert command[2] == "uvicorn"
    assert command[command.index("--workers") + 1] == uvicorn_workers
    assert env["TA_FRONTEND_WORKERS"] == front_ends
    # An engine process is started (before the front ends) exactly when there are front ends.
    assert len(engines) == (front_ends != "0")
    assert env.get("TA_ENGINE_SOCKET") == ("/e" if engines else None)


@pytest.mark.usefixtures("clean_environ")
def test_serve_execs_hypercorn_with_checked_settings(
    repo: Path, execs: list[tuple[list[str], dict[str, str]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRITONACTOR_LOG_VERBOSE", "0")
    monkeypatch.setenv("UNRELATED", "kept")
    monkeypatch.chdir(repo.parent)
    # One front end, in hypercorn's own process (the fixture does not start the engine: the
    # multi-process path is tested end to end).
    cli.main(
        [
            "serve",
            "--model-repository",
            repo.name,
            "--http-port=9100",
            "--workers=1",
            "--asgi-server=hypercorn",
        ]
    )
    [(command, env)] = execs
    assert command[command.index("--bind") + 1] == "0.0.0.0:9100"
    assert command[command.index("--workers") + 1] == "0"  # hypercorn's own process
    assert env["TA_FRONTEND_WORKERS"] == "1"
    assert env["UNRELATED"] == "kept"
    # The child gets every setting spelled out: absolute paths, the default journal.
    assert env["TRITONACTOR_MODEL_REPOSITORY"] == str(repo)
    assert env["TRITONACTOR_HTTP_PORT"] == "9100"
    assert env["TRITONACTOR_JOURNAL"].endswith("journal.jsonl")
    assert Settings.from_env(env).model_repositories == (repo,)


@pytest.mark.usefixtures("clean_environ")
def test_bad_flag_value_exits_2_naming_variable_and_flag(
    repo: Path, execs: list[object], capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(["serve", f"--model-repository={repo}", "--model-control-mode=bogus"])
    assert code == 2
    assert execs == []
    err = capsys.readouterr().err
    assert "TRITONACTOR_MODEL_CONTROL_MODE='bogus' is not one of: none, poll, explicit" in err
    assert "--model-control-mode" in err


@pytest.mark.usefixtures("clean_environ")
def test_bad_environment_value_exits_2_naming_variable(
    repo: Path,
    execs: list[object],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TRITONACTOR_GRPC_PORT", "99999")
    assert cli.main(["serve", f"--model-repository={repo}"]) == 2
    err = capsys.readouterr().err
    assert "TRITONACTOR_GRPC_PORT='99999'" in err
    assert "set by" not in err  # it came from the environment, not a flag


@pytest.mark.usefixtures("clean_environ")
def test_unknown_variable_exits_2(
    repo: Path,
    execs: list[object],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TRITONACTOR_HTTP_PROT", "1")
    assert cli.main(["serve", f"--model-repository={repo}"]) == 2
    assert "unknown setting TRITONACTOR_HTTP_PROT" in capsys.readouterr().err


@pytest.mark.usefixtures("clean_environ")
def test_missing_repository_exits_2(
    tmp_path: Path, execs: list[object], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["serve", "--model-repository", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert "TRITONACTOR_MODEL_REPOSITORY" in err
    assert str(tmp_path / "nope") in err


@pytest.mark.parametrize("workers", ["-1", "many", "1.5"])
def test_workers_must_be_a_count(workers: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["serve", f"--workers={workers}"]) == 2
    assert "--workers" in capsys.readouterr().err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("tritonactor ")


def test_a_command_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2
    assert "serve" in capsys.readouterr().err


def test_module_run_reports_bad_mode(tmp_path: Path, repo: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRITONACTOR_")}
    env["HOME"] = str(tmp_path / "home")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tritonactor.cli",
            "serve",
            f"--model-repository={repo}",
            "--model-control-mode=bogus",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "TRITONACTOR_MODEL_CONTROL_MODE" in result.stderr
    assert "--model-control-mode" in result.stderr


def test_the_default_front_ends_follow_the_cores_this_process_may_use(tmp_path: Path) -> None:
    affinity = len(os.sched_getaffinity(0))
    cpu_max = tmp_path / "cpu.max"
    assert cli.usable_cpus(tmp_path / "absent") == affinity
    cpu_max.write_text("max 100000\n")
    assert cli.usable_cpus(cpu_max) == affinity
    cpu_max.write_text("150000 100000\n")  # a pod's `limits: cpu: 1.5`
    assert cli.usable_cpus(cpu_max) == min(affinity, 2)
    cpu_max.write_text("10000 100000\n")  # 0.1 CPU: still one front end
    assert cli.usable_cpus(cpu_max) == 1
    cpu_max.write_text("garbage")
    assert cli.usable_cpus(cpu_max) == affinity
