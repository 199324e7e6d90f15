"""The ``tritonactor`` command: tritonserver's flag names, turned into settings for the ASGI
server (uvicorn by default, or hypercorn) that runs the app in front-end processes, one per core
less the engine's."""

from __future__ import annotations

import argparse
import json
import os
import socket
import ssl
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import NoReturn

from tritonactor.backends.registry import BackendRegistry
from tritonactor.control.inspect import inspect_repositories, render_text, report_to_json
from tritonactor.control.journal import JournalLocationError, check_location
from tritonactor.control.repository import RepositoryError
from tritonactor.engine.launch import SOCKET, WORKERS, EngineFailed, start_engine, usable_cpus
from tritonactor.frontends.listen import ListenFailed, check_free, listening_socket
from tritonactor.frontends.tls import check_tls, tls_files
from tritonactor.settings import OPTIONS, VARIABLES, Settings, SettingsError
from tritonactor.settings.docs import default_text
from tritonactor.settings.options import Option, Support, plain
from tritonactor.store.location import StoreLocation, is_store_url, parse_location
from tritonactor.store.mirror import open_mirrors
from tritonactor.store.remote import StoreError

APP = "tritonactor.app:app"
# The ASGI servers `tritonactor serve` runs, the default first (docs/benchmarks.md measures them).
ASGI_SERVERS = ("uvicorn", "hypercorn")

