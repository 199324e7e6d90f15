from __future__ import annotations

import os
from pathlib import Path

import pytest

from tritonactor._proto.inference import (
    ModelConfig,
    ModelVersionPolicy,
    ModelVersionPolicyAll,
    ModelVersionPolicyLatest,
    ModelVersionPolicySpecific,
)
from tritonactor.config.model_config import parse_pbtxt
from tritonactor.control.repository import (
    RepositoryError,
    VersionSelection,
    config_digest,
    folder_signature,
    model_file_path,
    scan_repositories,
    select_versions,
)


def make_model(
    repository: Path, name: str, config: str | None = "", versions: tuple[str, ...] = ("1",)
) -> Path:
    folder = repository / name
    folder.mkdir(parents=True)
    if config is not None:
        (folder / "config.pbtxt").write_text(config)
    for version in versions:
        (folder / version).mkdir()
    return folder


# --- scan ------------------------------------------------------------------------------------


def test_scan_finds_models_in_every_repository(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    make_model(first, "alpha", 'name: "alpha"\nmax_batch_size: 8\n')
    make_model(second, "beta", 'backend: "onnxruntime"\n', versions=("2", "1"))

    found = scan_repositories([first, second])

    assert list(found) == ["alpha", "beta"]
    alpha, beta = found["alpha"], found["beta"]
    assert alpha.repository == first and alpha.path == first / "alpha"
    assert alpha.config is not None and alpha.config.max_batch_size == 8
    assert alpha.has_config_file and alpha.error is None
    assert beta.repository == second
    assert beta.versions == (1, 2)
    # An empty name in config.pbtxt takes the folder's.
    assert beta.config is not None and beta.config.name == "beta"
    assert beta.config.backend == "onnxruntime"


def test_empty_repository_has_no_models(tmp_path: Path) -> None:
    assert scan_repositories([tmp_path]) == {}


def test_duplicate_across_repositories_is_an_error(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    make_model(first, "dup")
    make_model(second, "dup")
    make_model(second, "only")

    found = scan_repositories([first, second])

    dup = found["dup"]
    assert dup.error == "model appears in two or more repositories"  # Triton's words
    assert dup.repository == first and dup.path == first / "dup"
    assert dup.config is None
    assert found["only"].error is None


def test_same_repository_given_twice_is_not_a_duplicate(tmp_path: Path) -> None:
    make_model(tmp_path, "m")
    found = scan_repositories([tmp_path, tmp_path / "." / ""])
    assert found["m"].error is None


def test_version_folders_numeric_without_leading_zero(tmp_path: Path) -> None:
    folder = make_model(
        tmp_path, "m", versions=("0", "3", "10", "01", "007", "abc", "1a", "-1", "٣", "99" * 20)
    )
    (folder / "5").write_text("a file named like a version is not a version")
    assert scan_repositories([tmp_path])["m"].versions == (0, 3, 10)


def test_dot_folders_and_stray_files_are_ignored(tmp_path: Path) -> None:
    make_model(tmp_path, "m")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".hidden_model").mkdir()
    (tmp_path / "README.md").write_text("not a model")
    assert list(scan_repositories([tmp_path])) == ["m"]


def test_symlinked_model_folder_is_a_model(tmp_path: Path) -> None:
    elsewhere = make_model(tmp_path / "elsewhere", "real")
    repository = tmp_path / "repo"
    repository.mkdir()
    (repository / "real").symlink_to(elsewhere, target_is_directory=True)
    assert scan_repositories([repository])["real"].versions == (1,)


def test_name_mismatch_is_an_error(tmp_path: Path) -> None:
    make_model(tmp_path, "folder", 'name: "other"\n')
    source = scan_repositories([tmp_path])["folder"]
    assert source.config is None
    assert source.error is not None
    assert "'other'" in source.error and "'folder'" in source.error
    assert str(tmp_path / "folder" / "config.pbtxt") in source.error
    assert "directory name must equal model name" in source.error  # Triton's words


def test_missing_config_gives_a_named_config(tmp_path: Path) -> None:
    make_model(tmp_path, "bare", config=None, versions=("1", "2"))
    source = scan_repositories([tmp_path])["bare"]
    assert not source.has_config_file
    assert source.error is None
    assert source.config == ModelConfig(name="bare")
    assert source.versions == (1, 2)


def test_parse_error_names_file_line_and_column(tmp_path: Path) -> None:
    make_model(tmp_path, "broken", 'name: "broken"\nmax_batch_size: "eight"\n')
    source = scan_repositories([tmp_path])["broken"]
    assert source.config is None and source.has_config_file
    assert source.error is not None
    assert f"{tmp_path / 'broken' / 'config.pbtxt'}:2:" in source.error
    assert source.versions == (1,)


def test_one_bad_model_does_not_hide_the_others(tmp_path: Path) -> None:
    make_model(tmp_path, "bad", "this is not pbtxt")
    make_model(tmp_path, "good")
    found = scan_repositories([tmp_path])
    assert found["bad"].error is not None
    assert found["good"].error is None


def test_nonexistent_repository_raises(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(RepositoryError, match=r"nope.*does not exist"):
        scan_repositories([missing])


def test_file_as_repository_raises(tmp_path: Path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("")
    with pytest.raises(RepositoryError, match="is not a directory"):
        scan_repositories([a_file])


# --- version policy --------------------------------------------------------------------------


def config_with(policy: ModelVersionPolicy | None) -> ModelConfig:
    return ModelConfig(name="m", version_policy=policy)


AVAILABLE = (3, 1, 7, 2)


def test_no_policy_selects_the_latest_version() -> None:
    assert select_versions(config_with(None), AVAILABLE) == VersionSelection((7,))
    assert select_versions(config_with(ModelVersionPolicy()), AVAILABLE) == VersionSelection((7,))


def test_latest_selects_the_highest_n() -> None:
    policy = ModelVersionPolicy(latest=ModelVersionPolicyLatest(num_versions=2))
    assert select_versions(config_with(policy), AVAILABLE) == VersionSelection((3, 7))


def test_latest_more_than_available_selects_all() -> None:
    policy = ModelVersionPolicy(latest=ModelVersionPolicyLatest(num_versions=10))
    assert select_versions(config_with(policy), AVAILABLE).versions == (1, 2, 3, 7)


def test_latest_zero_selects_nothing() -> None:
    policy = ModelVersionPolicy(latest=ModelVersionPolicyLatest(num_versions=0))
    assert select_versions(config_with(policy), AVAILABLE) == VersionSelection(())


def test_all_selects_every_version() -> None:
    policy = ModelVersionPolicy(all=ModelVersionPolicyAll())
    assert select_versions(config_with(policy), AVAILABLE).versions == (1, 2, 3, 7)


def test_specific_selects_listed_and_reports_missing() -> None:
    policy = ModelVersionPolicy(specific=ModelVersionPolicySpecific(versions=[7, 4, 1, 7]))
    selection = select_versions(config_with(policy), AVAILABLE)
    assert selection == VersionSelection(versions=(1, 7), missing=(4,))


def test_no_versions_on_disk_selects_nothing() -> None:
    assert select_versions(config_with(None), ()) == VersionSelection(())


# --- model files ------------------------------------------------------------------------------


def test_model_file_path_uses_the_backend_default(tmp_path: Path) -> None:
    make_model(tmp_path, "m")
    source = scan_repositories([tmp_path])["m"]
    assert model_file_path(source, 1, "model.onnx") == tmp_path / "m" / "1" / "model.onnx"


def test_model_file_path_honours_default_model_filename(tmp_path: Path) -> None:
    make_model(tmp_path, "m", 'default_model_filename: "net.onnx"\n')
    source = scan_repositories([tmp_path])["m"]
    assert model_file_path(source, 3, "model.onnx") == tmp_path / "m" / "3" / "net.onnx"


# --- signatures ------------------------------------------------------------------------------


def test_signature_is_stable_and_short(tmp_path: Path) -> None:
    folder = make_model(tmp_path, "m", 'name: "m"\n')
    (folder / "1" / "model.onnx").write_bytes(b"weights")
    first = folder_signature(folder)
    assert first == folder_signature(folder)
    assert len(first) == 16 and int(first, 16) >= 0


def test_signature_changes_when_a_file_changes(tmp_path: Path) -> None:
    folder = make_model(tmp_path, "m")
    weights = folder / "1" / "model.onnx"
    weights.write_bytes(b"weights")
    before = folder_signature(folder)
    weights.write_bytes(b"heavier weights")
    assert folder_signature(folder) != before


def test_signature_changes_on_mtime_alone(tmp_path: Path) -> None:
    folder = make_model(tmp_path, "m")
    weights = folder / "1" / "model.onnx"
    weights.write_bytes(b"weights")
    before = folder_signature(folder)
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert folder_signature(folder) != before


def test_signature_changes_when_config_text_changes_same_size(tmp_path: Path) -> None:
    folder = make_model(tmp_path, "m", "max_batch_size: 4\n")
    config = folder / "config.pbtxt"
    before = folder_signature(folder)
    stat = config.stat()
    config.write_text("max_batch_size: 8\n")
    os.utime(config, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same size, same mtime
    assert folder_signature(folder) != before


def test_signature_changes_when_a_file_or_version_is_added(tmp_path: Path) -> None:
    folder = make_model(tmp_path, "m")
    before = folder_signature(folder)
    (folder / "1" / "model.onnx").write_bytes(b"")
    after_file = folder_signature(folder)
    (folder / "2").mkdir()
    after_version = folder_signature(folder)
    assert len({before, after_file, after_version}) == 3


def test_signature_ignores_other_folders(tmp_path: Path) -> None:
    folder = make_model(tmp_path, "m")
    before = folder_signature(folder)
    make_model(tmp_path, "other")
    (tmp_path / "stray.txt").write_text("x")
    assert folder_signature(folder) == before


def test_signature_survives_a_symlink_cycle(tmp_path: Path) -> None:
    folder = make_model(tmp_path, "m")
    (folder / "1" / "loop").symlink_to(folder, target_is_directory=True)
    assert len(folder_signature(folder)) == 16


def test_signature_of_missing_folder_does_not_raise(tmp_path: Path) -> None:
    assert folder_signature(tmp_path / "gone") != folder_signature(tmp_path)


# --- config digest ---------------------------------------------------------------------------


def test_config_digest_follows_content() -> None:
    one = ModelConfig(name="m", max_batch_size=4)
    assert config_digest(one) == config_digest(ModelConfig(name="m", max_batch_size=4))
    assert config_digest(one) != config_digest(ModelConfig(name="m", max_batch_size=8))
    assert len(config_digest(one)) == 16


def test_config_digest_ignores_map_order() -> None:
    a = parse_pbtxt(
        'parameters { key: "a" value { string_value: "1" } }\n'
        'parameters { key: "b" value { string_value: "2" } }\n'
    )
    b = parse_pbtxt(
        'parameters { key: "b" value { string_value: "2" } }\n'
        'parameters { key: "a" value { string_value: "1" } }\n'
    )
    assert config_digest(a) == config_digest(b)
