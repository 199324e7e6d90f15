"""What a plain `hypercorn tritonactor.app:app ...` command line tells hypercorn, read by
hypercorn's own argument parser: its workers, where it binds, its TLS. The app is imported by
hypercorn (in each worker, whose `sys.argv` is its parent's) and is told none of it; reading
the command line as hypercorn does (every spelling it accepts: `-w2`, `-w=2`, `--workers=2`,
the last of a repeated flag, a `--config` file) keeps the two from disagreeing."""

from __future__ import annotations

import contextlib
import functools
import io
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def is_hypercorn(argv: Sequence[str]) -> bool:
    """Whether `argv` is hypercorn's command line (its script, or `python -m hypercorn`)."""
    if not argv:
        return False
    program = Path(argv[0])
    if program.name == "hypercorn":
        return True
    return program.name == "__main__.py" and program.parent.name == "hypercorn"


def leaves_worker_class(argv: Sequence[str]) -> bool:
    """Whether `argv` is a hypercorn command line that leaves the worker class (the event loop)
    to hypercorn's default, asyncio's: it names none (`-k`, `--worker-class`, in any spelling
    hypercorn's parser reads, found by that parser) and reads no config file, which may."""
    if not is_hypercorn(argv) or any(_names_config_file(token) for token in argv[1:]):
        return False
    # A class named on the command line wins over one named before it: hypercorn's parser reads
    # the command line after a class of our own, which stays unless the command line names one
    # (and is gone where hypercorn refuses the command line: it never starts the app then).
    marked = _parsed(("--worker-class", _UNNAMED, *argv[1:]))
    return marked is not None and marked.worker_class == _UNNAMED


_UNNAMED = "tritonactor-unnamed"


def _names_config_file(token: str) -> bool:
    """`-c FILE`, `-cFILE`, `--config FILE`, `--config=FILE` or an abbreviation of it."""
    if token.startswith("--"):
        name = token.split("=", 1)[0]
        return len(name) > 3 and "--config".startswith(name)
    return token.startswith("-c")


def hypercorn_config(argv: Sequence[str]) -> Any | None:
    """The `hypercorn.config.Config` hypercorn builds from `argv` (its command line), None
    when `argv` is not hypercorn's or hypercorn refuses it (it then never starts the app)."""
    if not is_hypercorn(argv):
        return None
    return _parsed(tuple(argv[1:]))


@functools.cache
def _parsed(arguments: tuple[str, ...]) -> Any | None:
    if not arguments:  # hypercorn would read its own process's arguments instead
        return None
    try:
        import hypercorn.__main__ as cli
    except ImportError:
        return None
    built: list[Any] = []

    def keep(config: Any) -> int:  # in place of hypercorn's `run`: nothing is started
        built.append(config)
        return 0

    run = cli.run
    cli.run = keep  # type: ignore[assignment]
    try:
        with (
            contextlib.redirect_stderr(io.StringIO()),
            contextlib.redirect_stdout(io.StringIO()),
            warnings.catch_warnings(),  # e.g. --cert-reqs: hypercorn's own start warns already
        ):
            warnings.simplefilter("ignore")
            cli.main(list(arguments))
    except (SystemExit, Exception):  # hypercorn would not start on these either
        return None
    finally:
        cli.run = run  # type: ignore[assignment]
    return built[0] if built else None
