"""The ``tritonactor`` command: tritonserver's flag names, turned into settings for hypercorn."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import NoReturn

from tritonactor.backends.registry import BackendRegistry
from tritonactor.control.inspect import inspect_repositories, render_text, report_to_json
from tritonactor.control.repository import RepositoryError
from tritonactor.settings import VARIABLES, ControlMode, Settings, SettingsError

APP = "tritonactor.app:app"


@dataclass(frozen=True)
class _Flag:
    """A ``serve`` flag and the setting it overrides."""

    names: tuple[str, ...]
    setting: str  # a Settings field; its variable is VARIABLES[setting]
    help: str
    metavar: str = "VALUE"
    repeatable: bool = False
    boolean: bool = False


# Values stay strings here: Settings.from_env is the one place that parses and checks them, so a
# bad flag and a bad variable get the same message.
_FLAGS: tuple[_Flag, ...] = (
    _Flag(
        ("--model-repository", "--model-store"),
        "model_repositories",
        "a model repository directory; repeat for several (default: the bundled examples)",
        metavar="PATH",
        repeatable=True,
    ),
    _Flag(("--model-control-mode",), "model_control_mode", "none, poll or explicit", "MODE"),
    _Flag(
        ("--repository-poll-secs",),
        "repository_poll_secs",
        "seconds between repository scans in poll mode",
        "SECONDS",
    ),
    _Flag(
        ("--load-model",),
        "load_models",
        "a model to load at startup in explicit mode, or '*' for all; repeatable",
        "NAME",
        repeatable=True,
    ),
    _Flag(("--http-address",), "http_host", "address the HTTP endpoint binds to", "HOST"),
    _Flag(("--http-port",), "http_port", "HTTP port (0: any free port)", "PORT"),
    _Flag(("--grpc-address",), "grpc_host", "address the gRPC endpoint binds to", "HOST"),
    _Flag(("--grpc-port",), "grpc_port", "gRPC port (0: any free port)", "PORT"),
    _Flag(("--metrics-address",), "metrics_host", "address the metrics endpoint binds to", "HOST"),
    _Flag(("--metrics-port",), "metrics_port", "metrics port (0: any free port)", "PORT"),
    _Flag(("--journal",), "journal", "control-plane journal file", "PATH"),
    _Flag(
        ("--strict-model-config",),
        "strict_model_config",
        "require a complete config.pbtxt instead of completing it from the model",
        boolean=True,
    ),
    _Flag(("--allow-grpc",), "grpc_enabled", "serve the gRPC endpoint", boolean=True),
    _Flag(("--allow-metrics",), "metrics_enabled", "serve the metrics endpoint", boolean=True),
    _Flag(("--log-verbose",), "log_verbose", "verbose logging level (0: off)", "LEVEL"),
    _Flag(
        ("--log-format",),
        "log_format",
        "text (alias default), ISO8601, or json: one JSON object a line",
        "FORMAT",
    ),
    _Flag(("--log-file",), "log_file", "write the log to this file instead of stderr", "PATH"),
    _Flag(
        ("--lazy-load",),
        "lazy_load",
        "load each model when its first request arrives",
        boolean=True,
    ),
    _Flag(
        ("--memory-budget",),
        "memory_budget",
        "bytes loaded models may take, e.g. 8GiB (0: no limit)",
        "SIZE",
    ),
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:
        # argparse exits for --help, --version and usage errors; return its code instead so that
        # callers (and tests) always get an int back.
        return stop.code if isinstance(stop.code, int) else 0 if stop.code is None else 2
    handler: Callable[[argparse.Namespace], int] = args.handler
    return handler(args)


def build_parser() -> argparse.ArgumentParser:
    # No abbreviations: "--grpc" or "--model" would silently pick one of several flags.
    parser = argparse.ArgumentParser(
        prog="tritonactor",
        description="A Triton-compatible inference server.",
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    # A subcommand per job, so that `tritonactor repository inspect PATH...` can join `serve`.
    commands = parser.add_subparsers(dest="command", title="commands", required=True)

    serve_parser = commands.add_parser(
        "serve",
        help="serve models over HTTP, gRPC and metrics",
        description=(
            "Serve models. Every flag overrides its TRITONACTOR_* environment variable; "
            "the rest are read from the environment."
        ),
        allow_abbrev=False,
    )
    for flag in _FLAGS:
        help_text = f"{flag.help} [{VARIABLES[flag.setting]}]"
        if flag.boolean:
            # tritonserver spells these `--flag=true|false`; a bare flag means true.
            serve_parser.add_argument(
                *flag.names,
                dest=flag.setting,
                nargs="?",
                const="true",
                metavar="true|false",
                help=help_text,
            )
        else:
            serve_parser.add_argument(
                *flag.names,
                dest=flag.setting,
                action="append" if flag.repeatable else "store",
                metavar=flag.metavar,
                help=help_text,
            )
    serve_parser.add_argument(
        "--workers",
        type=_positive_int,
        default=1,
        metavar="N",
        help="hypercorn worker processes (default: 1)",
    )
    serve_parser.set_defaults(handler=serve)

    repository_parser = commands.add_parser(
        "repository", help="look at model repositories without serving them", allow_abbrev=False
    )
    repository_commands = repository_parser.add_subparsers(
        dest="repository_command", title="commands", required=True
    )
    inspect_parser = repository_commands.add_parser(
        "inspect",
        help="list models, versions, sizes and load errors",
        description=(
            "List every model of the repositories: its versions (and which the version policy "
            "selects), backend, instance count, bytes on disk, and the errors loading it would "
            "hit. Exits 0 when every model would load, 1 when some would not."
        ),
        allow_abbrev=False,
    )
    inspect_parser.add_argument(
        "paths", nargs="+", type=Path, metavar="PATH", help="a model repository directory"
    )
    inspect_parser.add_argument("--json", action="store_true", help="print the report as JSON")
    inspect_parser.add_argument(
        "--strict",
        action="store_true",
        help="as --strict-model-config: no auto-complete, every model needs a config.pbtxt",
    )
    inspect_parser.set_defaults(handler=inspect_repository)
    return parser


def build_env(args: argparse.Namespace, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default ``os.environ``) with every flag given on the command line written over."""
    env = dict(os.environ if base is None else base)
    for flag in _FLAGS:
        value = getattr(args, flag.setting, None)
        if value is None:
            continue
        # A repeated flag replaces the variable rather than extending it, as any flag does.
        env[VARIABLES[flag.setting]] = ",".join(value) if flag.repeatable else value
    return env


