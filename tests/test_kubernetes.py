"""The Kubernetes and KServe manifests (deploy/kubernetes) and the image they name.

Checked as files first: every manifest parses, the core kinds pass kubernetes-validate's offline
schemas (strict, at the oldest and newest Kubernetes this claims), the CRD kinds (ServiceMonitor,
ServingRuntime, InferenceService) field by field. Then with `kubectl kustomize` where kubectl is
on PATH: both overlays, the components and docs/kubernetes.md's own overlay build, and the built
objects agree with the server (ports, probe paths, settings). The server run as the pod runs it:
tests/e2e/test_kubernetes_pod_e2e.py.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from tests.test_deploy import promql_problems
from tritonactor.settings import Settings, SettingsError, example_repository

yaml = pytest.importorskip("yaml")
kubernetes_validate = pytest.importorskip("kubernetes_validate")

ROOT = Path(__file__).resolve().parent.parent
KUBE = ROOT / "deploy" / "kubernetes"
DOC = ROOT / "docs" / "kubernetes.md"
# The oldest Kubernetes the manifests claim (autoscaling/v2 and policy/v1 are GA since 1.23;
# every field used exists in 1.29) and the newest kubernetes-validate knows.
KUBERNETES_VERSIONS = ("1.29.0", kubernetes_validate.latest_version())
CRD_GROUPS = ("monitoring.coreos.com/", "serving.kserve.io/")
KUSTOMIZE_GROUP = "kustomize.config.k8s.io/"
# Not Kubernetes objects: Helm values for the Prometheus adapter.
NOT_OBJECTS = {KUBE / "prometheus-adapter-values.yaml"}
# KServe's conventions for a runtime's container: HTTP on 8080, gRPC on 9000, the model files
# the storage initializer fetched in /mnt/models.
KSERVE_HTTP_PORT, KSERVE_GRPC_PORT, KSERVE_MODEL_DIR = 8080, 9000, "/mnt/models"
KUBERNETES_DEFAULT_GRACE = 30
MODEL_FORMATS = {"onnx", "pytorch", "tensorrt", "python", "triton"}
S3_KEYS = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL"}

needs_kubectl = pytest.mark.skipif(
    shutil.which("kubectl") is None,
    reason="kubectl is not on PATH: the overlays are not built (the files are checked alone)",
)


# -- loading ----------------------------------------------------------------------------------


def manifest_files() -> list[Path]:
    return sorted(KUBE.rglob("*.yaml"))


@cache
def documents(path: Path) -> tuple[dict[str, Any], ...]:
    return tuple(doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc)


def kustomizations() -> list[Path]:
    return [path for path in manifest_files() if path.name == "kustomization.yaml"]


@cache
def patch_files() -> frozenset[Path]:
    """Files a kustomization applies as patches: partial objects, not validated alone."""
    patches = set()
    for kustomization in kustomizations():
        for patch in documents(kustomization)[0].get("patches", []):
            patches.add((kustomization.parent / patch["path"]).resolve())
    return frozenset(patches)


def objects() -> list[tuple[str, dict[str, Any]]]:
    """(where, object) for every complete object in the files."""
    found = []
    for path in manifest_files():
        if path in NOT_OBJECTS or path.resolve() in patch_files():
            continue
        for index, doc in enumerate(documents(path)):
            if not doc["apiVersion"].startswith(KUSTOMIZE_GROUP):
                found.append((f"{path.relative_to(KUBE)}#{index}", doc))
    return found


def one(path: Path, kind: str) -> dict[str, Any]:
    (found,) = [doc for doc in documents(path) if doc["kind"] == kind]
    return found


def settings_env() -> dict[str, str]:
    """base/settings.env, as the ConfigMap the Deployment reads its environment from."""
    env = {}
    for line in (KUBE / "base" / "settings.env").read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, value = line.partition("=")
            env[name] = value
    return env


def compose_image() -> str:
    return yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]["tritonactor"]["image"]


def dockerfile() -> str:
    return (ROOT / "Dockerfile").read_text(encoding="utf-8")


def kubectl_kustomize(folder: Path) -> list[dict[str, Any]]:
    result = subprocess.run(
        ["kubectl", "kustomize", str(folder)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def built(objects_: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [doc for doc in objects_ if doc["kind"] == kind]
    return found


def server_container(pod_spec: dict[str, Any]) -> dict[str, Any]:
    return pod_spec["containers"][0]


# -- checks that return what is wrong (each shown failing below) --------------------------------


def validation_problems(obj: dict[str, Any]) -> list[str]:
    problems = []
    for version in KUBERNETES_VERSIONS:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            problems.append(f"{version}: {'.'.join(map(str, error.path))}: {error.message}")
    return problems


def restricted_problems(pod_spec: dict[str, Any]) -> list[str]:
    """What keeps a pod from Pod Security's `restricted` level, plus this image's own needs:
    its uid, and a read-only root with a volume wherever the server writes."""
    problems = []
    pod = pod_spec.get("securityContext", {})
    uid = int(re.search(r"useradd .*--uid (\d+)", dockerfile()).group(1))
    if pod.get("runAsNonRoot") is not True:
        problems.append("runAsNonRoot is not true")
    if pod.get("runAsUser") != uid:
        problems.append(f"runAsUser is not the image's uid {uid}")
    if pod.get("seccompProfile", {}).get("type") != "RuntimeDefault":
        problems.append("no RuntimeDefault seccomp profile")
    for container in pod_spec["containers"]:
        context = container.get("securityContext", {})
        if context.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{container['name']}: allowPrivilegeEscalation is not false")
        if context.get("capabilities", {}).get("drop") != ["ALL"]:
            problems.append(f"{container['name']}: capabilities are not all dropped")
    return problems


def writable_problems(pod_spec: dict[str, Any], env: dict[str, str]) -> list[str]:
    """Each folder the server writes in is a volume of a read-only root: /dev/shm (in memory),
    the temp folder (the engine's sockets), the journal's folder and the repository cache."""
    container = server_container(pod_spec)
    if container.get("securityContext", {}).get("readOnlyRootFilesystem") is not True:
        return ["the root filesystem is not read-only"]
    volumes = {volume["name"]: volume for volume in pod_spec.get("volumes", [])}
    mounts = {m["mountPath"]: volumes.get(m["name"]) for m in container.get("volumeMounts", [])}
    problems = [f"mount of undeclared volume at {path}" for path, v in mounts.items() if not v]
    needed = {
        "/dev/shm": "python backend tensors",
        "/tmp": "the engine's sockets",
        str(Path(env["TRITONACTOR_JOURNAL"]).parent): "the journal",
        env["TRITONACTOR_REPOSITORY_CACHE_DIR"]: "the repository cache",
    }
    for folder, why in needed.items():
        if not any(Path(folder).is_relative_to(path) for path in mounts):
            problems.append(f"{folder} ({why}) is on no volume")
    shm = mounts.get("/dev/shm") or {}
    if shm.get("emptyDir", {}).get("medium") != "Memory":
        problems.append("/dev/shm is not an in-memory emptyDir")
    return problems


def uncomment_between(text: str, begin: str, end: str) -> str:
    """The text with the lines between the two marker lines un-commented (the "# " removed,
    the indentation kept): how hpa.yaml's queue-time variant is switched on."""
    out, inside = [], False
    for line in text.splitlines():
        if line.strip() == f"# {begin}":
            inside = True
        elif line.strip() == f"# {end}":
            inside = False
        elif inside:
            line = re.sub(r"^(\s*)# ?", r"\1", line)
        out.append(line)
    return "\n".join(out) + "\n"


def test_the_checks_catch_what_they_are_for() -> None:
    deployment = one(KUBE / "base" / "deployment.yaml", "Deployment")
    broken = copy.deepcopy(deployment)
    server_container(broken["spec"]["template"]["spec"])["resources"]["requets"] = {}
    assert validation_problems(broken)
    pod = copy.deepcopy(deployment["spec"]["template"]["spec"])
    pod["securityContext"]["runAsUser"] = 0
    del server_container(pod)["securityContext"]["capabilities"]
    assert len(restricted_problems(pod)) == 2
    env = {**settings_env(), "TRITONACTOR_JOURNAL": "/home/tritonactor/journal.jsonl"}
    assert writable_problems(deployment["spec"]["template"]["spec"], env) == [
        "/home/tritonactor (the journal) is on no volume"
    ]
    assert uncomment_between("a\n# B\n  # - x: 1\n# E\n", "B", "E") == "a\n# B\n  - x: 1\n# E\n"


# -- every file ---------------------------------------------------------------------------------


@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: str(p.relative_to(KUBE)))
def test_every_manifest_parses_into_objects(path: Path) -> None:
    docs = documents(path)
    assert docs
    if path not in NOT_OBJECTS:
        for doc in docs:
            assert doc.get("apiVersion") and doc.get("kind"), path


