"""Model repositories in object storage, end to end: a real S3-compatible server (moto's, in its
own process) on 127.0.0.1, filled with boto3 as a user uploads a repository, and the real
server reading it in each control mode, beside a local repository, with tritonclient over HTTP
and gRPC; `repository inspect` on a store; and the start refused with the reason."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import SIMPLE_CONFIG, write_config
from tests.onnx_models import add_sub_model
from tests.s3_server import CREDENTIALS, S3Server, s3_server  # noqa: F401 (a fixture)
from tests.server_process import (
    ServerProcess,
    free_port,
    loopback_env,
    start_serve,
    start_server,
    wait_for,
)

pytestmark = pytest.mark.timeout(180)

POLL = {"TRITONACTOR_MODEL_CONTROL_MODE": "poll", "TRITONACTOR_REPOSITORY_POLL_SECS": "0.3"}


def make_model(folder: Path, name: str, versions: tuple[int, ...] = (1,)) -> Path:
    for version in versions:
        add_sub_model(folder / str(version) / "model.onnx")
    write_config(folder, SIMPLE_CONFIG.format(name=name, max_batch_size=8))
    return folder


def upload_model(
    s3: S3Server, bucket: str, prefix: str, scratch: Path, name: str, **kwargs: object
) -> None:
    folder = make_model(scratch / "build" / prefix / name, name, **kwargs)  # type: ignore[arg-type]
    s3.upload(bucket, f"{prefix}/{name}", folder)


def infer(url: str, model: str, version: str = "") -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    with httpclient.InferenceServerClient(url) as client:
        inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(a)
        result = client.infer(model, inputs, model_version=version)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - a)


def index(server: ServerProcess) -> dict[tuple[str, str], dict[str, str]]:
    with httpclient.InferenceServerClient(server.url) as client:
        entries = client.get_model_repository_index()
    return {(entry["name"], entry.get("version", "")): entry for entry in entries}


def state(server: ServerProcess, name: str, version: str = "1") -> str:
    return index(server).get((name, version), {}).get("state", "")


def store_env(s3: S3Server, cache: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    return {**s3.env(), "TRITONACTOR_REPOSITORY_CACHE_DIR": str(cache), **(extra or {})}


@pytest.fixture
def bucket(s3_server: S3Server) -> str:  # noqa: F811
    return s3_server.new_bucket()


def test_a_store_repository_serves_beside_a_local_one(
    s3_server: S3Server,  # noqa: F811
    bucket: str,
    tmp_path: Path,
) -> None:
    upload_model(s3_server, bucket, "models", tmp_path, "remote_add_sub")
    s3_server.put(bucket, "models/README.md", b"not a model")
    local = tmp_path / "local"
    make_model(local / "local_add_sub", "local_add_sub")
    # s3://bucket/path, with the endpoint from AWS_ENDPOINT_URL (as for any S3-compatible store).
    server = start_server(
        [local, f"s3://{bucket}/models"], tmp_path, store_env(s3_server, tmp_path / "cache")
    )
    try:
        assert {name for name, _ in index(server)} == {"local_add_sub", "remote_add_sub"}
        infer(server.url, "remote_add_sub")
        infer(server.url, "local_add_sub")
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            config = client.get_model_config("remote_add_sub", as_json=True)["config"]
            assert config["max_batch_size"] == 8
    finally:
        server.stop()


def test_poll_mode_follows_the_store_and_waits_for_a_whole_model(
    s3_server: S3Server,  # noqa: F811
    bucket: str,
    tmp_path: Path,
) -> None:
    upload_model(s3_server, bucket, "repo", tmp_path, "steady")
    upload_model(s3_server, bucket, "repo", tmp_path, "changing")
    upload_model(s3_server, bucket, "repo", tmp_path, "doomed")
    # A model that cannot be copied ("1" both an object and a folder): left out, logged; the
    # others start.
    s3_server.put_objects(bucket, {"repo/conflict/1": b"x", "repo/conflict/1/model.onnx": b"x"})
    # Triton's form for a store at an address: s3://host:port/bucket/path.
    url = f"s3://{s3_server.address}/{bucket}/repo"
    env = {**CREDENTIALS, "TRITONACTOR_REPOSITORY_CACHE_DIR": str(tmp_path / "cache"), **POLL}
    server = start_server([url], tmp_path, env)
    try:
        assert state(server, "changing") == "READY"
        assert "cannot copy 'conflict'" in server.log()
        assert ("conflict", "") not in index(server)

        # A new version uploaded: served once it settles; the policy (latest 1) retires v1.
        upload_model(s3_server, bucket, "repo", tmp_path, "changing", versions=(2,))
        wait_for(lambda: state(server, "changing", "2") == "READY", timeout=60)
        infer(server.url, "changing", "2")

        # Half uploaded: a config whose model file is not there yet. It is tried once its
        # objects settle, fails with the reason, and the other models serve on.
        s3_server.put(
            bucket,
            "repo/late/config.pbtxt",
            SIMPLE_CONFIG.format(name="late", max_batch_size=8).encode(),
        )
        wait_for(lambda: ("late", "") in index(server), timeout=60)
        entry = index(server)[("late", "")]
        assert entry["state"] == "UNAVAILABLE" and "version" in entry["reason"], entry
        infer(server.url, "steady")
        # The rest of it arrives: it loads.
        make_model(tmp_path / "late", "late")
        s3_server.upload(bucket, "repo/late/1", tmp_path / "late" / "1")
        wait_for(lambda: state(server, "late") == "READY", timeout=60)
        infer(server.url, "late")

        # Removed from the store: unloaded.
        for item in s3_server.client().list_objects_v2(Bucket=bucket, Prefix="repo/doomed/")[
            "Contents"
        ]:
            s3_server.delete(bucket, item["Key"])
        wait_for(lambda: state(server, "doomed") != "READY", timeout=60)
        infer(server.url, "steady")
        assert "Traceback" not in server.log()
    finally:
        server.stop()


def test_explicit_mode_loads_what_the_store_holds_at_the_load(
    s3_server: S3Server,  # noqa: F811
    bucket: str,
    tmp_path: Path,
) -> None:
    upload_model(s3_server, bucket, "repo", tmp_path, "first")
    # As docs/object-store.md says it: `tritonactor serve` with two front-end processes, the
    # store read by the one engine.
    server = start_serve(
        tmp_path,
        s3_server.env(),
        "--workers",
        "2",
        "--model-repository",
        f"s3://{bucket}/repo",
        "--model-control-mode",
        "explicit",
        "--repository-cache-dir",
        str(tmp_path / "cache"),
    )
    try:
        with httpclient.InferenceServerClient(server.url) as client:
            assert not client.is_model_ready("first")
            # Uploaded after the start: the index and a load read the store again.
            upload_model(s3_server, bucket, "repo", tmp_path, "later")
            assert ("later", "") in index(server)
            client.load_model("later")
            infer(server.url, "later")
            # A new version in the store: the next load takes it, and only that load: the
            # copy of a loaded model does not change under it when another model loads.
            upload_model(s3_server, bucket, "repo", tmp_path, "later", versions=(2,))
            client.load_model("first")
            (copy,) = (tmp_path / "cache").glob("*/repository/later")
            assert not (copy / "2").exists()
            client.load_model("later")
            assert (copy / "2").is_dir()
            assert client.is_model_ready("later", "2")
            infer(server.url, "later", "2")
            # A model only half uploaded fails its load with the reason; nothing else changes.
            s3_server.put(
                bucket,
                "repo/half/config.pbtxt",
                SIMPLE_CONFIG.format(name="half", max_batch_size=8).encode(),
            )
            with pytest.raises(InferenceServerException, match="version"):
                client.load_model("half")
            # One that cannot be copied fails its own load with why; the others load.
            s3_server.put_objects(
                bucket, {"repo/conflict/1": b"x", "repo/conflict/1/model.onnx": b"x"}
            )
            with pytest.raises(InferenceServerException, match="cannot copy 'conflict'"):
                client.load_model("conflict")
            client.load_model("first")
            assert client.is_model_ready("later", "2")
            client.unload_model("later")
            assert not client.is_model_ready("later", "2")
    finally:
        server.stop()


def test_repository_inspect_reads_a_store(
    s3_server: S3Server,  # noqa: F811
    bucket: str,
    tmp_path: Path,
) -> None:
    upload_model(s3_server, bucket, "repo", tmp_path, "inspected", versions=(1, 2))
    url = f"s3://{s3_server.address}/{bucket}/repo"
    done = subprocess.run(
        [sys.executable, "-m", "tritonactor.cli", "repository", "inspect", "--json", url],
        capture_output=True,
        text=True,
        env={**s3_server.env(), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["repositories"] == [url]
    (model,) = report["models"]
    assert model["name"] == "inspected" and model["path"] == f"{url}/inspected"
    assert [v["version"] for v in model["versions"]] == [1, 2]
    assert model["total_bytes"] > 0

    missing = subprocess.run(
        [
            sys.executable,
            "-m",
            "tritonactor.cli",
            "repository",
            "inspect",
            f"s3://{s3_server.address}/no-such-bucket",
        ],
        capture_output=True,
        text=True,
        env={**s3_server.env(), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        timeout=120,
    )
    assert missing.returncode == 2
    assert "the bucket 'no-such-bucket' does not exist" in missing.stderr


def test_a_store_that_cannot_be_read_stops_the_start(
    s3_server: S3Server,  # noqa: F811
    tmp_path: Path,
) -> None:
    env = store_env(s3_server, tmp_path / "cache")
    with pytest.raises(RuntimeError, match="the bucket 'no-such-bucket' does not exist"):
        start_server(["s3://no-such-bucket/repo"], tmp_path, env)
    # `tritonactor serve` says why in one line, and exits 1.
    http_port = free_port()
    serve = [sys.executable, "-m", "tritonactor.cli", "serve"]
    done = subprocess.run(
        [*serve, "--model-repository", "s3://no-such-bucket/repo"],
        env={**loopback_env(tmp_path, http_port, free_port(), free_port()), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == (
        "tritonactor serve: error: s3://no-such-bucket/repo: the bucket 'no-such-bucket' "
        "does not exist"
    )
    assert "Traceback" not in done.stderr


def test_a_bad_url_is_refused_before_anything_starts(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tritonactor.cli", "serve", "--model-repository", "ftp://host/repo"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "names the scheme 'ftp://'" in done.stderr
