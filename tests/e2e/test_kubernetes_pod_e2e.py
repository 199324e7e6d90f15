"""The server run as deploy/kubernetes/base/deployment.yaml runs it: `tritonactor serve` with the
container's flags and the ConfigMap's settings (base/settings.env), the pod's paths where they
exist here, the bundled examples in place of the bucket. Once as a plain process, asked the
probes the Deployment asks; once on a read-only root with only the pod's emptyDir volumes
writable (the pod's readOnlyRootFilesystem), where a user namespace allows it.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.server_process import free_port, loopback_env
from tests.test_kubernetes import ROOT, deployment_file, server_container, settings_env
from tritonactor.settings import example_repository

pytestmark = pytest.mark.e2e


def test_the_server_answers_the_probes_with_the_manifest_settings(tmp_path: Path) -> None:
    """`tritonactor serve` with the Deployment's flags and the ConfigMap's settings (the pod's
    paths moved under tmp_path, the bundled examples for the bucket): the startup, liveness
    and readiness paths answer 200 on the HTTP port, /metrics on the metrics port, and SIGTERM
    ends it cleanly within the grace period."""
    deployment = deployment_file()
    pod = deployment["spec"]["template"]["spec"]
    container = server_container(pod)
    ports = {"http": free_port(), "grpc": free_port(), "metrics": free_port()}
    env = loopback_env(tmp_path, ports["http"], ports["grpc"], ports["metrics"])
    env.update(settings_env())
    env["TRITONACTOR_MODEL_REPOSITORY"] = str(example_repository())
    env["TRITONACTOR_JOURNAL"] = str(tmp_path / "state" / "journal.jsonl")
    env["TRITONACTOR_REPOSITORY_CACHE_DIR"] = str(tmp_path / "cache")
    (tmp_path / "state").mkdir()
    command = [sys.executable, "-m", "tritonactor.cli", "serve", *container["args"]]
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{ports['http']}"
        startup = container["startupProbe"]["httpGet"]["path"]
        while True:  # as the startup probe does: ask until it answers
            assert process.poll() is None, log.read_text(errors="replace")
            try:
                if httpx.get(base + startup, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        for probe in ("livenessProbe", "readinessProbe"):
            path = container[probe]["httpGet"]["path"]
            assert httpx.get(base + path, timeout=10).status_code == 200, probe
        metrics = httpx.get(f"http://127.0.0.1:{ports['metrics']}/metrics", timeout=10)
        assert metrics.status_code == 200 and "nv_inference_count" in metrics.text
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            returncode = process.wait(timeout=pod["terminationGracePeriodSeconds"])
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise
    assert returncode == 0, log.read_text(errors="replace")


# The pod's filesystem, short of a container runtime: a mount namespace (unprivileged, through a
# user namespace) where every mount is read-only, and a fresh tmpfs stands for each emptyDir.
READ_ONLY_POD = r"""
set -u
for mount in $(awk '{print $2}' /proc/self/mounts); do
  case "$mount" in /proc|/proc/*|/sys|/sys/*|/dev|/dev/pts|/dev/mqueue) continue ;; esac
  mount -o remount,ro,bind "$mount" 2>/dev/null || true
done
for folder in $EMPTY_DIRS; do
  at="$folder"
  while [ ! -d "$at" ]; do at=$(dirname "$at"); done
  mount -t tmpfs tmpfs "$at" && mkdir -p "$folder" || exit 90
done
for folder in "$ROOT" "$VENV" "$HOME"; do
  if touch "$folder/.read-only-probe" 2>/dev/null; then echo "$folder is writable"; exit 91; fi
done
exec "$@"
"""


def user_namespaces_work() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True, timeout=30)
    return probe.returncode == 0


@pytest.mark.skipif(
    sys.platform != "linux" or not user_namespaces_work(),
    reason="needs `unshare -rm` (unprivileged user and mount namespaces)",
)
def test_the_server_serves_on_a_read_only_root_with_the_pods_volumes(tmp_path: Path) -> None:
    """readOnlyRootFilesystem with only the Deployment's emptyDir mounts writable: the server
    starts with the ConfigMap's settings, answers an inference and exits 0 on SIGTERM."""
    pod = deployment_file()["spec"]["template"]["spec"]
    container = server_container(pod)
    empty_dirs = [
        mount["mountPath"]
        for mount in container["volumeMounts"]
        if "emptyDir" in next(v for v in pod["volumes"] if v["name"] == mount["name"])
    ]
    http, grpc, metrics = free_port(), free_port(), free_port()
    # loopback_env's journal is replaced by the ConfigMap's, which must be on a volume.
    env = loopback_env(Path("/nonexistent"), http, grpc, metrics)
    env.update(settings_env())
    env.update(
        {
            "TRITONACTOR_MODEL_REPOSITORY": str(example_repository()),
            "PYTHONDONTWRITEBYTECODE": "1",
            "EMPTY_DIRS": " ".join(empty_dirs),
            "ROOT": str(ROOT),
            "VENV": sys.prefix,
            "HOME": str(Path.home()),
        }
    )
    command = [
        *("unshare", "-rm", "sh", "-c", READ_ONLY_POD, "pod"),
        *(sys.executable, "-m", "tritonactor.cli", "serve", *container["args"]),
    ]
    # The log file is opened out here: in there every folder of this machine is read-only.
    log_path = tmp_path / "server.log"
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(command, env=env, stdout=log_file, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{http}"
    try:
        while True:
            assert process.poll() is None, log_path.read_text(errors="replace")
            try:
                if httpx.get(f"{base}/v2/health/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        request = {
            "inputs": [
                {"name": name, "datatype": "INT32", "shape": [1, 16], "data": list(range(16))}
                for name in ("INPUT0", "INPUT1")
            ]
        }
        answer = httpx.post(f"{base}/v2/models/simple/infer", json=request, timeout=30)
        assert answer.status_code == 200, answer.text
        outputs = {out["name"]: out["data"] for out in answer.json()["outputs"]}
        assert outputs["OUTPUT0"] == [2 * i for i in range(16)]
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=pod["terminationGracePeriodSeconds"])
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise
    log = log_path.read_text(errors="replace")
    assert process.returncode == 0, log
    assert "Read-only file system" not in log, log