def bind_address(host: str, port: int) -> str:
    """``host:port`` as hypercorn's --bind wants it: an IPv6 address goes in brackets."""
    if ":" in host and not host.startswith("["):
        return f"[{host}]:{port}"
    return f"{host}:{port}"


def hypercorn_command(settings: Settings, workers: int = 1) -> list[str]:
    """The command that serves the app; it reads its settings from the environment."""
    # `python -m hypercorn` with our own interpreter rather than a `hypercorn` script on PATH, which
    # might belong to another environment.
    return [
        sys.executable,
        "-m",
        "hypercorn",
        APP,
        "--bind",
        bind_address(settings.http_host, settings.http_port),
        "--workers",
        # One worker runs in hypercorn's own process (`--workers 0`): a worker process that fails
        # to start (a bad setting) would otherwise leave hypercorn exiting 0.
        str(workers if workers > 1 else 0),
    ]


def serve(args: argparse.Namespace) -> int:
    env = build_env(args)
    try:
        settings = Settings.from_env(env)
        if settings.model_control_mode is ControlMode.EXPLICIT and args.workers > 1:
            # Each worker process has its own models: a load through one would not reach the
            # others, and requests would see the model come and go.
            raise SettingsError(
                "explicit model control needs one worker (--workers 1): a load or unload "
                "request reaches only the worker that receives it",
                variable=VARIABLES["model_control_mode"],
            )
    except SettingsError as error:
        print(f"tritonactor serve: error: {_explain(error, args)}", file=sys.stderr)
        return 2
    # Hand the workers the checked settings, every one spelled out (absolute paths, the journal
    # default), so that they cannot read the environment differently from what was checked here.
    env.update(settings.to_env())
    command = hypercorn_command(settings, args.workers)
    if settings.log_verbose:
        print(f"tritonactor serve: exec {' '.join(command)}", file=sys.stderr)
    _exec(command, env)


def inspect_repository(args: argparse.Namespace) -> int:
    registry = BackendRegistry()
    try:
        report = inspect_repositories(args.paths, registry, strict=args.strict)
    except RepositoryError as error:
        print(f"tritonactor repository inspect: error: {error}", file=sys.stderr)
        return 2
    finally:
        registry.finalize()
    if args.json:
        print(json.dumps(report_to_json(report), indent=2))
    else:
        print(render_text(report), end="")
    return 0 if report.loads else 1


def _exec(command: list[str], env: dict[str, str]) -> NoReturn:
    # Replacing this process, rather than calling hypercorn's Python API, keeps one code path for
    # `tritonactor serve` and `hypercorn tritonactor.app:app`: hypercorn's own CLI runs the worker
    # pool (--workers), the app reads the same variables either way, and signals from a process
    # manager or container runtime reach hypercorn directly, with no parent left to forward them.
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(command[0], command, env)


def _explain(error: SettingsError, args: argparse.Namespace) -> str:
    """The error's message, plus the flag that set the value when it came from one."""
    for flag in _FLAGS:
        if (
            VARIABLES[flag.setting] == error.variable
            and getattr(args, flag.setting, None) is not None
        ):
            return f"{error} (set by {flag.names[0]})"
    return str(error)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return value


def _version() -> str:
    try:
        return metadata.version("tritonactor")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
