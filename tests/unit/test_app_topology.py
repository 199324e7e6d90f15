"""How the app learns its topology from the command line that runs it: how many front ends,
where hypercorn binds (which names the server, and so its engine), and whether the event loop is
the app's to choose."""

from __future__ import annotations

from pathlib import Path

import pytest

from tritonactor.app import _bound_like_hypercorn, frontend_workers
from tritonactor.frontends.hypercorn_command import hypercorn_config, leaves_worker_class

HYPERCORN = "/venv/bin/hypercorn"


@pytest.mark.parametrize(
    ("env", "argv", "cores", "workers"),
    [
        # One worker (hypercorn's default): one front end beside the engine on two cores or
        # more (as `tritonactor serve`), the whole server in one process on one core.
        ({}, [HYPERCORN, "tritonactor.app:app"], 2, 1),
        ({}, [HYPERCORN, "tritonactor.app:app"], 8, 1),
        ({}, [HYPERCORN, "tritonactor.app:app"], 1, 0),
        ({}, [HYPERCORN, "tritonactor.app:app", "--workers", "1"], 2, 1),
        ({}, [HYPERCORN, "tritonactor.app:app", "--workers", "1"], 1, 0),
        ({}, [HYPERCORN, "tritonactor.app:app", "--workers", "3"], 2, 3),
        ({}, [HYPERCORN, "tritonactor.app:app", "-w", "2"], 1, 2),
        ({}, [HYPERCORN, "tritonactor.app:app", "--workers=4"], 2, 4),
        # Every spelling hypercorn's parser accepts, the last of a repeated flag winning.
        ({}, [HYPERCORN, "tritonactor.app:app", "-w2"], 2, 2),
        ({}, [HYPERCORN, "tritonactor.app:app", "-w=3"], 2, 3),
        ({}, [HYPERCORN, "tritonactor.app:app", "-w", "2", "--workers", "5"], 2, 5),
        ({}, ["/venv/lib/hypercorn/__main__.py", "tritonactor.app:app", "-w4"], 2, 4),
        ({}, [HYPERCORN, "tritonactor.app:app", "-w", "2", "-w", "1"], 2, 1),
        ({}, [HYPERCORN, "tritonactor.app:app", "--workers", "0"], 2, 0),  # hypercorn's process
        ({}, [HYPERCORN, "tritonactor.app:app", "-w", "x"], 2, 0),  # hypercorn refuses to start
        # `tritonactor serve --workers N` says how many front ends the engine has; 0: none.
        ({"TA_FRONTEND_WORKERS": "2"}, ["/venv/bin/uvicorn", "tritonactor.app:app"], 2, 2),
        ({"TA_FRONTEND_WORKERS": "1"}, ["/venv/bin/uvicorn", "tritonactor.app:app"], 2, 1),
        ({"TA_FRONTEND_WORKERS": "0"}, [HYPERCORN, "tritonactor.app:app", "-w", "2"], 2, 0),
        ({"TA_FRONTEND_WORKERS": "0"}, [HYPERCORN, "tritonactor.app:app"], 2, 0),
        ({}, ["/venv/bin/uvicorn", "tritonactor.app:app", "--workers", "3"], 2, 0),
    ],
)
def test_front_ends_from_the_command_line(
    env: dict, argv: list[str], cores: int, workers: int
) -> None:
    # uvicorn is only ever run with several workers by `tritonactor serve`, which says so.
    assert frontend_workers(env, argv, cores) == workers


def test_hypercorns_port_names_the_server_whenever_the_port_is_not_set() -> None:
    argv = [HYPERCORN, "tritonactor.app:app", "--bind", "127.0.0.1:19650"]
    bound = _bound_like_hypercorn({"TRITONACTOR_HTTP_HOST": "0.0.0.0"}, argv)
    assert bound["TRITONACTOR_HTTP_HOST"] == "0.0.0.0"
    assert bound["TRITONACTOR_HTTP_PORT"] == "19650"
    given = {"TRITONACTOR_HTTP_PORT": "8100"}
    assert _bound_like_hypercorn(given, argv)["TRITONACTOR_HTTP_PORT"] == "8100"
    assert _bound_like_hypercorn({}, ["python", "-m", "something"]) == {}


@pytest.mark.parametrize(
    ("argv", "leaves"),
    [
        ([HYPERCORN, "tritonactor.app:app"], True),
        ([HYPERCORN, "tritonactor.app:app", "--workers", "2", "--bind", "0.0.0.0:8000"], True),
        (["/venv/lib/hypercorn/__main__.py", "tritonactor.app:app"], True),
        # A class named, in every spelling hypercorn's parser reads, the last one winning.
        ([HYPERCORN, "tritonactor.app:app", "-k", "asyncio"], False),
        ([HYPERCORN, "tritonactor.app:app", "-kasyncio"], False),
        ([HYPERCORN, "tritonactor.app:app", "--worker-class=asyncio"], False),
        ([HYPERCORN, "-k", "asyncio", "tritonactor.app:app"], False),
        ([HYPERCORN, "tritonactor.app:app", "-k", "uvloop"], False),
        ([HYPERCORN, "tritonactor.app:app", "-k", "uvloop", "-k", "asyncio"], False),
        ([HYPERCORN, "tritonactor.app:app", "-k", "trio"], False),
        # Not hypercorn's, or one hypercorn refuses to start.
        (["/venv/bin/uvicorn", "tritonactor.app:app"], False),
        ([HYPERCORN, "tritonactor.app:app", "-w", "x"], False),
        ([HYPERCORN], False),
    ],
)
def test_the_event_loop_is_the_apps_to_choose_only_where_hypercorns_command_leaves_it(
    argv: list[str], leaves: bool
) -> None:
    assert leaves_worker_class(argv) is leaves


@pytest.mark.parametrize(
    "flags",
    [["-c", "{}"], ["-c{}"], ["--config", "{}"], ["--config={}"], ["--conf", "{}"]],
)
def test_a_config_file_keeps_the_worker_class_hypercorns(tmp_path: Path, flags: list[str]) -> None:
    # A config file may name a class (this one names none): whatever it says is hypercorn's.
    config = tmp_path / "hypercorn.toml"
    config.write_text('bind = ["127.0.0.1:8000"]\n')
    argv = [HYPERCORN, "tritonactor.app:app", *(flag.format(config) for flag in flags)]
    assert hypercorn_config(argv) is not None  # hypercorn reads the file
    assert not leaves_worker_class(argv)
