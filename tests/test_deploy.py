"""The container deployment: Dockerfile, compose.yaml, Prometheus and Grafana provisioning.

No engine is needed: the files are checked as files, and with the tools that validate them when
they are on PATH (`docker compose config`, `promtool`; deploy/install-validators.sh installs both).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from tritonactor.settings import PREFIX, VARIABLES, Settings, example_repository

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "tritonactor.json"
PROMETHEUS_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
PROVISIONING = ROOT / "deploy" / "grafana" / "provisioning"
OPERATIONS_DOC = ROOT / "docs" / "operations.md"

# What the server exports (tritonactor/observability: Triton's names, then ours, then
# prometheus_client's process collector). A dashboard query naming anything else would draw an
# empty panel forever.
TRITON_SERIES = frozenset(
    {
        "nv_inference_request_success",
        "nv_inference_request_failure",
        "nv_inference_count",
        "nv_inference_exec_count",
        "nv_inference_request_duration_us",
        "nv_inference_queue_duration_us",
        "nv_inference_compute_input_duration_us",
        "nv_inference_compute_infer_duration_us",
        "nv_inference_compute_output_duration_us",
        "nv_inference_pending_request_count",
        "nv_model_load_duration_secs",
        "nv_cpu_utilization",
        "nv_cpu_memory_total_bytes",
        "nv_cpu_memory_used_bytes",
    }
)
OUR_SERIES = frozenset(
    {
        "tritonactor_actor_mailbox_depth",
        "tritonactor_inference_batch_executions_total",
        "tritonactor_journal_events_total",
    }
)
HISTOGRAMS = frozenset({"nv_inference_first_response_histogram_ms"})
PROCESS_SERIES = frozenset({"process_cpu_seconds_total", "process_resident_memory_bytes"})
KNOWN_SERIES = (
    TRITON_SERIES
    | OUR_SERIES
    | PROCESS_SERIES
    | {f"{name}{suffix}" for name in HISTOGRAMS for suffix in ("_bucket", "_sum", "_count")}
)

PROMQL_FUNCTIONS = frozenset(
    {
        "rate",
        "irate",
        "increase",
        "delta",
        "idelta",
        "deriv",
        "histogram_quantile",
        "avg_over_time",
        "max_over_time",
        "min_over_time",
        "sum_over_time",
        "abs",
        "clamp_min",
        "clamp_max",
        "vector",
        "scalar",
        "label_replace",
        "absent",
        "time",
    }
)
PROMQL_AGGREGATIONS = frozenset(
    {"sum", "avg", "min", "max", "count", "topk", "bottomk", "quantile", "stddev", "group"}
)
PROMQL_KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset"})
GROUPING_CLAUSE = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)")
LABEL_MATCHER = re.compile(r'^\s*[A-Za-z_]\w*\s*(?:=~|!~|!=|=)\s*""\s*$')
DURATION = re.compile(r"^\d+(?:ms|[smhdwy])$")
# Grafana's own variables; the dashboard's are checked against its templating list.
GRAFANA_BUILTINS = frozenset({"__rate_interval", "__interval", "__range"})


# -- loading ----------------------------------------------------------------------------------


@cache
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def all_panels(container: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, rows' nested panels included (a collapsed row keeps its panels inside)."""
    for panel in container.get("panels", []):
        yield panel
        yield from all_panels(panel)


def dashboard_queries() -> list[tuple[str, str]]:
    """(where, PromQL) for every panel query of the dashboard."""
    queries = []
    for panel in all_panels(dashboard()):
        for target in panel.get("targets", []):
            queries.append(
                (f"panel {panel['id']} {panel['title']!r} {target['refId']}", target["expr"])
            )
    return queries


def template_variables() -> dict[str, dict[str, Any]]:
    return {variable["name"]: variable for variable in dashboard()["templating"]["list"]}


