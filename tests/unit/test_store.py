"""Object-store repositories below the server: Triton's URL forms, the local mirror against a
real S3-compatible server (moto, in its own process), and poll mode's settle rule.
tests/e2e/test_object_store_e2e.py serves such repositories end to end."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.s3_server import CREDENTIALS, S3Server, s3_server  # noqa: F401 (a fixture)
from tests.server_process import free_port
from tritonactor.settings import Settings, SettingsError
from tritonactor.settings.model import OPTIONS
from tritonactor.store import mirror as mirror_module
from tritonactor.store.location import StoreLocation, parse_location
from tritonactor.store.mirror import StoreMirror, model_listing, open_mirrors
from tritonactor.store.remote import ObjectInfo, StoreError, download
from tritonactor.store.syncer import StoreSyncer

pytestmark = pytest.mark.timeout(120)

CONFIG = b'name: "m"\nbackend: "python"\n'


# -- URLs ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected", "shown"),
    [
        ("s3://bucket/path/to/repo", StoreLocation("s3", "bucket", "path/to/repo"), None),
        ("s3://bucket", StoreLocation("s3", "bucket"), None),
        ("s3://bucket//a///b/", StoreLocation("s3", "bucket", "a/b"), "s3://bucket/a/b"),
        (
            "s3://localhost:9000/models/repo",
            StoreLocation("s3", "models", "repo", "http://localhost:9000"),
            None,
        ),
        (
            "s3://https://minio.example.com:443/models",
            StoreLocation("s3", "models", "", "https://minio.example.com:443"),
            None,
        ),
        (
            "s3://http://10.0.0.5:9000/models/a",
            StoreLocation("s3", "models", "a", "http://10.0.0.5:9000"),
            "s3://10.0.0.5:9000/models/a",
        ),
        ("gs://bucket/repo", StoreLocation("gs", "bucket", "repo"), None),
        (
            "as://account/container/repo",
            StoreLocation("as", "container", "repo", account="account"),
            None,
        ),
    ],
)
def test_triton_url_forms(url: str, expected: StoreLocation, shown: str | None) -> None:
    location = parse_location(url)
    assert location == expected
    assert str(location) == (shown or url)
    assert parse_location(str(location)) == location


@pytest.mark.parametrize(
    ("url", "rule"),
    [
        ("ftp://host/path", "the object stores read are s3://, gs://, as://"),
        ("s3://", "names no bucket"),
        ("s3://bad*name/x", "a bucket name is letters, digits"),
        ("s3://bucket/a/../b", "'.' or '..'"),
        ("as://account", "expected as://account/container/path"),
    ],
)
def test_a_bad_url_is_refused_with_the_rule(url: str, rule: str) -> None:
    with pytest.raises(ValueError, match=rule.replace("(", r"\(").replace(".", r"\.")):
        parse_location(url)


def test_settings_read_urls_beside_folders(tmp_path: Path) -> None:
    settings = Settings(model_repositories=f"s3://bucket/repo,{tmp_path}")
    assert settings.store_repositories() == (StoreLocation("s3", "bucket", "repo"),)
    assert settings.local_repositories() == (tmp_path,)
    kind = OPTIONS["model_repositories"].kind
    assert kind.parse(kind.format(settings.model_repositories)) == settings.model_repositories
    twice = Settings(model_repositories=f"s3://bucket/repo,{tmp_path},s3://bucket/repo/")
    assert twice.store_repositories() == (StoreLocation("s3", "bucket", "repo"),)
    assert twice.local_repositories() == (tmp_path,)
    with pytest.raises(SettingsError, match="TRITONACTOR_MODEL_REPOSITORY='gcs://b/x'"):
        Settings(model_repositories="gcs://b/x")


def test_the_cache_may_not_overlap_a_local_repository(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    local = tmp_path / "models"
    local.mkdir()
    for cache in (local / "cache", tmp_path):
        with pytest.raises(SettingsError, match="overlaps model repository"):
            Settings(
                model_repositories=f"{local},s3://bucket/repo", repository_cache_dir=str(cache)
            )
    Settings(model_repositories=str(local), repository_cache_dir=str(local / "cache"))  # no store
    monkeypatch.setenv("TRITON_CLOUD_CREDENTIAL_PATH", str(tmp_path / "cred.json"))
    settings = Settings(
        model_repositories="s3://bucket/repo", repository_cache_dir=str(tmp_path / "c")
    )
    assert any("TRITON_CLOUD_CREDENTIAL_PATH is set and not read" in w for w in settings.warnings())


def test_the_cache_defaults_to_tritons_mount_directory_when_set(tmp_path: Path) -> None:
    from tritonactor.settings.common import default_repository_cache

    mount = str(tmp_path / "mount")
    assert default_repository_cache({"TRITON_AWS_MOUNT_DIRECTORY": mount}) == Path(mount)
    assert default_repository_cache({"XDG_CACHE_HOME": "/c", "HOME": "/h"}) == Path(
        "/c/tritonactor/repositories"
    )
    assert default_repository_cache({"HOME": "/h"}) == Path("/h/.cache/tritonactor/repositories")


def test_listing_groups_objects_by_model_and_keeps_keys_inside_their_folder() -> None:
    info = ObjectInfo("e", 1, "t")
    listing, skipped = model_listing(
        {
            "README.md": info,
            "a/config.pbtxt": info,
            "a/1/model.py": info,
            "ens/1/": info,
            ".hidden/config.pbtxt": info,
            "evil/../../../etc/x": info,
            "b//config.pbtxt": info,
        }
    )
    assert listing == {"a": {"config.pbtxt": info, "1/model.py": info}, "ens": {"1/": info}}
    assert len(skipped) == 2 and all("'.' or '..'" in reason for reason in skipped)


# -- the mirror, against a real store ------------------------------------------------------------


@pytest.fixture
def store(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> tuple[S3Server, str]:  # noqa: F811
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    return s3_server, s3_server.new_bucket()


def _location(store: tuple[S3Server, str]) -> StoreLocation:
    server, bucket = store
    return parse_location(f"s3://{server.address}/{bucket}/repo")


@pytest.fixture
def downloads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every key the mirrors download, in order."""
    seen: list[str] = []

    def recording(filesystem: Any, location: Any, keys: Any, targets: Any) -> None:
        seen.extend(keys)
        download(filesystem, location, keys, targets)

    monkeypatch.setattr(mirror_module, "download", recording)
    return seen


