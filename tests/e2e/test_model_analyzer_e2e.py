"""Triton Model Analyzer against the real server, unchanged, in its remote launch mode: it loads
each configuration it measures through the load API with the configuration as an override, and
perf_analyzer measures it. The command is docs/model-analyzer.md's, with
deploy/model-analyzer/mlp_classifier.yaml, on the bundled `mlp_classifier`; only the endpoints
and the output folders differ.

It runs where `model-analyzer` (pip `triton-model-analyzer`, tested with 1.58.0) is on PATH or
named by MODEL_ANALYZER, and perf_analyzer is installed (deploy/install-perf-analyzer.sh);
it skips elsewhere."""

from __future__ import annotations

import csv
import json
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.e2e.test_perf_analyzer_e2e import BINARY as PERF_ANALYZER
from tests.server_process import ServerProcess, start_server

ROOT = Path(__file__).resolve().parents[2]
CONFIG_FILE = ROOT / "deploy" / "model-analyzer" / "mlp_classifier.yaml"
EXAMPLES = ROOT / "tritonactor" / "examples" / "models"
DOC = ROOT / "docs" / "model-analyzer.md"
DOCS = (DOC, ROOT / "docs" / "operations.md")
MODEL = "mlp_classifier"


def model_analyzer() -> str | None:
    """MODEL_ANALYZER, or `model-analyzer` on PATH."""
    # Not a TRITONACTOR_* variable: the server refuses unknown ones in its environment.
    for candidate in (os.environ.get("MODEL_ANALYZER"), shutil.which("model-analyzer")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


MODEL_ANALYZER = model_analyzer()
pytestmark = pytest.mark.e2e
needs_model_analyzer = pytest.mark.skipif(
    MODEL_ANALYZER is None,
    reason="model-analyzer is not installed (pip install triton-model-analyzer==1.58.0, "
    "or MODEL_ANALYZER=/path/to/model-analyzer)",
)
needs_perf_analyzer = pytest.mark.skipif(
    PERF_ANALYZER is None, reason="perf_analyzer is not installed (deploy/install-perf-analyzer.sh)"
)
# Where the test's server listens: the only flags it adds to the documented command.
ENDPOINT_FLAGS = ("--triton-http-endpoint", "--triton-grpc-endpoint", "--triton-metrics-url")


def profile(server: ServerProcess, out: Path) -> subprocess.CompletedProcess[str]:
    """docs/model-analyzer.md's `model-analyzer profile`, at this server, writing into `out`
    (also its working folder: perf_analyzer's per-run file lands there)."""
    assert MODEL_ANALYZER is not None and PERF_ANALYZER is not None
    metrics_url = f"http://127.0.0.1:{server.env['TRITONACTOR_METRICS_PORT']}/metrics"
    flags = documented_flags(DOC, out, PERF_ANALYZER)
    flags[flags.index("-f") + 1] = str(ROOT / flags[flags.index("-f") + 1])  # run from `out`
    command = [MODEL_ANALYZER, *flags]
    endpoints = (server.url, server.grpc_url, metrics_url)
    command += [word for pair in zip(ENDPOINT_FLAGS, endpoints, strict=True) for word in pair]
    return subprocess.run(command, cwd=out, capture_output=True, text=True, timeout=600)


def documented_flags(doc: Path, out: Path, perf_analyzer: str) -> list[str]:
    """The `model-analyzer profile` arguments shown in `doc`, with `$OUT`, `$PA` and `$PWD`
    (the repository's root) given."""
    command = re.search(r"^model-analyzer profile .*?[^\\]$", doc.read_text(), re.M | re.S)
    assert command is not None, f"{doc.name} has no `model-analyzer profile` command"
    words = shlex.split(command.group(0).replace("\\\n", " "))[1:]
    values = {"$OUT": str(out), "$PA": perf_analyzer, "$PWD": str(ROOT)}
    return [re.sub(r"\$(OUT|PA|PWD)", lambda m: values[m.group(0)], w) for w in words]


def loads(server: ServerProcess) -> list[dict[str, object]]:
    """The server's `LoadRequested` and `ModelLoaded` events, in order."""
    found: list[dict[str, object]] = []
    after = 0
    while page := httpx.get(f"{server.base}/v2/repository/events?after={after}").json()["events"]:
        found += [e for e in page if e["type"] in ("LoadRequested", "ModelLoaded")]
        after = page[-1]["seq"]
    return found


def served_config(server: ServerProcess) -> dict[str, object]:
    response = httpx.get(f"{server.base}/v2/models/{MODEL}/config")
    assert response.status_code == 200, response.text
    return response.json()


def test_the_doc_shows_the_config_file_and_the_command_this_module_runs(tmp_path: Path) -> None:
    blocks = re.findall(r"^```yaml\n(.*?)^```", DOC.read_text(), re.M | re.S)
    assert [yaml.safe_load(block) for block in blocks] == [yaml.safe_load(CONFIG_FILE.read_text())]
    for doc in DOCS:
        flags = documented_flags(doc, tmp_path, "/pa")
        assert flags[:3] == ["profile", "-f", str(CONFIG_FILE.relative_to(ROOT))], doc.name
        assert dict(zip(flags[3::2], flags[4::2], strict=True)) == {
            "--model-repository": str(EXAMPLES),
            "--perf-analyzer-path": "/pa",
            "--checkpoint-directory": str(tmp_path / "checkpoints"),
            "--output-model-repository-path": str(tmp_path / "output_models"),
            "--export-path": str(tmp_path),
        }, doc.name
        # The doc's server listens on the default ports; the test adds where its server is.
        assert not set(flags) & set(ENDPOINT_FLAGS), doc.name


@pytest.fixture()
def explicit_server(tmp_path: Path) -> Iterator[ServerProcess]:
    """The bundled examples in explicit mode, nothing loaded: Model Analyzer loads what it needs."""
    env = {"TRITONACTOR_MODEL_CONTROL_MODE": "explicit"}
    process = start_server([EXAMPLES], tmp_path, env)
    yield process
    process.stop()


@needs_model_analyzer
@needs_perf_analyzer
def test_profile_measures_each_configuration_loaded_as_an_override(
    explicit_server: ServerProcess, tmp_path: Path
) -> None:
    out = tmp_path / "model-analyzer"
    out.mkdir()
    run = profile(explicit_server, out)
    assert run.returncode == 0, run.stdout + run.stderr

    # Its results: the repository's own configuration ("default") and the file's two, each
    # measured, with the instance counts the file asked for.
    with (out / "results" / "metrics-model-inference.csv").open() as results:
        rows = {row["Model Config Path"]: row for row in csv.DictReader(results)}
    assert set(rows) == {f"{MODEL}_config_default", f"{MODEL}_config_0", f"{MODEL}_config_1"}
    assert rows[f"{MODEL}_config_0"]["Instance Group"] == "1:CPU"
    assert rows[f"{MODEL}_config_1"]["Instance Group"] == "2:CPU"
    for name, row in rows.items():
        assert row["Model"] == MODEL and row["Concurrency"] == "8", row
        assert float(row["Throughput (infer/sec)"]) > 0, name
        assert float(row["p99 Latency (ms)"]) > 0, name

    # The server's side: one API load per configuration, each with its configuration as an
    # override, each loaded (a ModelLoaded with the same digest follows it).
    history = loads(explicit_server)
    requested = [e for e in history if e["type"] == "LoadRequested"]
    assert [e["model"] for e in requested] == [MODEL] * 3
    assert all(e["fields"]["source"] == "api" for e in requested)
    overrides = [json.loads(e["fields"]["config_override"]) for e in requested]
    assert [(o["instance_group"][0]["count"], "dynamic_batching" in o) for o in overrides] == [
        (1, False),  # the default: the repository's config.pbtxt as it is
        (1, True),
        (2, True),
    ]
    # protobuf's JSON writes a uint64 as a string
    delays = [int(o["dynamic_batching"]["max_queue_delay_microseconds"]) for o in overrides[1:]]
    assert delays == [100, 100]
    loaded = [e["fields"]["config_digest"] for e in history if e["type"] == "ModelLoaded"]
    assert loaded == [e["fields"]["config_digest"] for e in requested]

    # What serves now is the last override, not the repository's file.
    config = served_config(explicit_server)
    assert [group["count"] for group in config["instance_group"]] == [2]
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 100


@needs_model_analyzer
@needs_perf_analyzer
def test_profile_refused_by_a_server_not_in_explicit_mode(tmp_path: Path) -> None:
    """Mode `none` refuses the API's loads with Triton's message, which Model Analyzer knows:
    it stops with its own clear error, and the model stays as the repository configures it."""
    server = start_server([EXAMPLES], tmp_path)
    try:
        before = served_config(server)
        out = tmp_path / "model-analyzer"
        out.mkdir()
        run = profile(server, out)

        assert run.returncode != 0
        output = run.stdout + run.stderr
        assert "The remote Tritonserver needs to be launched in EXPLICIT mode" in output, output
        assert not (out / "results" / "metrics-model-inference.csv").exists()
        assert not any(e["fields"].get("source") == "api" for e in loads(server))
        assert served_config(server) == before
        assert "dynamic_batching" not in before
    finally:
        server.stop()