def core_objects() -> list[tuple[str, dict[str, Any]]]:
    """The objects of Kubernetes' own kinds; the CRD kinds are checked field by field below."""
    return [
        (where, obj) for where, obj in objects() if not obj["apiVersion"].startswith(CRD_GROUPS)
    ]


@pytest.mark.parametrize(("where", "obj"), core_objects(), ids=[w for w, _ in core_objects()])
def test_core_kinds_pass_the_offline_schemas(where: str, obj: dict[str, Any]) -> None:
    assert validation_problems(obj) == []


def test_the_crd_kinds_are_the_expected_ones() -> None:
    kinds = {(obj["apiVersion"], obj["kind"]) for _, obj in objects()}
    assert {k for k in kinds if k[0].startswith(CRD_GROUPS)} == {
        ("monitoring.coreos.com/v1", "ServiceMonitor"),
        ("serving.kserve.io/v1alpha1", "ServingRuntime"),
        ("serving.kserve.io/v1beta1", "InferenceService"),
    }


def test_every_file_is_used_by_a_kustomization() -> None:
    used = set(NOT_OBJECTS) | {KUBE / "s3-secret.example.yaml"}
    for kustomization in kustomizations():
        used.add(kustomization)
        spec = documents(kustomization)[0]
        for entry in [*spec.get("resources", []), *spec.get("components", [])]:
            target = (kustomization.parent / entry).resolve()
            assert target.exists(), f"{kustomization}: {entry}"
            if target.is_file():
                used.add(target)
        for patch in spec.get("patches", []):
            used.add((kustomization.parent / patch["path"]).resolve())
        for generator in spec.get("configMapGenerator", []):
            for env_file in generator.get("envs", []):
                assert (kustomization.parent / env_file).is_file()
    assert {p.resolve() for p in manifest_files()} <= {p.resolve() for p in used}