def test_the_mirror_copies_the_store_and_then_only_what_changed(
    store: tuple[S3Server, str], tmp_path: Path, downloads: list[str]
) -> None:
    server, bucket = store
    server.put_objects(
        bucket,
        {
            "repo/m/config.pbtxt": CONFIG,
            "repo/m/1/model.py": b"one",
            "repo/ens/1/": b"",
            "repo/notes.txt": b"not a model",
        },
    )
    with StoreMirror(_location(store), tmp_path) as mirror:
        assert mirror.sync(mirror.listing()).done == ["ens", "m"]
        root = mirror.root
        assert (root / "m" / "1" / "model.py").read_bytes() == b"one"
        assert (root / "ens" / "1").is_dir() and not any((root / "ens" / "1").iterdir())
        assert not (root / "notes.txt").exists()
        assert sorted(downloads) == ["m/1/model.py", "m/config.pbtxt"]

        downloads.clear()
        assert mirror.sync(mirror.listing()).done == []  # nothing changed: nothing copied
        server.put(bucket, "repo/m/1/model.py", b"two")
        assert mirror.sync(mirror.listing()).done == ["m"]
        assert (root / "m" / "1" / "model.py").read_bytes() == b"two"
        assert downloads == ["m/1/model.py"]  # the unchanged config was copied locally
        assert (root / "m" / "config.pbtxt").read_bytes() == CONFIG

        server.delete(bucket, "repo/ens/1/")
        assert mirror.sync(mirror.listing()).done == ["ens"]
        assert not (root / "ens").exists()


def test_a_file_written_in_the_copy_is_downloaded_again(
    store: tuple[S3Server, str], tmp_path: Path, downloads: list[str]
) -> None:
    server, bucket = store
    server.put_objects(bucket, {"repo/m/config.pbtxt": CONFIG, "repo/m/w.bin": b"AAAA"})
    with StoreMirror(_location(store), tmp_path) as mirror:
        mirror.sync(mirror.listing())
        old = mirror.root / "m" / "w.bin"
        # A model writing into its own folder, in place, the same size.
        with old.open("r+b") as handle:
            handle.write(b"BBBB")
        downloads.clear()
        server.put(bucket, "repo/m/config.pbtxt", CONFIG + b"# edited\n")
        assert mirror.sync(mirror.listing()).done == ["m"]
        assert sorted(downloads) == ["m/config.pbtxt", "m/w.bin"]
        assert (mirror.root / "m" / "w.bin").read_bytes() == b"AAAA"
        with (mirror.root / "m" / "w.bin").open("r+b") as handle:
            handle.write(b"CCCC")
    with StoreMirror(_location(store), tmp_path) as mirror:  # and after a restart
        assert mirror.sync(mirror.listing()).done == ["m"]
        assert (mirror.root / "m" / "w.bin").read_bytes() == b"AAAA"