def for_prometheus(expr: str) -> str:
    """The query as Prometheus receives it, once Grafana has put in its variables' values."""

    def substitute(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name in GRAFANA_BUILTINS:
            return "1m"
        return template_variables()[name].get("allValue") or ".*"

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", substitute, expr)


def dockerfile() -> str:
    return (ROOT / "Dockerfile").read_text(encoding="utf-8")


def dockerfile_arg(name: str) -> str:
    match = re.search(rf"^ARG {name}=(\S+)$", dockerfile(), re.MULTILINE)
    assert match, f"the Dockerfile has no `ARG {name}=...` default"
    return match.group(1)


def pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


@cache
def compose_available() -> bool:
    if shutil.which("docker") is None:
        return False
    probe = subprocess.run(
        ["docker", "compose", "version"], capture_output=True, text=True, timeout=30
    )
    return probe.returncode == 0


def docker_compose(*args: str) -> subprocess.CompletedProcess[str]:
    # An empty environment for interpolation, apart from what docker needs to run: the defaults
    # in compose.yaml are what is checked, not whatever this shell happens to export.
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(Path.home())}
    return subprocess.run(
        ["docker", "compose", "--file", str(ROOT / "compose.yaml"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    """compose.yaml as docker compose resolves it (defaults filled in, paths absolute)."""
    if compose_available():
        result = docker_compose("config", "--format", "json")
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)
    yaml = pytest.importorskip(
        "yaml", reason="neither `docker compose` (deploy/install-validators.sh) nor PyYAML"
    )
    return resolve_compose(yaml.safe_load((ROOT / "compose.yaml").read_text(encoding="utf-8")))


def resolve_compose(raw: dict[str, Any]) -> dict[str, Any]:
    """What `docker compose config` makes of the forms compose.yaml uses, for machines without
    the plugin: `${NAME:-default}` takes its default, "host:container" ports become
    {"target": container}, bind sources become absolute, network lists become mappings."""

    def interpolate(value: Any) -> Any:
        if isinstance(value, str):
            return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", value)
        if isinstance(value, dict):
            return {key: interpolate(item) for key, item in value.items()}
        if isinstance(value, list):
            return [interpolate(item) for item in value]
        return value

    resolved = interpolate(raw)
    for service in resolved["services"].values():
        service["environment"] = {k: str(v) for k, v in service.get("environment", {}).items()}
        service["ports"] = [{"target": port.rsplit(":", 1)[1]} for port in service.get("ports", [])]
        for mount in service.get("volumes", []):
            if mount["type"] == "bind":
                mount["source"] = str((ROOT / mount["source"]).resolve())
        service["networks"] = dict.fromkeys(service.get("networks", []))
    return resolved


# -- PromQL, checked without Prometheus --------------------------------------------------------


def promql_problems(expr: str) -> list[str]:
    """What is wrong with a dashboard query, as far as can be told without a PromQL parser."""
    problems = []
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', for_prometheus(expr))
    pairs = {")": "(", "]": "[", "}": "{"}
    stack: list[str] = []
    for char in text:
        if char in "([{":
            stack.append(char)
        elif char in pairs and (not stack or stack.pop() != pairs[char]):
            return [f"unbalanced {char!r}"]
    if stack:
        return [f"unclosed {stack[-1]!r}"]

    for window in re.findall(r"\[([^\]]*)\]", text):
        if not DURATION.match(window.strip()):
            problems.append(f"range [{window}] is not a duration")
    text = re.sub(r"\[[^\]]*\]", " ", text)
    for matchers in re.findall(r"\{([^}]*)\}", text):
        for matcher in filter(str.strip, matchers.split(",")):
            if not LABEL_MATCHER.match(matcher):
                problems.append(f"label matcher {matcher.strip()!r} is malformed")
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = GROUPING_CLAUSE.sub(" ", text)

    for match in re.finditer(r"(?<![\w.])[A-Za-z_:][\w:]*", text):
        name = match.group()
        called = text[match.end() :].lstrip().startswith("(")
        if called:
            if name not in PROMQL_FUNCTIONS | PROMQL_AGGREGATIONS:
                problems.append(f"unknown function {name}()")
        elif name not in PROMQL_KEYWORDS and name not in KNOWN_SERIES:
            problems.append(f"unknown metric {name}")
    return problems


@pytest.mark.parametrize(
    ("expr", "problem"),
    [
        ("sum(rate(nv_inference_count[1m])", "unclosed '('"),
        ("rate(nv_inference_count[1m]))", "unbalanced ')'"),
        ("rate(nv_inference_counts[1m])", "unknown metric nv_inference_counts"),
        ("rate(nv_inference_count[soon])", "range [soon] is not a duration"),
        ("sums(nv_inference_count)", "unknown function sums()"),
        ('nv_inference_count{model~"x"}', "label matcher 'model~\"\"' is malformed"),
    ],
)
def test_the_promql_check_catches_broken_queries(expr: str, problem: str) -> None:
    assert problem in promql_problems(expr)


def test_the_promql_check_accepts_a_typical_query() -> None:
    expr = (
        'sum by (model) (rate(nv_inference_queue_duration_us{model=~"$model"}[$__rate_interval]))'
        ' / sum by (model) (rate(nv_inference_request_success{model=~"$model"}[5m]))'
    )
    assert promql_problems(expr) == []


# -- the dashboard ----------------------------------------------------------------------------


def test_dashboard_panel_ids_are_unique() -> None:
    ids = [panel["id"] for panel in all_panels(dashboard())]
    assert all(isinstance(panel_id, int) for panel_id in ids)
    assert len(ids) == len(set(ids)), sorted(ids)


def test_dashboard_panel_titles_are_unique() -> None:
    # docs/operations.md has a section per title; two panels of one name could not be told apart.
    titles = [panel["title"] for panel in all_panels(dashboard())]
    assert len(titles) == len(set(titles)), sorted(titles)


def test_dashboard_panels_fit_the_grid_without_overlapping() -> None:
    taken: dict[tuple[int, int], str] = {}
    for panel in all_panels(dashboard()):
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["w"] > 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in taken, f"{panel['title']!r} overlaps {taken[(x, y)]!r}"
                taken[(x, y)] = panel["title"]


def test_every_query_panel_has_a_title_description_and_unique_ref_ids() -> None:
    for panel in all_panels(dashboard()):
        if panel["type"] == "row":
            continue
        assert panel["title"] and panel.get("description"), panel["id"]
        ref_ids = [target["refId"] for target in panel["targets"]]
        assert ref_ids and len(ref_ids) == len(set(ref_ids)), panel["title"]


@pytest.mark.parametrize(("where", "expr"), dashboard_queries())
def test_dashboard_query_is_well_formed(where: str, expr: str) -> None:
    assert promql_problems(expr) == [], f"{where}: {expr}"


def test_dashboard_variables_are_defined_and_used() -> None:
    variables = template_variables()
    assert "model" in variables
    model = variables["model"]
    assert model["includeAll"] and model["multi"]
    match = re.fullmatch(r"label_values\((\w+),\s*model\)", model["definition"])
    assert match and match.group(1) in KNOWN_SERIES, model["definition"]

    used = {
        name
        for _, expr in dashboard_queries()
        for name in re.findall(r"\$\{?(\w+)", expr)
        if name not in GRAFANA_BUILTINS
    }
    assert used <= set(variables), used - set(variables)
    assert "model" in used


def test_dashboard_covers_the_issue_metrics() -> None:
    """Throughput, failures, each latency stage, queue depth, batching, loads, CPU and memory."""
    text = " ".join(expr for _, expr in dashboard_queries())
    names = TRITON_SERIES | OUR_SERIES | PROCESS_SERIES | HISTOGRAMS
    missing = {name for name in names if name not in text}
    assert not missing


def test_the_metric_names_are_the_ones_the_server_exports() -> None:
    """The list above against tritonactor/observability, so that a renamed family fails here
    rather than leaving a panel empty."""
    source = "\n".join(
        path.read_text(encoding="utf-8")
        for path in (ROOT / "tritonactor" / "observability").glob("*.py")
    )
    if "nv_inference_request_success" not in source:
        pytest.skip("the server exports no metrics yet")
    missing = {
        name for name in TRITON_SERIES | OUR_SERIES | HISTOGRAMS if f'"{name}"' not in source
    }
    assert not missing
    assert "ProcessCollector(" in source  # the process_* series


def test_dashboard_uses_the_provisioned_datasource() -> None:
    yaml = pytest.importorskip("yaml")
    provisioned = yaml.safe_load(
        (PROVISIONING / "datasources" / "prometheus.yml").read_text(encoding="utf-8")
    )
    (prometheus,) = provisioned["datasources"]
    assert prometheus["type"] == "prometheus"
    assert prometheus["url"] == "http://prometheus:9090"
    for panel in all_panels(dashboard()):
        for holder in (panel, *panel.get("targets", [])):
            if "datasource" in holder:
                assert holder["datasource"]["uid"] == prometheus["uid"], panel["title"]


def test_dashboard_provider_reads_the_folder_compose_mounts(compose: dict[str, Any]) -> None:
    yaml = pytest.importorskip("yaml")
    providers = yaml.safe_load(
        (PROVISIONING / "dashboards" / "dashboards.yml").read_text(encoding="utf-8")
    )["providers"]
    mounts = {
        mount["target"]: Path(mount["source"])
        for mount in compose["services"]["grafana"]["volumes"]
    }
    for provider in providers:
        folder = mounts[provider["options"]["path"]]
        assert folder == DASHBOARD.parent


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not on PATH")
def test_promtool_parses_every_dashboard_query(tmp_path: Path) -> None:
    # A recording rule per query: `promtool check rules` runs Prometheus's own parser on each.
    # JSON is YAML, so no YAML library is needed to write the file.
    rules = [
        {"record": f"dashboard:query_{index}", "expr": for_prometheus(expr)}
        for index, (_, expr) in enumerate(dashboard_queries())
    ]
    path = tmp_path / "rules.yml"
    path.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = subprocess.run(
        ["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


# -- Prometheus -------------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not on PATH")
def test_promtool_accepts_the_prometheus_config() -> None:
    result = subprocess.run(
        ["promtool", "check", "config", str(PROMETHEUS_CONFIG)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_prometheus_scrapes_the_metrics_port_of_the_compose_service() -> None:
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text(encoding="utf-8"))
    targets = [
        target
        for job in config["scrape_configs"]
        for static in job.get("static_configs", [])
        for target in static["targets"]
    ]
    assert targets == [f"tritonactor:{Settings().metrics_port}"]
    assert config["scrape_configs"][0].get("metrics_path", "/metrics") == "/metrics"


# -- compose.yaml -----------------------------------------------------------------------------


def test_docker_compose_config_validates() -> None:
    if not compose_available():
        pytest.skip(
            "no `docker compose` plugin on PATH (deploy/install-validators.sh installs one)"
        )
    result = docker_compose("config", "--quiet")
    assert result.returncode == 0, result.stderr


def test_compose_runs_the_four_services_on_one_network(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {"tritonactor", "jaeger", "prometheus", "grafana"}
    (network,) = compose["networks"]
    for name, service in services.items():
        assert set(service["networks"]) == {network}, name


def test_compose_publishes_the_documented_ports(compose: dict[str, Any]) -> None:
    published = {
        name: {int(port["target"]) for port in service.get("ports", [])}
        for name, service in compose["services"].items()
    }
    settings = Settings()
    assert published["tritonactor"] == {
        settings.http_port,
        settings.grpc_port,
        settings.metrics_port,
    }
    assert published["jaeger"] == {16686, 4317, 4318}
    assert published["prometheus"] == {9090}
    assert published["grafana"] == {3000}
    doc = OPERATIONS_DOC.read_text(encoding="utf-8")
    for port in set().union(*published.values()):
        assert f"| {port} |" in doc, f"port {port} is missing from the table in {OPERATIONS_DOC}"


def test_compose_mounts_the_repository_and_keeps_the_journal_on_a_volume(
    compose: dict[str, Any],
) -> None:
    service = compose["services"]["tritonactor"]
    env = service["environment"]
    mounts = {mount["target"]: mount for mount in service["volumes"]}
    models = mounts[env["TRITONACTOR_MODEL_REPOSITORY"]]
    assert models["type"] == "bind"
    assert Path(models["source"]) == example_repository()
    journal_folder = str(Path(env["TRITONACTOR_JOURNAL"]).parent)
    assert mounts[journal_folder]["type"] == "volume"
    assert mounts[journal_folder]["source"] in compose["volumes"]


def test_compose_settings_are_ones_the_server_accepts(
    compose: dict[str, Any], tmp_path: Path
) -> None:
    env = dict(compose["services"]["tritonactor"]["environment"])
    # The container's paths, moved to where they exist here; everything else as compose gives it.
    env["TRITONACTOR_MODEL_REPOSITORY"] = str(example_repository())
    env["TRITONACTOR_JOURNAL"] = str(tmp_path / "journal.jsonl")
    Settings.from_env(env)  # raises on a misspelt variable or a bad value


def test_compose_sends_traces_to_jaeger(compose: dict[str, Any]) -> None:
    env = compose["services"]["tritonactor"]["environment"]
    protocol = env["OTEL_EXPORTER_OTLP_PROTOCOL"]
    port = {"grpc": 4317, "http/protobuf": 4318}[protocol]
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == f"http://jaeger:{port}"
    assert env["OTEL_SERVICE_NAME"] == "tritonactor"
    assert compose["services"]["jaeger"]["environment"]["COLLECTOR_OTLP_ENABLED"] == "true"


def test_the_image_has_the_exporter_compose_asks_for(compose: dict[str, Any]) -> None:
    """The server imports the OTLP exporter of the configured protocol only when tracing is on:
    an image without it would fail to start under compose, and no other test would notice."""
    protocol = compose["services"]["tritonactor"]["environment"]["OTEL_EXPORTER_OTLP_PROTOCOL"]
    package = {
        "grpc": "opentelemetry-exporter-otlp-proto-grpc",
        "http/protobuf": "opentelemetry-exporter-otlp-proto-http",
    }[protocol]
    project = pyproject()["project"]
    declared = [*project["dependencies"], *project["optional-dependencies"]["cpu"]]
    installed_by_package = any(re.match(rf"{package}\b", pin) for pin in declared)
    assert installed_by_package or f'"{package}' in dockerfile()


def test_compose_bind_mounts_exist(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        for mount in service.get("volumes", []):
            if mount["type"] == "bind":
                assert Path(mount["source"]).exists(), f"{name}: {mount['source']}"


# -- the Dockerfile ---------------------------------------------------------------------------


def test_dockerfile_torch_pin_is_the_cpu_extra_pin() -> None:
    cpu_extra = pyproject()["project"]["optional-dependencies"]["cpu"]
    torch_pins = [pin for pin in cpu_extra if re.match(r"torch\b", pin)]
    assert torch_pins == [f"torch=={dockerfile_arg('TORCH_VERSION')}"]


def test_dockerfile_python_satisfies_requires_python() -> None:
    requires = pyproject()["project"]["requires-python"]
    minimum = re.fullmatch(r">=\s*(\d+)\.(\d+)", requires)
    assert minimum, requires
    image = tuple(int(part) for part in dockerfile_arg("PYTHON_VERSION").split("."))
    assert image[:2] >= (int(minimum.group(1)), int(minimum.group(2)))
    assert re.search(r"^FROM python:\$\{PYTHON_VERSION\}-slim\b", dockerfile(), re.MULTILINE)


def test_dockerfile_installs_the_cpu_extra_and_runs_as_a_user() -> None:
    text = dockerfile()
    # The extra is a build argument (`--build-arg EXTRA=gpu`); cpu unless told.
    assert dockerfile_arg("EXTRA") == "cpu"
    assert 'pip install ".[${EXTRA},s3]"' in text
    users = re.findall(r"^USER (\S+)$", text, re.MULTILINE)
    assert users and users[-1] not in {"root", "0"}


def test_dockerfile_exposes_the_server_ports_and_checks_liveness() -> None:
    text = dockerfile()
    settings = Settings()
    exposed = re.search(r"^EXPOSE (.+)$", text, re.MULTILINE)
    assert exposed
    assert {int(port) for port in exposed.group(1).split()} == {
        settings.http_port,
        settings.grpc_port,
        settings.metrics_port,
    }
    healthcheck = re.search(r"^HEALTHCHECK .*?CMD (.+)$", text, re.MULTILINE | re.DOTALL)
    assert healthcheck and "/v2/health/live" in healthcheck.group(1)


def test_dockerfile_sets_only_known_settings() -> None:
    names = set(re.findall(rf"\b({PREFIX}\w+)=", dockerfile()))
    assert names and names <= set(VARIABLES.values()), names - set(VARIABLES.values())


# -- .dockerignore ----------------------------------------------------------------------------


def dockerignore_excludes(path: str) -> bool:
    """Whether the build context leaves `path` out, by .dockerignore's rules (last match wins;
    a pattern that matches a parent folder matches everything inside it)."""
    excluded = False
    lines = (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
    for line in lines:
        pattern = line.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negated = pattern.startswith("!")
        regex = _ignore_regex(pattern.removeprefix("!").strip("/"))
        parts = path.split("/")
        candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(regex.fullmatch(candidate) for candidate in candidates):
            excluded = not negated
    return excluded


def _ignore_regex(pattern: str) -> re.Pattern[str]:
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        elif pattern[i] == "[":
            end = pattern.index("]", i)
            out, i = out + pattern[i : end + 1], end + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def test_dockerignore_keeps_what_the_build_copies() -> None:
    sources = [
        source
        for line in re.findall(r"^COPY (?!--from)(.+)$", dockerfile(), re.MULTILINE)
        for source in line.split()[:-1]
        if not source.startswith("--")
    ]
    assert sources
    for source in sources:
        assert (ROOT / source).exists(), source
        assert not dockerignore_excludes(source), source
    assert not dockerignore_excludes("tritonactor/examples/models/simple/config.pbtxt")


@pytest.mark.parametrize(
    "path", [".git/HEAD", "tests/test_deploy.py", ".venv/bin/python", "tritonactor/__pycache__/x"]
)
def test_dockerignore_leaves_out_what_the_image_does_not_need(path: str) -> None:
    assert dockerignore_excludes(path)


# -- docs/operations.md -----------------------------------------------------------------------


def test_operations_doc_describes_every_panel_with_its_queries() -> None:
    doc = OPERATIONS_DOC.read_text(encoding="utf-8")
    headings = set(re.findall(r"^#{3,4} (.+)$", doc, re.MULTILINE))
    for panel in all_panels(dashboard()):
        assert panel["title"] in headings, f"panel {panel['title']!r} has no section"
    for where, expr in dashboard_queries():
        assert expr in doc, f"{where}: the page does not show its query"