# -- the Deployment and its Service ---------------------------------------------------------------


def deployment_file() -> dict[str, Any]:
    return one(KUBE / "base" / "deployment.yaml", "Deployment")


def accepted_settings(env: dict[str, str], tmp_path: Path) -> Settings:
    """The settings the server makes of a pod's environment, with the pod's paths moved to
    where they exist here (a local repository: the bundled examples; a bucket's URL is only
    parsed, nothing is fetched); raises on a misspelt variable or a bad value."""
    env = dict(env)
    if "://" not in env["TRITONACTOR_MODEL_REPOSITORY"]:
        env["TRITONACTOR_MODEL_REPOSITORY"] = str(example_repository())
    env["TRITONACTOR_JOURNAL"] = str(tmp_path / "journal.jsonl")
    env["TRITONACTOR_REPOSITORY_CACHE_DIR"] = str(tmp_path / "cache")
    return Settings.from_env(env)


def test_the_settings_are_ones_the_server_accepts(tmp_path: Path) -> None:
    settings = accepted_settings(settings_env(), tmp_path)
    (location,) = settings.model_repositories
    assert getattr(location, "scheme", None) == "s3", location
    with pytest.raises(SettingsError, match="TRITONACTOR_REPOSITORY_POL_SECS"):
        accepted_settings({**settings_env(), "TRITONACTOR_REPOSITORY_POL_SECS": "5"}, tmp_path)


def test_the_pod_is_restricted_and_writes_only_to_its_volumes() -> None:
    pod = deployment_file()["spec"]["template"]["spec"]
    assert restricted_problems(pod) == []
    assert writable_problems(pod, settings_env()) == []
    assert pod["automountServiceAccountToken"] is False