def test_a_restart_downloads_only_what_changed_meanwhile(
    store: tuple[S3Server, str], tmp_path: Path, downloads: list[str]
) -> None:
    server, bucket = store
    server.put_objects(bucket, {"repo/m/config.pbtxt": CONFIG, "repo/k/config.pbtxt": CONFIG})
    with StoreMirror(_location(store), tmp_path) as mirror:
        mirror.sync(mirror.listing())
    server.put(bucket, "repo/m/config.pbtxt", CONFIG + b"# edited\n")
    (tmp_path / "stray").mkdir()  # not the mirror's: left alone
    downloads.clear()
    with StoreMirror(_location(store), tmp_path) as mirror:
        assert mirror.sync(mirror.listing()).done == ["m"]
        assert downloads == ["m/config.pbtxt"]
        assert (mirror.root / "m" / "config.pbtxt").read_bytes().endswith(b"# edited\n")
    assert (tmp_path / "stray").is_dir()


def test_a_damaged_cache_is_copied_anew(store: tuple[S3Server, str], tmp_path: Path) -> None:
    server, bucket = store
    server.put_objects(bucket, {"repo/m/config.pbtxt": CONFIG, "repo/m/1/model.py": b"x" * 10})
    with StoreMirror(_location(store), tmp_path) as mirror:
        mirror.sync(mirror.listing())
        folder = mirror.folder
        (mirror.root / "m" / "1" / "model.py").write_bytes(b"short")  # truncated by a crash
        (mirror.root / "leftover").mkdir()
    with StoreMirror(_location(store), tmp_path) as mirror:
        assert not (mirror.root / "leftover").exists()
        assert mirror.sync(mirror.listing()).done == ["m"]
        assert (mirror.root / "m" / "1" / "model.py").read_bytes() == b"x" * 10
    (folder / "manifest.json").write_text("{not json")
    with StoreMirror(_location(store), tmp_path) as mirror:
        assert mirror.sync(mirror.listing()).done == ["m"]
        assert json.loads((folder / "manifest.json").read_text())["models"].keys() == {"m"}


def test_a_model_that_cannot_be_copied_fails_alone(
    store: tuple[S3Server, str], tmp_path: Path
) -> None:
    server, bucket = store
    server.put_objects(
        bucket,
        {
            # "1" both a file and a folder: the copy cannot be made.
            "repo/aa/config.pbtxt": CONFIG,
            "repo/aa/1": b"a file",
            "repo/aa/1/model.py": b"x",
            # A name no filesystem takes.
            f"repo/long/{'x' * 300}/f": b"x",
            # A folder marker over an object of the same name.
            "repo/mark/1/x": b"x",
            "repo/mark/1/x/": b"",
            "repo/zz/config.pbtxt": CONFIG,
        },
    )
    with StoreMirror(_location(store), tmp_path) as mirror:
        result = mirror.sync(mirror.listing())
        assert result.done == ["zz"]
        assert set(result.failed) == {"aa", "long", "mark"}
        assert "cannot copy 'aa': 'aa/1' is both an object and a folder" in result.failed["aa"]
        assert "cannot copy 'mark': 'mark/1/x' is both" in result.failed["mark"]
        assert "longer than a filesystem allows" in result.failed["long"]
        assert not (mirror.root / "aa").exists() and (mirror.root / "zz").is_dir()
        assert not any((mirror.folder / "staging").iterdir())
        # Not tried again (nor downloaded again) until its objects change, or a load asks.
        assert mirror.changed(mirror.listing()) == set() == mirror.new(mirror.listing())
        server.put(bucket, "repo/aa/config.pbtxt", CONFIG + b"# edited\n")
        assert mirror.changed(mirror.listing()) == {"aa"} == mirror.new(mirror.listing())
        assert set(mirror.sync(mirror.listing(), ["long"]).failed) == {"long"}


