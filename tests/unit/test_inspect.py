"""`tritonactor repository inspect`: real repositories built in tmp_path, real backends (ONNX
Runtime's auto-complete runs; the python backend's must not), and the real CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.onnx_models import add_sub_model
from tritonactor import cli
from tritonactor._proto.inference import ModelConfig
from tritonactor.backends.python import PythonBackend
from tritonactor.backends.registry import BackendRegistry
from tritonactor.control.inspect import (
    PYTHON_NOT_COMPLETED,
    ModelReport,
    Report,
    human_size,
    inspect_repositories,
    render_text,
    report_to_json,
)
from tritonactor.control.prepare import missing_model_file
from tritonactor.control.repository import scan_repositories

PYTHON_MODELS = Path(__file__).resolve().parent.parent / "python_models"


@pytest.fixture(scope="module")
def registry() -> BackendRegistry:
    return BackendRegistry()


def size(path: Path) -> int:
    return path.stat().st_size


def files_bytes(root: Path) -> int:
    return sum(size(Path(folder) / name) for folder, _, names in os.walk(root) for name in names)


def copy_python_model(name: str, repository: Path, as_name: str | None = None) -> Path:
    target = repository / (as_name or name)
    shutil.copytree(PYTHON_MODELS / name, target)
    if as_name:
        config = target / "config.pbtxt"
        config.write_text(config.read_text().replace(f'name: "{name}"', f'name: "{as_name}"'))
    return target


def with_import_marker(model_file: Path, marker: Path) -> None:
    """Make importing the model file (what starting its process does) leave `marker` behind."""
    code = model_file.read_text()
    model_file.write_text(f"{code}\nimport pathlib\npathlib.Path({str(marker)!r}).touch()\n")


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def by_name(report: Report, name: str) -> ModelReport:
    (model,) = [m for m in report.models if m.name == name]
    return model


@pytest.fixture
def repos(tmp_path: Path) -> tuple[Path, Path]:
    first, second = tmp_path / "first", tmp_path / "second"
    # ONNX, no config.pbtxt: auto-complete reads the model; version 2 is the one loaded.
    add_sub_model(first / "onnx_add_sub/1/model.onnx")
    add_sub_model(first / "onnx_add_sub/2/model.onnx", dims=(64,))
    write(first / "onnx_add_sub/labels.txt", "a\nb\nc\n")
    # A python model with auto_complete_config, which inspect must not run.
    autocomplete = copy_python_model("autocomplete", first)
    with_import_marker(autocomplete / "1/model.py", tmp_path / "imported")
    write(first / "broken/config.pbtxt", 'name: "broken"\ninput [ { name: ')
    (first / "broken/1").mkdir()
    # The selected version (2) lacks its model file; version 1 has one but is not selected.
    lacks = copy_python_model("add_sub", first, as_name="lacks_file")
    write(lacks / "2/README", "weights to come\n")
    copy_python_model("add_sub", first, as_name="dup")
    copy_python_model("add_sub", second, as_name="dup")
    return first, second


def test_every_model_is_reported_with_its_sizes_and_errors(
    repos: tuple[Path, Path], registry: BackendRegistry, tmp_path: Path
) -> None:
    first, second = repos
    report = inspect_repositories([first, second], registry, gpus=0)

    assert report.repositories == (first, second)
    assert [(m.repository, m.name) for m in report.models] == [
        (first, "autocomplete"),
        (first, "broken"),
        (first, "dup"),
        (first, "lacks_file"),
        (first, "onnx_add_sub"),
        (second, "dup"),
    ]
    assert report.total_bytes == files_bytes(first) + files_bytes(second)
    assert not report.loads

    onnx = by_name(report, "onnx_add_sub")
    assert onnx.loads and onnx.errors == () and onnx.notes == ()
    # Two: Triton's default count for an ONNX Runtime CPU group that gives none.
    assert (onnx.backend, onnx.instances) == ("onnxruntime", 2)
    folder = first / "onnx_add_sub"
    assert [(v.version, v.selected, v.bytes) for v in onnx.versions] == [
        (1, False, size(folder / "1/model.onnx")),
        (2, True, size(folder / "2/model.onnx")),
    ]
    assert onnx.other_bytes == size(folder / "labels.txt") == 6
    assert onnx.total_bytes == files_bytes(folder)

    python = by_name(report, "autocomplete")
    assert python.loads and python.backend == "python" and python.instances == 1
    assert python.notes == (PYTHON_NOT_COMPLETED,)
    assert python.total_bytes == files_bytes(first / "autocomplete")
    assert not (tmp_path / "imported").exists()

    # The same reason the server's scan reports.
    broken = by_name(report, "broken")
    assert broken.errors == (scan_repositories([first])["broken"].error,)
    assert "config.pbtxt" in broken.errors[0]
    assert (broken.backend, broken.instances) == (None, None)
    assert [(v.version, v.selected, v.bytes) for v in broken.versions] == [(1, False, 0)]

    lacks = by_name(report, "lacks_file")
    assert not lacks.loads and lacks.errors == ()
    assert [(v.version, v.selected, v.error) for v in lacks.versions] == [
        (1, False, None),
        (2, True, f"unable to find '{first / 'lacks_file/2/model.py'}' for model 'lacks_file'"),
    ]
    assert lacks.versions[1].bytes == len("weights to come\n")

    duplicates = [m for m in report.models if m.name == "dup"]
    assert [m.repository for m in duplicates] == [first, second]
    for copy in duplicates:
        assert copy.errors == ("model appears in two or more repositories",)
        assert copy.total_bytes == files_bytes(copy.path) > 0


def test_inspect_skips_what_python_auto_complete_would_start(tmp_path: Path) -> None:
    # The marker does record a process start: the backend's own auto-complete leaves it.
    model = copy_python_model("autocomplete", tmp_path)
    with_import_marker(model / "1/model.py", tmp_path / "imported")
    completed = PythonBackend().auto_complete_config(ModelConfig(name="autocomplete"), model / "1")
    assert [tensor.name for tensor in completed.input] == ["INPUT0"]
    assert (tmp_path / "imported").exists()


def test_instances_count_every_group_after_defaults(
    tmp_path: Path, registry: BackendRegistry
) -> None:
    model = copy_python_model("add_sub", tmp_path / "repo", as_name="counted")
    config = model / "config.pbtxt"
    config.write_text(
        config.read_text().replace(
            "instance_group [ { kind: KIND_CPU } ]",
            "instance_group [ { kind: KIND_CPU count: 2 }, { count: 3 } ]",
        )
    )
    (counted,) = inspect_repositories([tmp_path / "repo"], registry, gpus=0).models
    assert counted.loads and counted.instances == 5


def test_errors_the_load_would_hit(tmp_path: Path, registry: BackendRegistry) -> None:
    repo = tmp_path / "repo"
    gpu = copy_python_model("add_sub", repo, as_name="gpu")
    config = gpu / "config.pbtxt"
    config.write_text(config.read_text().replace("KIND_CPU", "KIND_GPU"))
    pinned = copy_python_model("add_sub", repo, as_name="pinned")
    with (pinned / "config.pbtxt").open("a") as file:
        file.write("version_policy { specific { versions: [ 7 ] } }\n")
    add_sub_model(repo / "no_config/1/model.onnx")
    write(repo / "unknown/config.pbtxt", 'platform: "caffe2_netdef"\n')
    (repo / "unknown/1").mkdir()

    report = inspect_repositories([repo], registry, strict=False, gpus=0)

    assert by_name(report, "gpu").errors == (
        "instance group gpu_0 of model gpu has kind KIND_GPU but no GPUs are available",
    )
    assert by_name(report, "pinned").errors == (
        "at least one version must be available under the version policy of model 'pinned'",
    )
    assert by_name(report, "pinned").notes == (
        "version 7 is specified for model 'pinned', but its folder is not present",
    )
    assert by_name(report, "no_config").loads
    unknown = by_name(report, "unknown")
    assert unknown.backend is None
    assert unknown.errors[0].startswith("unexpected platform type 'caffe2_netdef' for unknown")

    strict = inspect_repositories([repo], registry, strict=True, gpus=0)
    (reason,) = by_name(strict, "no_config").errors
    assert reason.startswith("model 'no_config' has no config.pbtxt, and strict model config")
    # Strict mode runs no auto-complete, so there is nothing to say about skipping it.
    assert by_name(strict, "pinned").notes == by_name(report, "pinned").notes


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="needs symbolic links")
def test_sizes_follow_links_once_and_stop_at_cycles(
    tmp_path: Path, registry: BackendRegistry
) -> None:
    repo = tmp_path / "repo"
    model = copy_python_model("add_sub", repo, as_name="linked")
    model_file = model / "1/model.py"
    outside = write(tmp_path / "shared/weights.bin", "w" * 1000)
    (model / "1/weights.bin").symlink_to(outside)
    (model / "1/again.bin").symlink_to(outside)  # the same file: its bytes count once
    (model / "1/loop").symlink_to(model / "1", target_is_directory=True)
    (model / "1/dangling").symlink_to(tmp_path / "nowhere")
    (model / "2").mkdir()
    (model / "2/model.py").symlink_to(model_file)

    (linked,) = inspect_repositories([repo], registry, gpus=0).models

    one, two = linked.versions
    assert one.bytes == size(model_file) + 1000
    assert two.bytes == size(model_file)
    assert linked.other_bytes == size(model / "config.pbtxt")
    assert linked.total_bytes == size(model_file) + 1000 + size(model / "config.pbtxt")


def test_json_is_the_report_in_exact_bytes(
    repos: tuple[Path, Path], registry: BackendRegistry
) -> None:
    first, second = repos
    report = inspect_repositories([first, second], registry, gpus=0)
    data = json.loads(json.dumps(report_to_json(report)))

    assert data["repositories"] == [str(first), str(second)]
    assert data["loads"] is False
    assert data["total_bytes"] == report.total_bytes
    onnx = next(m for m in data["models"] if m["name"] == "onnx_add_sub")
    assert onnx == {
        "name": "onnx_add_sub",
        "repository": str(first),
        "path": str(first / "onnx_add_sub"),
        "loads": True,
        "backend": "onnxruntime",
        "instances": 2,
        "total_bytes": files_bytes(first / "onnx_add_sub"),
        "other_bytes": 6,
        "versions": [
            {
                "version": 1,
                "selected": False,
                "bytes": size(first / "onnx_add_sub/1/model.onnx"),
                "error": None,
            },
            {
                "version": 2,
                "selected": True,
                "bytes": size(first / "onnx_add_sub/2/model.onnx"),
                "error": None,
            },
        ],
        "errors": [],
        "notes": [],
    }
    lacks = next(m for m in data["models"] if m["name"] == "lacks_file")
    assert lacks["loads"] is False and lacks["versions"][1]["error"].startswith("unable to find")


def test_text_is_a_table_per_repository(
    repos: tuple[Path, Path], registry: BackendRegistry
) -> None:
    first, second = repos
    text = render_text(inspect_repositories([first, second], registry, gpus=0))
    lines = text.splitlines()

    assert lines[0] == f"repository {first}"
    assert lines[1].split() == ["MODEL", "VERSION", "SELECTED", "BACKEND", "INSTANCES", "SIZE"]
    assert f"repository {second}" in lines
    onnx = lines.index(next(line for line in lines if line.startswith("onnx_add_sub ")))
    assert lines[onnx].split()[:3] == ["onnx_add_sub", "onnxruntime", "2"]
    assert lines[onnx + 1].split()[:2] == ["1", "no"]
    assert lines[onnx + 2].split()[:2] == ["2", "yes"]
    assert f"    note: {PYTHON_NOT_COMPLETED}" in lines
    assert any(line.startswith("    error: ") and "config.pbtxt" in line for line in lines)
    assert any(line.startswith("    error (version 2): unable to find") for line in lines)
    assert lines[-1].startswith("6 models in 2 repositories: 2 would load, 4 with errors; ")


def test_human_sizes() -> None:
    assert human_size(0) == "0 B"
    assert human_size(1023) == "1023 B"
    assert human_size(1536) == "1.5 KiB"
    assert human_size(1024**2 - 1) == "1.0 MiB"
    assert human_size(5 * 1024**3) == "5.0 GiB"
    assert human_size(3 * 1024**4) == "3.0 TiB"


def test_missing_model_file_needs_a_file_name(tmp_path: Path) -> None:
    (tmp_path / "ens/1").mkdir(parents=True)
    (source,) = scan_repositories([tmp_path]).values()
    assert missing_model_file(source, ModelConfig(name="ens"), 1) is None
    config = ModelConfig(name="ens", default_model_filename="model.onnx")
    reason = f"unable to find '{tmp_path / 'ens/1/model.onnx'}' for model 'ens'"
    assert missing_model_file(source, config, 1) == reason


def test_cli_exit_status(
    repos: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first, _ = repos
    assert cli.main(["repository", "inspect", str(first)]) == 1
    assert "lacks_file" in capsys.readouterr().out

    good = tmp_path / "good"
    copy_python_model("add_sub", good)
    assert cli.main(["repository", "inspect", "--strict", str(good)]) == 0
    assert "1 model in 1 repository: 1 would load, 0 with errors" in capsys.readouterr().out

    not_a_folder = write(tmp_path / "file.txt", "")
    assert cli.main(["repository", "inspect", str(good), str(not_a_folder)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"tritonactor repository inspect: error: model repository '{not_a_folder}' "
        "is not a directory\n"
    )
    assert cli.main(["repository", "inspect"]) == 2
    assert "PATH" in capsys.readouterr().err


def test_the_installed_command_runs(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    add_sub_model(repo / "onnx_add_sub/1/model.onnx")
    result = subprocess.run(
        [sys.executable, "-m", "tritonactor.cli", "repository", "inspect", "--json", str(repo)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    (model,) = data["models"]
    assert (model["name"], model["backend"], model["loads"]) == (
        "onnx_add_sub",
        "onnxruntime",
        True,
    )
    assert model["total_bytes"] == size(repo / "onnx_add_sub/1/model.onnx")


def test_a_config_tensor_the_onnx_file_lacks_is_the_servers_refusal(
    tmp_path: Path, registry: BackendRegistry
) -> None:
    # The server refuses to load it (the ONNX backend's check at load); inspect, which used to
    # call it loadable, gives the same reason.
    repo = tmp_path / "repo"
    add_sub_model(repo / "wrong_input" / "1" / "model.onnx")
    write(
        repo / "wrong_input" / "config.pbtxt",
        'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        'input [ { name: "NOT_IN_FILE" data_type: TYPE_INT32 dims: [ 16 ] } ]\n',
    )

    report = inspect_repositories([repo], registry, strict=False, gpus=0)

    model = by_name(report, "wrong_input")
    assert not model.loads
    (version,) = model.versions
    assert version.error is not None
    assert "config input 'NOT_IN_FILE' is not an input of the ONNX model" in version.error
    assert not report.loads