def test_probes_ask_the_server_health_endpoints_on_its_http_port() -> None:
    container = server_container(deployment_file()["spec"]["template"]["spec"])
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    settings = Settings()
    assert ports == {
        "http": settings.http_port,
        "grpc": settings.grpc_port,
        "metrics": settings.metrics_port,
    }
    expected = {
        "startupProbe": "/v2/health/live",
        "livenessProbe": "/v2/health/live",
        "readinessProbe": "/v2/health/ready",
    }
    for probe, path in expected.items():
        get = container[probe]["httpGet"]
        assert (get["path"], ports[get["port"]]) == (path, settings.http_port), probe
    # Slow loads: the startup probe waits several minutes before liveness may restart the pod.
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300


def test_the_grace_period_outlasts_the_drain_and_the_models_stop() -> None:
    """SIGTERM comes after preStop; the drain then takes up to the exit timeout, and stopping
    the models as long again (docs/shutdown.md): all within terminationGracePeriodSeconds."""
    pod = deployment_file()["spec"]["template"]["spec"]
    exit_timeout = int(settings_env()["TRITONACTOR_EXIT_TIMEOUT_SECS"])
    pre_stop = server_container(pod)["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    assert pod["terminationGracePeriodSeconds"] > int(pre_stop[1]) + 2 * exit_timeout


def test_the_service_and_selectors_reach_the_pods() -> None:
    deployment = deployment_file()
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    container = server_container(deployment["spec"]["template"]["spec"])
    container_ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    service = one(KUBE / "base" / "service.yaml", "Service")
    assert service["spec"]["selector"] == labels
    assert deployment["spec"]["selector"]["matchLabels"] == labels
    pdb = one(KUBE / "base" / "pdb.yaml", "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"] == labels
    for spread in deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]:
        assert spread["labelSelector"]["matchLabels"] == labels
    served = {
        p["name"]: (p["port"], container_ports[p["targetPort"]]) for p in service["spec"]["ports"]
    }
    assert served == {name: (port, port) for name, port in container_ports.items()}
    grpc = next(p for p in service["spec"]["ports"] if p["name"] == "grpc")
    assert grpc["appProtocol"] == "kubernetes.io/h2c"
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert int(annotations["prometheus.io/port"]) == container_ports["metrics"]


def test_the_s3_secret_gives_the_variables_the_store_reads() -> None:
    secret = one(KUBE / "s3-secret.example.yaml", "Secret")
    assert set(secret["stringData"]) == S3_KEYS
    sources = server_container(deployment_file()["spec"]["template"]["spec"])["envFrom"]
    refs = [source["secretRef"] for source in sources if "secretRef" in source]
    assert refs == [{"name": secret["metadata"]["name"], "optional": True}]


def test_the_servicemonitor_scrapes_the_metrics_port() -> None:
    monitor = one(KUBE / "components" / "servicemonitor" / "servicemonitor.yaml", "ServiceMonitor")
    service = one(KUBE / "base" / "service.yaml", "Service")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    (endpoint,) = monitor["spec"]["endpoints"]
    ports = {port["name"]: port["port"] for port in service["spec"]["ports"]}
    assert ports[endpoint["port"]] == Settings().metrics_port
    assert endpoint["path"] == "/metrics"


def test_the_hpa_scales_the_deployment_on_cpu() -> None:
    hpa = one(KUBE / "base" / "hpa.yaml", "HorizontalPodAutoscaler")
    deployment = deployment_file()
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"], target["name"]) == (
        deployment["apiVersion"],
        deployment["kind"],
        deployment["metadata"]["name"],
    )
    assert "replicas" not in deployment["spec"]  # the HPA owns the count
    assert hpa["spec"]["minReplicas"] >= 2
    (metric,) = hpa["spec"]["metrics"]
    assert metric["resource"]["name"] == "cpu"
    requests = server_container(deployment["spec"]["template"]["spec"])["resources"]["requests"]
    assert "cpu" in requests  # Utilization is a share of the request


