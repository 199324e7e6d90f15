"""A real S3-compatible server on 127.0.0.1 for the tests: moto's standalone server, in its own
process, and boto3 to fill its buckets as a user would upload a model repository."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server_process import free_port

# moto takes any credentials; the server and boto3 must still find some, as with a real store.
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "tritonactor-test",
    "AWS_SECRET_ACCESS_KEY": "tritonactor-test-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@dataclass
class S3Server:
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def address(self) -> str:
        """host:port, as Triton's `s3://host:port/bucket/path` names it."""
        return f"127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """What a server reading `s3://bucket/path` from this store needs in its environment."""
        return {**CREDENTIALS, "AWS_ENDPOINT_URL": self.endpoint}

    def client(self) -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            region_name=CREDENTIALS["AWS_DEFAULT_REGION"],
        )

    def new_bucket(self) -> str:
        """A bucket of its own for one test."""
        name = f"t-{uuid.uuid4().hex[:16]}"
        self.client().create_bucket(Bucket=name)
        return name

    def upload(self, bucket: str, prefix: str, folder: Path) -> None:
        """Every file under `folder` to `s3://bucket/prefix/<relative path>`; an empty folder
        (an ensemble's version folder) as a folder marker, as S3 tools keep one."""
        client = self.client()
        for path in sorted(folder.rglob("*")):
            key = f"{prefix}/{path.relative_to(folder).as_posix()}"
            if path.is_file():
                client.upload_file(str(path), bucket, key)
            elif path.is_dir() and not any(path.iterdir()):
                client.put_object(Bucket=bucket, Key=key + "/", Body=b"")

    def put(self, bucket: str, key: str, body: bytes) -> None:
        self.client().put_object(Bucket=bucket, Key=key, Body=body)

    def put_objects(self, bucket: str, objects: Mapping[str, bytes]) -> None:
        for key, body in objects.items():
            self.put(bucket, key, body)

    def delete(self, bucket: str, key: str) -> None:
        self.client().delete_object(Bucket=bucket, Key=key)


def start_s3_server(log_dir: Path, timeout: float = 60) -> S3Server:
    port = free_port()
    log_path = log_dir / f"moto-{port}.log"
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    server = S3Server(process, port, log_path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"moto exited with {process.returncode}: {log_path.read_text()}")
        try:
            httpx.get(server.endpoint, timeout=1)
            return server
        except httpx.HTTPError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"moto did not answer on {server.endpoint}")


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    pytest.importorskip("moto.server", reason="moto[server] is in the test extras")
    server = start_s3_server(tmp_path_factory.mktemp("s3"))
    yield server
    server.process.terminate()
    server.process.wait(15)
