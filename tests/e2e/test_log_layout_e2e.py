"""The server log as Triton writes it, read back from `tritonactor serve --log-file`: every
record in Triton's layout (a message is a JSON string; a multi-line record is a heading and a
table), Triton's start lines and model table, an error line for an execute that raised, and the
ASGI server's own warnings in the same file and format."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.processes import children, cmdline
from tests.server_process import free_port, loopback_env, start_serve, wait_for

DEFAULT = re.compile(r"(?P<level>[IWE])\d{4} \d{2}:\d{2}:\d{2}\.\d{6} \d+ [\w.]+:\d+\] (?P<m>.*)")
ISO8601 = re.compile(
    r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z (?P<level>[IWE]) \d+ [\w.]+:\d+\] (?P<m>.*)"
)
BORDER = re.compile(r"\+[-+]+\+")
ROW = re.compile(r"\| .*? \|")

MODEL_CONFIG = """
backend: "python"
max_batch_size: 0
input [{ name: "IN", data_type: TYPE_FP32, dims: [ 1 ] }]
output [{ name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] }]
"""
LOGGER = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        pb_utils.Logger.log_info('said "hi"\\nI0101 00:00:00.000000 1 forged.cc:1] "forged"')
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUT", r.inputs()[0].as_numpy())])
            for r in requests
        ]
"""
RAISER = """
class TritonPythonModel:
    def execute(self, requests):
        raise RuntimeError("raised on purpose")
"""
BROKEN = """
class TritonPythonModel:
    def initialize(self, args):
        raise ValueError("broken on purpose")
"""


def records(text: str, layout: re.Pattern[str]) -> list[list[str]]:
    """The log's records: a line in the layout starts one, any other line continues it."""
    found: list[list[str]] = []
    for line in text.splitlines():
        if layout.fullmatch(line):
            found.append([line])
        else:
            assert found, f"the log starts with a line out of layout: {line!r}"
            found[-1].append(line)
    return found


def check_record(record: list[str], layout: re.Pattern[str], escaped: bool) -> str:
    """The record's message, having checked it as Triton's format says: a heading that is a
    JSON string (or empty, before a table) and, on the lines after it, only a table."""
    match = layout.fullmatch(record[0])
    assert match is not None
    heading = match["m"]
    if escaped and heading:
        assert isinstance(json.loads(heading), str), record
    table = record[1:]
    if table:
        assert BORDER.fullmatch(table[0]) and BORDER.fullmatch(table[2]), record
        assert BORDER.fullmatch(table[-1]) and all(ROW.fullmatch(row) for row in table[3:-1])
        widths = {len(row) for row in table}
        assert len(widths) == 1, record  # every line of a table as wide as its borders
    return heading