def test_the_queue_time_variant_is_a_valid_hpa_on_the_adapter_metric() -> None:
    text = (KUBE / "base" / "hpa.yaml").read_text(encoding="utf-8")
    hpa = yaml.safe_load(
        uncomment_between(text, "BEGIN queue-time metric", "END queue-time metric")
    )
    assert validation_problems(hpa) == []
    pods_metric = next(m for m in hpa["spec"]["metrics"] if m["type"] == "Pods")
    values = yaml.safe_load((KUBE / "prometheus-adapter-values.yaml").read_text())
    (rule,) = values["rules"]["custom"]
    assert pods_metric["pods"]["metric"]["name"] == rule["name"]["as"]
    assert "nv_inference_queue_duration_us" in rule["seriesQuery"]
    assert set(rule["resources"]["overrides"]) == {"namespace", "pod"}
    query = rule["metricsQuery"].replace("<<.GroupBy>>", "pod")
    query = query.replace("<<.LabelMatchers>>", 'namespace="x",pod="y"')
    assert "nv_inference_queue_duration_us" in query
    assert promql_problems(query) == []


def test_the_gpu_overlay_asks_for_a_gpu_and_the_base_does_not() -> None:
    patch = one(KUBE / "overlays" / "gpu" / "gpu.yaml", "Deployment")
    limits = server_container(patch["spec"]["template"]["spec"])["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "1"
    for path in [*(KUBE / "base").iterdir(), *(KUBE / "overlays" / "cpu").iterdir()]:
        assert "nvidia.com/gpu" not in path.read_text(encoding="utf-8"), path


# -- the image ---------------------------------------------------------------------------------


def documented_tag(extra: str | None) -> str:
    """The tag the Dockerfile's header builds for an extra (None: the default build)."""
    arg = rf"--build-arg EXTRA={extra} " if extra else ""
    match = re.search(rf"^#\s+docker build {arg}-t (\S+) \.", dockerfile(), re.MULTILINE)
    assert match, f"the Dockerfile does not document `docker build {arg}-t <tag> .`"
    return match.group(1)


def overlay_image(overlay: str) -> str:
    spec = documents(KUBE / "overlays" / overlay / "kustomization.yaml")[0]
    (image,) = spec["images"]
    base = server_container(deployment_file()["spec"]["template"]["spec"])["image"]
    assert base.split(":")[0] == image["name"]
    return f"{image.get('newName', image['name'])}:{image['newTag']}"


def test_the_manifests_name_the_image_the_dockerfile_and_compose_build() -> None:
    import tomllib

    assert documented_tag(None) == compose_image()
    assert overlay_image("cpu") == compose_image()
    assert overlay_image("gpu") == documented_tag("gpu")
    runtime = one(KUBE / "kserve" / "servingruntime.yaml", "ServingRuntime")
    assert runtime["spec"]["containers"][0]["image"] == compose_image()
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert {"cpu", "gpu", "s3"} <= set(extras)


# -- KServe ------------------------------------------------------------------------------------


def runtime_file() -> dict[str, Any]:
    return one(KUBE / "kserve" / "servingruntime.yaml", "ServingRuntime")


def test_the_serving_runtime_speaks_v2_on_kserve_ports(tmp_path: Path) -> None:
    spec = runtime_file()["spec"]
    assert set(spec["protocolVersions"]) == {"v2", "grpc-v2"}
    assert {fmt["name"] for fmt in spec["supportedModelFormats"]} == MODEL_FORMATS
    (container,) = spec["containers"]
    assert container["name"] == "kserve-container"
    env = {item["name"]: item["value"] for item in container["env"]}
    assert env["TRITONACTOR_MODEL_REPOSITORY"] == KSERVE_MODEL_DIR
    settings = Settings.from_env(
        {
            **env,
            "TRITONACTOR_MODEL_REPOSITORY": str(example_repository()),
            "TRITONACTOR_JOURNAL": str(tmp_path / "journal.jsonl"),
        }
    )
    assert (settings.http_port, settings.grpc_port) == (KSERVE_HTTP_PORT, KSERVE_GRPC_PORT)
    assert [port["containerPort"] for port in container["ports"]] == [KSERVE_HTTP_PORT]
    for probe, path in [
        ("startupProbe", "/v2/health/live"),
        ("livenessProbe", "/v2/health/live"),
        ("readinessProbe", "/v2/health/ready"),
    ]:
        assert container[probe]["httpGet"] == {"path": path, "port": KSERVE_HTTP_PORT}, probe
    assert spec["annotations"]["prometheus.kserve.io/port"] == str(settings.metrics_port)
    # The container and its volumes as a pod: the core schemas check what KServe copies over.
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "runtime"},
        "spec": {"containers": spec["containers"], "volumes": spec["volumes"]},
    }
    assert validation_problems(pod) == []
    context = container["securityContext"]
    assert context["runAsNonRoot"] is True and context["allowPrivilegeEscalation"] is False
    assert context["capabilities"]["drop"] == ["ALL"]