def test_a_model_folder_is_replaced_in_one_step(
    store: tuple[S3Server, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exchanged: list[tuple[Path, Path, bool]] = []
    exchange = mirror_module._exchange

    def recording(first: Path, second: Path) -> bool:
        done = exchange(first, second)
        exchanged.append((first, second, done))
        return done

    monkeypatch.setattr(mirror_module, "_exchange", recording)
    server, bucket = store
    server.put(bucket, "repo/m/config.pbtxt", CONFIG)
    with StoreMirror(_location(store), tmp_path) as mirror:
        mirror.sync(mirror.listing())
        assert exchanged == []  # a new folder: renamed into place
        server.put(bucket, "repo/m/config.pbtxt", CONFIG + b"# edited\n")
        assert mirror.sync(mirror.listing()).done == ["m"]
        # Exchanged with the old folder in one step (this machine's filesystem can).
        assert exchanged == [(mirror.folder / "staging" / "m", mirror.root / "m", True)]
        assert (mirror.root / "m" / "config.pbtxt").read_bytes().endswith(b"# edited\n")


def test_a_copy_written_to_is_made_again_when_its_model_is_synced(
    store: tuple[S3Server, str], tmp_path: Path
) -> None:
    server, bucket = store
    server.put(bucket, "repo/m/1/model.py", b"K = 1")
    with StoreMirror(_location(store), tmp_path) as mirror:
        mirror.sync(mirror.listing())
        (mirror.root / "m" / "1" / "model.py").write_bytes(b"K = 9")
        # The store did not change: a sync that names it (an explicit load) copies it anew.
        assert mirror.sync(mirror.listing(), ["m"]).done == ["m"]
        assert (mirror.root / "m" / "1" / "model.py").read_bytes() == b"K = 1"


def test_one_server_at_a_time_uses_a_mirror(store: tuple[S3Server, str], tmp_path: Path) -> None:
    with (
        StoreMirror(_location(store), tmp_path),
        pytest.raises(StoreError, match="is in use by another server"),
    ):
        StoreMirror(_location(store), tmp_path).open()
    with StoreMirror(_location(store), tmp_path):  # released by the first one's close
        pass


def test_a_missing_bucket_is_an_error_naming_it(
    store: tuple[S3Server, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, _ = store
    location = parse_location(f"s3://{server.address}/no-such-bucket/repo")
    with pytest.raises(StoreError, match="the bucket 'no-such-bucket' does not exist"):
        open_mirrors([tmp_path, location], tmp_path / "cache")
    # The mirror opened for it was closed again: another open succeeds.
    StoreMirror(location, tmp_path / "cache").open()
    # Without credentials the store says so: not taken for a missing bucket.
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    with pytest.raises(StoreError, match="cannot list the objects: Unable to locate credentials"):
        open_mirrors([location], tmp_path / "cache2")


def test_open_mirrors_keeps_the_order_and_the_local_folders(
    store: tuple[S3Server, str], tmp_path: Path
) -> None:
    server, bucket = store
    server.put(bucket, "repo/m/config.pbtxt", CONFIG)
    local = tmp_path / "local"
    local.mkdir()
    paths, mirrors = open_mirrors([local, _location(store)], tmp_path / "cache")
    try:
        assert paths == (local, mirrors[0].root)
        assert os.listdir(mirrors[0].root) == ["m"]
    finally:
        for mirror in mirrors:
            mirror.close()


# -- poll mode's settle rule -----------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_model_is_copied_once_two_polls_agree_on_its_objects(
    store: tuple[S3Server, str], tmp_path: Path
) -> None:
    server, bucket = store
    server.put(bucket, "repo/old/config.pbtxt", CONFIG)
    mirror = StoreMirror(_location(store), tmp_path)
    with mirror:
        mirror.sync(mirror.listing())
        syncer = StoreSyncer([mirror])
        server.put(bucket, "repo/new/config.pbtxt", CONFIG)
        assert await syncer.poll() == []  # first seen
        server.put(bucket, "repo/new/1/model.py", b"still uploading")
        assert await syncer.poll() == []  # changed since: still changing
        assert not (mirror.root / "new").exists()
        assert await syncer.poll() == [f"{mirror}/new"]  # two polls agree
        assert (mirror.root / "new" / "1" / "model.py").exists()

        server.delete(bucket, "repo/old/config.pbtxt")
        assert await syncer.poll() == []
        assert (mirror.root / "old").exists()
        assert await syncer.poll() == [f"{mirror}/old"]
        assert not (mirror.root / "old").exists()

        # A change undone before it settled is forgotten: made again, it waits for two polls
        # again rather than being taken for the one seen before.
        server.put(bucket, "repo/new/extra.txt", b"x")
        assert await syncer.poll() == []
        server.delete(bucket, "repo/new/extra.txt")
        assert await syncer.poll() == []
        server.put(bucket, "repo/new/extra.txt", b"x")
        assert await syncer.poll() == []
        assert not (mirror.root / "new" / "extra.txt").exists()
        assert await syncer.poll() == [f"{mirror}/new"]


@pytest.mark.anyio
async def test_a_settled_model_that_cannot_be_copied_is_tried_again(
    store: tuple[S3Server, str], tmp_path: Path
) -> None:
    server, bucket = store
    server.put_objects(
        bucket,
        {"repo/aa/config.pbtxt": CONFIG, "repo/aa/1": b"a file", "repo/aa/1/model.py": b"x"},
    )
    server.put(bucket, "repo/zz/config.pbtxt", CONFIG)
    with StoreMirror(_location(store), tmp_path) as mirror:
        syncer = StoreSyncer([mirror])
        assert await syncer.poll() == []
        assert await syncer.poll() == [f"{mirror}/zz"]  # aa failed, zz did not wait for it
        server.delete(bucket, "repo/aa/1")  # mended
        assert await syncer.poll() == []  # changed since: settles again
        assert await syncer.poll() == [f"{mirror}/aa"]
        assert (mirror.root / "aa" / "1" / "model.py").exists()


@pytest.mark.anyio
async def test_a_load_refreshes_its_model_and_new_steps_and_the_index_new_and_gone_ones(
    store: tuple[S3Server, str], tmp_path: Path
) -> None:
    server, bucket = store
    ensemble = (
        b'name: "ens"\nplatform: "ensemble"\nensemble_scheduling { step [ '
        b'{ model_name: "step" model_version: -1 }, { model_name: "fresh" model_version: -1 } ] }\n'
    )
    server.put_objects(
        bucket,
        {
            "repo/ens/config.pbtxt": ensemble,
            "repo/step/config.pbtxt": CONFIG,
            "repo/other/config.pbtxt": CONFIG,
            "repo/loaded/config.pbtxt": CONFIG,
        },
    )
    with StoreMirror(_location(store), tmp_path) as mirror:
        mirror.sync(mirror.listing())
        syncer = StoreSyncer([mirror])
        for name in ("step", "other"):
            server.put(bucket, f"repo/{name}/config.pbtxt", CONFIG + b"# v2\n")
        server.put(bucket, "repo/ens/config.pbtxt", ensemble + b"# v2\n")
        server.put(bucket, "repo/fresh/config.pbtxt", CONFIG)
        server.put(bucket, "repo/added/config.pbtxt", CONFIG)
        await syncer._refresh("ens")
        assert (mirror.root / "ens" / "config.pbtxt").read_bytes().endswith(b"# v2\n")
        assert (mirror.root / "fresh").is_dir()  # a step with no copy yet
        # A step with a copy may serve (the manager does not reload serving steps), and a
        # model the load does not name: both left as they were loaded.
        for name in ("step", "other"):
            assert not (mirror.root / name / "config.pbtxt").read_bytes().endswith(b"# v2\n")
        assert not (mirror.root / "added").exists()

        server.delete(bucket, "repo/other/config.pbtxt")
        server.delete(bucket, "repo/loaded/config.pbtxt")
        await syncer._refresh_new(frozenset({"loaded"}))
        assert (mirror.root / "added").is_dir()
        assert not (mirror.root / "other").exists()  # gone from the store, not loaded
        assert (mirror.root / "loaded").is_dir()  # gone too, but loaded: kept
        assert not (mirror.root / "step" / "config.pbtxt").read_bytes().endswith(b"# v2\n")


def test_an_unreachable_store_is_not_called_a_missing_bucket(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    location = parse_location(f"s3://127.0.0.1:{free_port()}/bucket/repo")  # nobody listens
    with pytest.raises(StoreError, match="cannot list the objects: Could not connect"):
        open_mirrors([location], tmp_path)


@pytest.mark.anyio
async def test_a_store_that_cannot_be_read_changes_nothing(
    s3_server: S3Server,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    bucket = s3_server.new_bucket()
    s3_server.put(bucket, "repo/m/config.pbtxt", CONFIG)
    location = parse_location(f"s3://{s3_server.address}/{bucket}/repo")
    with StoreMirror(location, tmp_path) as mirror:
        mirror.sync(mirror.listing())
        for item in s3_server.client().list_objects_v2(Bucket=bucket)["Contents"]:
            s3_server.delete(bucket, item["Key"])
        s3_server.client().delete_bucket(Bucket=bucket)
        syncer = StoreSyncer([mirror])
        assert await syncer.poll() == []
        assert await syncer.poll() == []
        assert (mirror.root / "m" / "config.pbtxt").exists()  # not taken for removed