def serve_and_log(tmp_path: Path, *flags: str, env: dict[str, str] | None = None) -> str:
    repo = tmp_path / "models"
    for name, code in (("logger", LOGGER), ("raiser", RAISER), ("broken", BROKEN)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(MODEL_CONFIG)
        (repo / name / "1" / "model.py").write_text(code)
    log_file = tmp_path / "server.log"
    server = start_serve(
        tmp_path,
        {
            "TRITONACTOR_MODEL_REPOSITORY": str(repo),
            "TRITONACTOR_EXIT_ON_ERROR": "false",
            "TRITONACTOR_STRICT_READINESS": "false",
            **(env or {}),
        },
        "--workers",
        "1",
        f"--log-file={log_file}",
        *flags,
    )
    try:
        # The startup loads have settled once the model table is written.
        wait_for(lambda: "| Model " in log_file.read_text(), 60, server.log)
        body = {"inputs": [{"name": "IN", "shape": [1], "datatype": "FP32", "data": [1.0]}]}
        assert httpx.post(f"{server.base}/v2/models/logger/infer", json=body).status_code == 200
        failed = httpx.post(f"{server.base}/v2/models/raiser/infer", json=body)
        assert failed.status_code == 500, failed.text
        # Not HTTP at all: the ASGI server's own warning.
        with socket.create_connection(("127.0.0.1", server.http_port)) as sock:
            sock.sendall(b"GARBAGE / HTTP/1.1\r\n\r\n")
            assert sock.recv(64).startswith(b"HTTP/1.1 400")
    finally:
        assert server.stop() == 0
    # With a log file nothing of the log is written to the server's own output.
    assert "Invalid HTTP request" not in server.log() and "Uvicorn running" not in server.log()
    return log_file.read_text()


@pytest.mark.parametrize("layout", ["default", "ISO8601"])
def test_the_log_is_in_tritons_layout(tmp_path: Path, layout: str) -> None:
    text = serve_and_log(tmp_path, f"--log-format={layout}")
    pattern = DEFAULT if layout == "default" else ISO8601
    messages = []
    tables = []
    for record in records(text, pattern):
        heading = check_record(record, pattern, escaped=True)
        messages.append(json.loads(heading) if heading else "")
        if len(record) > 1:
            tables.append(record[1:])
    # Triton's start lines, which scripts wait for.
    for endpoint in ("HTTPService", "GRPCInferenceService", "Metrics Service"):
        assert any(m.startswith(f"Started {endpoint} at 127.0.0.1:") for m in messages), text
    # And the line scripts wait for at SIGTERM.
    assert any(m.startswith("Waiting for in-flight requests to complete.") for m in messages)
    # The model table after the startup loads: each version and its state.
    (models,) = [t for t in tables if t[1].startswith("| Model ")]
    rows = {tuple(cell.strip() for cell in row.strip("|").split("|")) for row in models[3:-1]}
    assert ("logger", "1", "READY") in rows and ("raiser", "1", "READY") in rows
    (broken,) = [row for row in rows if row[0] == "broken"]
    assert broken[1] == "1" and broken[2].startswith("UNAVAILABLE: ValueError: broken on purpose")
    # The options table: the settings in force.
    assert any(t[1].startswith("| Option ") for t in tables)
    # The model's own line, its quotes and line break inside the JSON string: no forged record.
    assert any(
        m.endswith('said "hi"\nI0101 00:00:00.000000 1 forged.cc:1] "forged"') for m in messages
    )
    assert not any(line.startswith("I0101") for line in text.splitlines())
    # An execute that raised: Triton's error line.
    errors = [m["m"] for m in map(pattern.fullmatch, text.splitlines()) if m and m["level"] == "E"]
    assert any(
        "Failed to process the request(s) for model 'raiser" in e and "raised on purpose" in e
        for e in errors
    ), text
    # The ASGI server's warning, in the log file and its format.
    warnings = [
        json.loads(match["m"])
        for match in map(pattern.fullmatch, text.splitlines())
        if match is not None and match["level"] == "W"
    ]
    assert "Invalid HTTP request received." in warnings, text


def test_messages_unescaped_as_triton_allows(tmp_path: Path) -> None:
    text = serve_and_log(tmp_path, env={"TRITON_SERVER_ESCAPE_LOG_MESSAGES": "0"})
    lines = [DEFAULT.fullmatch(r[0]) for r in records(text, DEFAULT)]
    messages = [line["m"] for line in lines if line is not None]
    assert any(m.startswith("Started HTTPService at 127.0.0.1:") for m in messages), text
    # Unquoted, but the line break still escaped: the forged record is not a line of its own.
    assert any(
        m.endswith('said "hi"\\nI0101 00:00:00.000000 1 forged.cc:1] "forged"') for m in messages
    )
    assert not any(line.startswith("I0101") for line in text.splitlines())


def test_uvicorns_lines_become_the_servers(tmp_path: Path) -> None:
    """Under `tritonactor serve` (uvicorn, two workers, HTTP port 0): uvicorn's address line is
    Triton's `Started HTTPService at` with the port it bound, and a worker that dies is a
    warning in the server's log (uvicorn starts another)."""
    repo = tmp_path / "models"
    repo.mkdir()
    log_file = tmp_path / "server.log"
    env = loopback_env(tmp_path, 0, free_port(), free_port())
    env["TRITONACTOR_MODEL_REPOSITORY"] = str(repo)
    command = [sys.executable, "-m", "tritonactor.cli", "serve", "--workers", "2"]
    process = subprocess.Popen(
        [*command, f"--log-file={log_file}"], env=env, stdout=subprocess.DEVNULL
    )
    try:
        found: list[str] = []

        def bound() -> bool:
            text = log_file.read_text() if log_file.exists() else ""
            found[:] = re.findall(r'"Started HTTPService at 127\.0\.0\.1:(\d+)"', text)
            return bool(found)

        wait_for(bound, 60, lambda: log_file.read_text())
        (port,) = found
        assert port != "0"
        url = f"http://127.0.0.1:{port}/v2/health/ready"

        def ready() -> bool:
            try:
                return httpx.get(url).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(ready, 60, lambda: log_file.read_text())
        workers = [pid for pid in children(process.pid) if "multiprocessing.spawn" in cmdline(pid)]
        assert len(workers) == 2
        os.kill(workers[0], signal.SIGKILL)
        died = re.compile(rf'^W\S+ \S+ \d+ \S+\] "Child process \[{workers[0]}\] died"$', re.M)
        wait_for(lambda: bool(died.search(log_file.read_text())), 60, log_file.read_text)
    finally:
        process.terminate()
        process.wait(timeout=60)
    assert "Uvicorn running" not in log_file.read_text()