def test_the_inference_service_uses_the_runtime_and_its_credentials() -> None:
    runtime = runtime_file()
    service = one(KUBE / "kserve" / "inferenceservice.yaml", "InferenceService")
    assert service["apiVersion"] == "serving.kserve.io/v1beta1"
    predictor = service["spec"]["predictor"]
    model = predictor["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    formats = {(f["name"], f.get("version")) for f in runtime["spec"]["supportedModelFormats"]}
    wanted = (model["modelFormat"]["name"], model["modelFormat"].get("version"))
    assert wanted in formats or (wanted[1] is None and wanted[0] in {n for n, _ in formats})
    assert model["protocolVersion"] in runtime["spec"]["protocolVersions"]
    assert model["storageUri"].startswith("s3://")
    credentials = KUBE / "kserve" / "s3-credentials.yaml"
    account = one(credentials, "ServiceAccount")
    secret = one(credentials, "Secret")
    assert predictor["serviceAccountName"] == account["metadata"]["name"]
    assert account["secrets"] == [{"name": secret["metadata"]["name"]}]
    assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= set(secret["stringData"])
    # The drain and the models' stop fit the pod's grace period (Kubernetes' 30 s by default).
    env = {item["name"]: item["value"] for item in runtime["spec"]["containers"][0]["env"]}
    grace = predictor.get("terminationGracePeriodSeconds", KUBERNETES_DEFAULT_GRACE)
    exit_timeout = int(env["TRITONACTOR_EXIT_TIMEOUT_SECS"])
    assert 2 * exit_timeout < min(grace, KUBERNETES_DEFAULT_GRACE)


# -- kubectl kustomize ---------------------------------------------------------------------------


@needs_kubectl
@pytest.mark.parametrize("overlay", ["cpu", "gpu"])
def test_the_overlays_build_into_valid_objects(overlay: str) -> None:
    objs = kubectl_kustomize(KUBE / "overlays" / overlay)
    assert {obj["kind"] for obj in objs} == {
        "ServiceAccount",
        "ConfigMap",
        "Service",
        "Deployment",
        "PodDisruptionBudget",
        "HorizontalPodAutoscaler",
    }
    for obj in objs:
        assert validation_problems(obj) == [], obj["kind"]
    deployment = built(objs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = server_container(pod)
    configmap = built(objs, "ConfigMap")
    # The generated name (with its content hash) is the one the pods read.
    assert container["envFrom"][0]["configMapRef"]["name"] == configmap["metadata"]["name"]
    assert configmap["data"] == settings_env()
    assert restricted_problems(pod) == [] and writable_problems(pod, configmap["data"]) == []
    assert container["image"] == overlay_image(overlay)
    gpus = container["resources"]["limits"].get("nvidia.com/gpu")
    assert gpus == ("1" if overlay == "gpu" else None)
    if overlay == "gpu":
        assert any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert built(objs, "Service")["spec"]["selector"] == labels


@needs_kubectl
def test_the_kserve_folder_builds() -> None:
    objs = kubectl_kustomize(KUBE / "kserve")
    assert {obj["kind"] for obj in objs} == {
        "ServingRuntime",
        "InferenceService",
        "Secret",
        "ServiceAccount",
    }
    assert built(objs, "ServingRuntime")["spec"]["containers"][0]["image"] == compose_image()


def doc_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(encoding="utf-8"), re.DOTALL)


def doc_kustomize_paths() -> list[str]:
    """Every folder docs/kubernetes.md builds or applies with kustomize."""
    paths = []
    for block in doc_blocks("bash"):
        paths += re.findall(r"kubectl (?:kustomize|apply -k|delete -k) (\S+)", block)
    return paths


def test_the_doc_builds_what_exists() -> None:
    paths = doc_kustomize_paths()
    assert {"deploy/kubernetes/overlays/cpu", "deploy/kubernetes/overlays/gpu"} <= set(paths)
    for path in paths:
        assert (ROOT / path / "kustomization.yaml").is_file(), path


@needs_kubectl
@pytest.mark.parametrize("path", sorted(set(doc_kustomize_paths())))
def test_each_kustomize_command_of_the_doc_builds(path: str) -> None:
    assert kubectl_kustomize(ROOT / path)


def build_beside_the_overlays(tmp_path: Path, kustomization: str) -> list[dict[str, Any]]:
    """Build a kustomization written in a folder beside the overlays, in a copy of the tree."""
    tree = tmp_path / "kubernetes"
    shutil.copytree(KUBE, tree)
    folder = tree / "overlays" / "mine"
    folder.mkdir()
    (folder / "kustomization.yaml").write_text(kustomization)
    return kubectl_kustomize(folder)


def check_components(objs: list[dict[str, Any]], components: list[str], tmp_path: Path) -> None:
    """The built objects are valid, the server accepts their settings, and each component did
    its part."""
    for obj in objs:
        if not obj["apiVersion"].startswith(CRD_GROUPS):
            assert validation_problems(obj) == [], obj["kind"]
    configmap = built(objs, "ConfigMap")
    accepted_settings(configmap["data"], tmp_path)
    pod = built(objs, "Deployment")["spec"]["template"]["spec"]
    assert writable_problems(pod, configmap["data"]) == []
    reads = server_container(pod)["envFrom"][0]["configMapRef"]["name"]
    assert reads == configmap["metadata"]["name"]
    repository = configmap["data"]["TRITONACTOR_MODEL_REPOSITORY"]
    mounts = {m["mountPath"]: m for m in server_container(pod)["volumeMounts"]}
    if "servicemonitor" in components:
        monitor = built(objs, "ServiceMonitor")
        labels = built(objs, "Service")["metadata"]["labels"]
        assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    if "volume-repository" in components:
        assert repository == "/models"
        assert mounts["/models"]["readOnly"] is True
        claim = built(objs, "PersistentVolumeClaim")["metadata"]["name"]
        volume = next(v for v in pod["volumes"] if v["name"] == mounts["/models"]["name"])
        assert volume["persistentVolumeClaim"]["claimName"] == claim
    if "example-models" in components:
        # The image's bundled examples (Dockerfile: COPY ... /models), no volume over them.
        assert repository == "/models" and "/models" not in mounts
        assert re.search(r"^COPY .*tritonactor/examples/models /models$", dockerfile(), re.M)


@needs_kubectl
@pytest.mark.parametrize("component", sorted(p.name for p in (KUBE / "components").iterdir()))
def test_each_component_builds_on_the_cpu_overlay(component: str, tmp_path: Path) -> None:
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": ["../cpu"],
        "components": [f"../../components/{component}"],
    }
    objs = build_beside_the_overlays(tmp_path, yaml.safe_dump(kustomization))
    check_components(objs, [component], tmp_path)


@needs_kubectl
@pytest.mark.parametrize("index", range(len(doc_blocks("yaml"))))
def test_the_docs_own_overlays_build(index: int, tmp_path: Path) -> None:
    """Each kustomization docs/kubernetes.md shows, written where it says (a folder beside the
    overlays): it builds, its components do their part, its settings reach the ConfigMap."""
    block = doc_blocks("yaml")[index]
    spec = yaml.safe_load(block)
    assert spec["kind"] == "Kustomization"
    objs = build_beside_the_overlays(tmp_path, block)
    check_components(objs, [Path(path).name for path in spec.get("components", [])], tmp_path)
    data = built(objs, "ConfigMap")["data"]
    for generator in spec.get("configMapGenerator", []):
        for literal in generator["literals"]:
            name, _, value = literal.partition("=")
            assert data[name] == value