# --help lists tritonactor's own settings first, tritonserver's ignored options last.
_IGNORED_GROUP = "tritonserver options accepted and ignored"


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
        # The flags are many (tritonserver's, all accepted): --help lists them by group.
        usage="%(prog)s [options]",
        help="serve models over HTTP, gRPC and metrics",
        description=(
            "Serve models. Every flag overrides its TRITONACTOR_* environment variable; "
            "the rest are read from the environment."
        ),
        allow_abbrev=False,
    )
    _add_setting_flags(serve_parser)
    serve_parser.add_argument(
        "--workers",
        type=_count,
        default=default_workers(),
        metavar="N",
        help=(
            "front-end processes (HTTP and gRPC) in front of the engine process that runs "
            "the models (default: one per core this process may use, less the engine's "
            "core, here %(default)s; 0: everything in one process)"
        ),
    )
    serve_parser.add_argument(
        "--asgi-server",
        choices=ASGI_SERVERS,
        default=ASGI_SERVERS[0],
        help="the ASGI server that runs the front ends (default: %(default)s)",
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
        "paths",
        nargs="+",
        type=_repository_argument,
        metavar="PATH|URL",
        help="a model repository: a directory, or an object-store URL (s3://bucket/path, …), "
        "copied into a temporary folder first",
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
    for name, option in OPTIONS.items():
        value = getattr(args, name, None)
        if value is not None:
            # A repeated flag replaces the variable rather than extending it, as any flag does.
            env[VARIABLES[name]] = option.kind.join(value) if option.kind.many else value
        for switch in option.switches:
            # After the flag, so that --disable-auto-complete-config wins over
            # --strict-model-config=false, as in tritonserver.
            if getattr(args, _switch_dest(switch.flag), None) is not None:
                env[VARIABLES[name]] = switch.value
    return env


def bind_address(host: str, port: int) -> str:
    """``host:port`` as hypercorn's --bind wants it: an IPv6 address goes in brackets."""
    if ":" in host and not host.startswith("["):
        return f"[{host}]:{port}"
    return f"{host}:{port}"


# httptools, a request's body handed to the app whole (frontends/http/uvicorn_protocol.py).
UVICORN_PROTOCOL = "tritonactor.frontends.http.uvicorn_protocol:HttpToolsWholeBody"
# uvicorn's own loggers written through the server's log settings (asgi_server_handler).
UVICORN_LOG_CONFIG = Path(__file__).parent / "frontends" / "http" / "uvicorn_logging.json"


def uvicorn_command(settings: Settings, workers: int = 0) -> list[str]:
    """The command that serves the app with uvicorn (httptools, uvloop) in `workers` front-end
    processes (0 or 1: in uvicorn's own process)."""
    return [
        sys.executable,
        "-m",
        "uvicorn",
        APP,
        "--host",
        settings.http_host,
        "--port",
        str(settings.http_port),
        "--workers",
        str(max(workers, 1)),
        "--loop",
        "uvloop",
        "--http",
        UVICORN_PROTOCOL,
        "--no-access-log",
        "--log-config",
        str(UVICORN_LOG_CONFIG),
        "--lifespan",
        "on",
        # How long in-flight requests may take to finish after SIGTERM (--exit-timeout-secs).
        "--timeout-graceful-shutdown",
        str(settings.exit_timeout_secs),
        *uvicorn_tls_arguments(settings),
    ]


def hypercorn_command(
    settings: Settings, workers: int = 0, http_fd: int | None = None
) -> list[str]:
    """The command that serves the app in `workers` front-end processes (0 or 1: in hypercorn's
    own process); it reads its settings from the environment. `http_fd`: the HTTP socket, bound
    already (hypercorn's own bind would share it with SO_REUSEPORT)."""
    # `python -m hypercorn` with our own interpreter rather than a `hypercorn` script on PATH, which
    # might belong to another environment.
    return [
        sys.executable,
        "-m",
        "hypercorn",
        APP,
        "--bind",
        f"fd://{http_fd}"
        if http_fd is not None
        else bind_address(settings.http_host, settings.http_port),
        "--workers",
        # One worker runs in hypercorn's own process (`--workers 0`): a worker process that fails
        # to start (a bad setting) would otherwise leave hypercorn exiting 0.
        str(workers if workers > 1 else 0),
        # How long in-flight requests may take to finish after SIGTERM (--exit-timeout-secs).
        "--graceful-timeout",
        str(settings.exit_timeout_secs),
        *hypercorn_tls_arguments(settings),
    ]


def uvicorn_tls_arguments(settings: Settings) -> list[str]:
    """uvicorn's flags for the HTTP TLS settings (docs/tls.md); none for plain text."""
    files = tls_files(settings, "http")
    if files is None:
        return []
    arguments = ["--ssl-certfile", str(files.certificate), "--ssl-keyfile", str(files.key)]
    if files.client_roots is not None:
        arguments += ["--ssl-ca-certs", str(files.client_roots)]
        arguments += ["--ssl-cert-reqs", str(int(ssl.CERT_REQUIRED))]
    return arguments


def hypercorn_tls_arguments(settings: Settings) -> list[str]:
    """hypercorn's flags for the HTTP TLS settings (docs/tls.md); none for plain text."""
    files = tls_files(settings, "http")
    if files is None:
        return []
    arguments = ["--certfile", str(files.certificate), "--keyfile", str(files.key)]
    if files.client_roots is not None:
        arguments += ["--ca-certs", str(files.client_roots), "--verify-mode", "CERT_REQUIRED"]
    return arguments


def claim_addresses(settings: Settings, bind_http: bool = False) -> socket.socket | None:
    """Check that the server's addresses are free (raising ListenFailed, which names the one
    that is not), before anything starts. `bind_http`: bind the HTTP socket here and return
    it, inheritable, for an ASGI server that would otherwise share it (hypercorn sets
    SO_REUSEPORT with several workers); otherwise the ASGI server binds it (uvicorn never
    shares it) and this is only an early look, as for gRPC and metrics, whose sockets the
    server binds later, once (docs/operations.md, "Ports")."""
    if settings.grpc_enabled:
        check_free("gRPC", settings.grpc_host, settings.grpc_port)
    if settings.metrics_enabled:
        check_free("metrics", settings.metrics_host, settings.metrics_port)
    if not bind_http:
        check_free("HTTP", settings.http_host, settings.http_port)
        return None
    http = listening_socket("HTTP", settings.http_host, settings.http_port)
    http.set_inheritable(True)
    return http


def serve(args: argparse.Namespace) -> int:
    env = build_env(args)
    try:
        settings = Settings.from_env(env)
        check_tls(settings)
    except SettingsError as error:
        print(f"tritonactor serve: error: {_explain(error, args)}", file=sys.stderr)
        return 2
    try:
        # Before the engine loads models: an address another process holds stops the start,
        # and so does a journal that cannot be written.
        http_socket = claim_addresses(settings, bind_http=args.asgi_server == "hypercorn")
        check_location(settings.journal)
    except (ListenFailed, JournalLocationError) as error:
        print(f"tritonactor serve: error: {error}", file=sys.stderr)
        return 1
    # Hand the workers the checked settings, every one spelled out (absolute paths, the journal
    # default), so that they cannot read the environment differently from what was checked here.
    env.update(settings.to_env())
    env[WORKERS] = str(args.workers)
    if args.workers > 0:
        try:
            env[SOCKET] = start_engine(settings)
        except EngineFailed as error:
            print(f"tritonactor serve: error: {error}", file=sys.stderr)
            return 1
    if args.asgi_server == "uvicorn":
        command = uvicorn_command(settings, args.workers)
    else:
        http_fd = None if http_socket is None else http_socket.fileno()
        command = hypercorn_command(settings, args.workers, http_fd)
    if settings.log_verbose:
        print(f"tritonactor serve: exec {' '.join(command)}", file=sys.stderr)
    _exec(command, env)


def default_workers() -> int:
    """`serve`'s front ends: one per usable core less the one the engine process takes (it
    runs every model's scheduling, and a busy core of its own); on a single core, none: the
    one process does everything (docs/decisions.md, "How many front ends")."""
    cores = usable_cpus()
    return cores - 1 if cores > 1 else 0


def _repository_argument(text: str) -> Path | StoreLocation:
    if is_store_url(text):
        try:
            return parse_location(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(f"'{text}' {error}") from None
    return Path(text)


def inspect_repository(args: argparse.Namespace) -> int:
    registry = BackendRegistry()
    try:
        with tempfile.TemporaryDirectory(prefix="tritonactor-inspect-") as cache:
            paths, mirrors = open_mirrors(args.paths, Path(cache))
            try:
                report = inspect_repositories(paths, registry, strict=args.strict)
            finally:
                for mirror in mirrors:
                    mirror.close()
    except (RepositoryError, StoreError) as error:
        print(f"tritonactor repository inspect: error: {error}", file=sys.stderr)
        return 2
    finally:
        registry.finalize()
    # The copies are gone once inspected: the report names each by the URL it came from.
    copies = {str(mirror.root): str(mirror.location) for mirror in mirrors}
    if args.json:
        print(json.dumps(report_to_json(report, copies), indent=2))
    else:
        print(render_text(report, copies), end="")
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
    for name, option in OPTIONS.items():
        if VARIABLES[name] != error.variable:
            continue
        flags = [s.flag for s in option.switches if getattr(args, _switch_dest(s.flag), None)]
        if getattr(args, name, None) is not None:
            flags.insert(0, option.flags_for(name)[0])
        if flags:
            return f"{error} (set by {flags[0]})"
    return str(error)


def _add_setting_flags(parser: argparse.ArgumentParser) -> None:
    """A flag for every setting the declaration gives one, in its group, with its variable."""
    groups: dict[str, argparse._ArgumentGroup] = {}
    for name, option in OPTIONS.items():
        title = option.group if option.support is not Support.IGNORED else _IGNORED_GROUP
        if title not in groups:
            groups[title] = parser.add_argument_group(title)
        group = groups[title]
        help_text = _help(name, option)
        flags = option.flags_for(name)
        if option.kind.boolean:
            # tritonserver spells these `--flag=true|false`; a bare flag means true.
            group.add_argument(
                *flags, dest=name, nargs="?", const="true", metavar="true|false", help=help_text
            )
        else:
            group.add_argument(
                *flags,
                dest=name,
                action="append" if option.kind.many else "store",
                metavar=option.kind.metavar,
                help=help_text,
            )
        for switch in option.switches:
            group.add_argument(
                switch.flag,
                dest=_switch_dest(switch.flag),
                action="store_const",
                const=switch.value,
                help=f"{switch.help} [{VARIABLES[name]}={switch.value}]",
            )


def _help(name: str, option: Option) -> str:
    text = plain(option.meaning)
    if option.support is not Support.IGNORED:
        text += f" (default: {plain(default_text(name, option))})"
    if option.kind.many:
        text += "; repeatable"
    # argparse expands %-formats in help.
    return f"{text} [{VARIABLES[name]}]".replace("%", "%%")


def _switch_dest(flag: str) -> str:
    return "switch" + flag.replace("-", "_")


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count (0, 1, 2, ...)")
    return value


def _version() -> str:
    try:
        return metadata.version("tritonactor")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
