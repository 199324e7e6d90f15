"""The one confinement rule (`core.paths.inside`) and what the load checks with it
(`control.prepare.confine_config`), and the lifetime of file-override folders
(`control.override_folders`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tritonactor._proto.inference import ModelConfig
from tritonactor.config.model_config import config_from_json
from tritonactor.control import events as ev
from tritonactor.control import override_folders
from tritonactor.control.load_parameters import LoadOptions
from tritonactor.control.load_plan import restored_overrides
from tritonactor.control.override_folders import materialize
from tritonactor.control.prepare import OperatorNames, confine_config
from tritonactor.control.repository import ModelSource
from tritonactor.core.errors import ErrorCode, TritonError
from tritonactor.core.paths import inside


@pytest.fixture()
def model(tmp_path: Path) -> Path:
    folder = tmp_path / "repo" / "m"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text("")
    (tmp_path / "secret").write_text("outside")
    return folder


def refusal(folder: Path, name: str, **kwargs: object) -> str:
    with pytest.raises(TritonError) as caught:
        inside(folder, name, **kwargs)  # type: ignore[arg-type]
    assert caught.value.code is ErrorCode.INVALID_ARG
    return caught.value.message


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("1/model.py", "1/model.py"),
        ("1/../1/model.py", "1/model.py"),
        ("/1/model.py", "1/model.py"),  # Triton joins a leading '/' inside the folder
        ("//etc/shadow", "etc/shadow"),
        ("labels.txt", "labels.txt"),
        ("./a/./b", "a/b"),
    ],
)
def test_names_inside_the_folder_are_joined_as_triton_joins_them(
    model: Path, name: str, expected: str
) -> None:
    assert inside(model, name) == model / expected
    assert inside(model, name, trust_links=True) == model / expected


@pytest.mark.parametrize(
    "name", ["..", "../secret", "1/../../secret", "a/../../../secret", "/../secret", "", "a\x00b"]
)
def test_names_that_climb_out_are_refused_with_the_one_message(model: Path, name: str) -> None:
    message = refusal(model, name, what=f"model file {name!r}")
    assert message == f"model file {name!r} is outside the model's folder"
    assert refusal(model, name, trust_links=True).endswith("is outside the model's folder")


def test_the_message_is_the_same_whether_the_target_exists_or_not(model: Path) -> None:
    exists = refusal(model, "../../secret", what="file")
    missing = refusal(model, "../../no-such-file", what="file")
    assert exists == missing == "file is outside the model's folder"
    # The default description names the file as given, nothing of what is outside.
    assert refusal(model, "../../secret") == "file '../../secret' is outside the model's folder"


def test_a_link_that_leaves_the_folder_is_refused_unless_links_are_trusted(model: Path) -> None:
    (model / "1" / "escape.py").symlink_to(model.parent.parent / "secret")
    (model / "1" / "dangling.py").symlink_to(model.parent.parent / "no-such-file")
    (model / "out").symlink_to(model.parent.parent)
    for name in ("1/escape.py", "1/dangling.py", "out/secret", "out"):
        assert refusal(model, name, what="x") == "x is outside the model's folder"
        assert inside(model, name, trust_links=True) == model / name


def test_a_link_that_stays_inside_is_followed(model: Path) -> None:
    (model / "shared.py").write_text("")
    (model / "1" / "link.py").symlink_to("../shared.py")
    assert inside(model, "1/link.py") == model / "1" / "link.py"


def test_a_linked_model_folder_is_its_own_inside(model: Path, tmp_path: Path) -> None:
    # An operator may link the whole model folder from elsewhere: what is inside the target
    # is inside.
    linked = tmp_path / "linked"
    linked.symlink_to(model)
    assert inside(linked, "1/model.py") == linked / "1" / "model.py"
    assert refusal(linked, "../secret").endswith("outside the model's folder")


def test_a_sibling_folder_with_the_same_prefix_is_outside(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m2").mkdir()
    (tmp_path / "m" / "x").symlink_to(tmp_path / "m2")
    assert refusal(tmp_path / "m", "x", what="x", where="the folder") == "x is outside the folder"


# --- confine_config --------------------------------------------------------------------------


def source(folder: Path) -> ModelSource:
    return ModelSource(
        name=folder.name,
        repository=folder.parent,
        path=folder,
        config=ModelConfig(name=folder.name),
        has_config_file=True,
        versions=(1,),
    )


def config(**fields: object) -> ModelConfig:
    return config_from_json({"name": "m", "backend": "python", **fields})


BAD_CONFIGS = [
    ({"default_model_filename": "../../../probe.py"}, "default_model_filename '../../../probe.py'"),
    ({"default_model_filename": "../../secret"}, "default_model_filename '../../secret'"),
    (
        {"cc_model_filenames": {"7.5": "../../secret"}},
        "default_model_filename '../../secret'",
    ),
    (
        {
            "output": [
                {"name": "O", "data_type": "TYPE_FP32", "dims": [1], "label_filename": "../x"}
            ]
        },
        "label_filename '../x' of output 'O'",
    ),
    (
        {
            "model_warmup": [
                {
                    "name": "w",
                    "batch_size": 1,
                    "inputs": {
                        "I": {"data_type": "TYPE_FP32", "dims": [1], "input_data_file": "../../s"}
                    },
                }
            ]
        },
        "warmup 'w', input 'I': input_data_file '../../s' is outside the model's warmup folder",
    ),
    (
        {
            "sequence_batching": {
                "state": [
                    {
                        "input_name": "S",
                        "output_name": "T",
                        "data_type": "TYPE_INT32",
                        "dims": [1],
                        "initial_state": [
                            {
                                "name": "i",
                                "data_type": "TYPE_INT32",
                                "dims": [1],
                                "data_file": "../../s",
                            }
                        ],
                    }
                ]
            }
        },
        "state 'S': initial_state data_file '../../s' is outside the model's initial_state folder",
    ),
]


@pytest.mark.parametrize(("fields", "described"), BAD_CONFIGS)
@pytest.mark.parametrize("caller_config", [False, True])
def test_every_file_a_config_names_must_stay_inside(
    model: Path, fields: dict[str, object], described: str, caller_config: bool
) -> None:
    with pytest.raises(TritonError) as caught:
        confine_config(source(model), config(**fields), caller_config=caller_config)
    assert caught.value.code is ErrorCode.INVALID_ARG
    assert caught.value.message.startswith(described)
    assert " is outside the model's " in caught.value.message


def test_a_repository_config_may_use_an_operators_link_a_caller_config_may_not(
    model: Path,
) -> None:
    (model / "1" / "linked.py").symlink_to(model.parent.parent / "secret")
    named = config(default_model_filename="linked.py")
    confine_config(source(model), named, caller_config=False)
    with pytest.raises(TritonError) as caught:
        confine_config(source(model), named, caller_config=True)
    assert (
        caught.value.message == "default_model_filename 'linked.py' is outside the model's folder"
    )


def test_a_caller_config_restating_the_operators_names_keeps_their_links(model: Path) -> None:
    (model / "1" / "linked.py").symlink_to(model.parent.parent / "secret")
    (model / "1" / "other.py").symlink_to(model.parent.parent / "secret")
    (model / "labels").symlink_to(model.parent.parent / "secret")
    trusted = OperatorNames(model_files=frozenset({"linked.py"}), labels=frozenset({"labels"}))
    label = {"name": "O", "data_type": "TYPE_FP32", "dims": [1], "label_filename": "labels"}
    restated = config(default_model_filename="linked.py", output=[label])
    confine_config(source(model), restated, caller_config=True, trusted=trusted)
    # A name the repository's config does not give for that kind of file is held to the
    # strict rule, even one it gives for another kind.
    for changed, described in (
        (config(default_model_filename="other.py"), "default_model_filename 'other.py'"),
        (config(default_model_filename="../labels"), "default_model_filename '../labels'"),
        (
            config(
                default_model_filename="linked.py",
                output=[{**label, "label_filename": "1/other.py"}],
            ),
            "label_filename '1/other.py' of output 'O'",
        ),
    ):
        with pytest.raises(TritonError) as caught:
            confine_config(source(model), changed, caller_config=True, trusted=trusted)
        assert caught.value.message.startswith(f"{described} is outside the model's folder")
    # A trusted name still may not climb out lexically.
    climbing = OperatorNames(model_files=frozenset({"../../secret"}))
    with pytest.raises(TritonError):
        confine_config(
            source(model),
            config(default_model_filename="../../secret"),
            caller_config=True,
            trusted=climbing,
        )


def test_an_absolute_model_filename_names_a_file_inside_the_version_folder(model: Path) -> None:
    # Triton's join: "/etc/shadow" is <model>/1/etc/shadow, never the server's file.
    confine_config(source(model), config(default_model_filename="/etc/shadow"), caller_config=True)


@pytest.mark.parametrize(
    "value",
    ["/usr", "relative/venv", "$$TRITON_MODEL_DIRECTORY/../..", "/tmp/../etc"],
)
def test_a_caller_config_runs_no_interpreter_outside_the_model_folder(
    model: Path, value: str
) -> None:
    named = config(parameters={"EXECUTION_ENV_PATH": {"string_value": value}})
    confine_config(source(model), named, caller_config=False)  # an operator's choice
    with pytest.raises(TritonError) as caught:
        confine_config(source(model), named, caller_config=True)
    assert caught.value.message.startswith("EXECUTION_ENV_PATH ")
    assert caught.value.message.endswith(" is outside the model's folder")


def test_a_caller_config_may_name_an_environment_inside_the_model_folder(model: Path) -> None:
    (model / "env" / "bin").mkdir(parents=True)
    for value in (str(model / "env"), "$$TRITON_MODEL_DIRECTORY/env"):
        named = config(parameters={"EXECUTION_ENV_PATH": {"string_value": value}})
        confine_config(source(model), named, caller_config=True)


def test_a_caller_config_names_no_accelerator_file_outside(model: Path) -> None:
    named = config(
        optimization={
            "execution_accelerators": {
                "gpu_execution_accelerator": [
                    {"name": "tensorrt", "parameters": {"trt_engine_cache_path": "/tmp/x"}}
                ]
            }
        },
        parameters={"session.foo_file_name": {"string_value": str(model / "ok")}},
    )
    confine_config(source(model), named, caller_config=False)
    with pytest.raises(TritonError) as caught:
        confine_config(source(model), named, caller_config=True)
    assert caught.value.message == (
        "accelerator parameter 'trt_engine_cache_path' '/tmp/x' is outside the model's folder"
    )


@pytest.mark.parametrize(
    ("parameters", "refused"),
    [
        ({"trt_profile_min_shapes": "x:1x3"}, False),  # shapes, not a file
        ({"trt_engine_cache_enable": "1"}, False),
        ({"trt_timing_cache_path": "relative/cache"}, True),
        ({"trt_ep_context_file_path": "/elsewhere/ctx.onnx"}, True),
        ({"trt_int8_calibration_table_name": "table.flatbuffers"}, False),
        ({"trt_int8_calibration_table_name": "../../table"}, True),
    ],
)
def test_which_accelerator_parameters_name_files(
    model: Path, parameters: dict[str, str], refused: bool
) -> None:
    named = config(
        optimization={
            "execution_accelerators": {
                "gpu_execution_accelerator": [{"name": "tensorrt", "parameters": parameters}]
            }
        }
    )
    if not refused:
        confine_config(source(model), named, caller_config=True)
        return
    with pytest.raises(TritonError, match="is outside the model's folder"):
        confine_config(source(model), named, caller_config=True)


# --- override folders ------------------------------------------------------------------------


def options(content: bytes = b"onnx") -> LoadOptions:
    return LoadOptions('{"backend": "onnxruntime"}', (("1/model.onnx", content),))


def test_an_override_folder_goes_when_its_last_hold_goes(tmp_path: Path) -> None:
    root = tmp_path / "overrides"
    repository = materialize(options(), "m", root).parent
    assert override_folders.holds(repository) == 1  # the load on its way
    assert override_folders.hold(repository, "m") == repository  # a version loaded from it
    assert not override_folders.release(repository, "m")  # the load is done
    assert repository.is_dir()
    assert override_folders.release(repository, "m")  # the version is unloaded
    assert not repository.exists()
    assert os.listdir(root) == []


def test_a_load_reusing_a_folder_keeps_it(tmp_path: Path) -> None:
    root = tmp_path / "overrides"
    first = materialize(options(), "m", root).parent
    second = materialize(options(), "m", root).parent  # the same override again: reused
    assert first == second
    assert override_folders.holds(first) == 2
    assert not override_folders.release(first, "m")
    assert first.is_dir()
    assert override_folders.release(first, "m")
    assert not first.exists()


def test_only_override_folders_are_ever_removed(tmp_path: Path) -> None:
    repository = tmp_path / "models"
    (repository / "m").mkdir(parents=True)
    assert override_folders.hold(repository, "m") is None
    assert not override_folders.release(repository, "m")
    assert not override_folders.release(None, "m")
    # Another model's override folder is not this model's to remove.
    other = tmp_path / ("x-" + "0" * 32)
    other.mkdir()
    assert not override_folders.release(other, "m")
    assert repository.is_dir() and other.is_dir()


def test_stale_folders_are_removed_at_start_except_those_the_journal_restores(
    tmp_path: Path,
) -> None:
    root = tmp_path / "overrides"
    kept = materialize(options(b"a"), "m", root).parent
    stale = materialize(options(b"b"), "m", root).parent
    (root / ".abc.partial").mkdir()
    (root / "notes.txt").write_text("an operator's file")  # not named as an override folder
    removed = override_folders.remove_stale_folders(root, keep=[kept])
    assert sorted(removed) == sorted([stale.name, ".abc.partial"])
    assert sorted(os.listdir(root)) == sorted([kept.name, "notes.txt"])
    assert override_folders.remove_stale_folders(tmp_path / "never-created") == []
    for folder in (kept, stale):
        while override_folders.holds(folder):
            override_folders.release(folder, "m")


def test_each_journal_has_an_override_root_of_its_own() -> None:
    assert override_folders.override_root(Path("/state/s1.jsonl")) == Path(
        "/state/s1.jsonl.overrides"
    )
    assert override_folders.override_root(Path("/state/s1.jsonl")) != (
        override_folders.override_root(Path("/state/s4.jsonl"))
    )


def test_a_start_sweeps_only_a_root_no_other_server_holds(tmp_path: Path) -> None:
    root = tmp_path / "j.jsonl.overrides"

    def ghost() -> Path:
        folder = root / ("ghost-" + "2" * 32)
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    first = override_folders.claim_root(root)
    assert first.alone and first.swept == []
    ghost()
    # A second server on the same journal: the root is held, nothing is swept.
    second = override_folders.claim_root(root)
    assert not second.alone and second.swept == []
    assert ghost().is_dir()
    first.close()
    second.close()
    second.close()  # closing twice is harmless
    # Alone again: the sweep runs (and the lock file is never swept).
    third = override_folders.claim_root(root)
    try:
        assert third.alone and third.swept == ["ghost-" + "2" * 32]
        assert os.listdir(root) == [override_folders.LOCK_NAME]
    finally:
        third.close()


def test_a_root_that_cannot_be_made_is_not_swept_and_fails_no_start(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a folder")
    claim = override_folders.claim_root(tmp_path / "file" / "j.jsonl.overrides")
    assert not claim.alone and claim.swept == []
    claim.close()


def test_removal_never_follows_a_link(tmp_path: Path) -> None:
    target = tmp_path / "precious"
    target.mkdir()
    (target / "file").write_text("keep")
    root = tmp_path / "overrides"
    root.mkdir()
    (root / ("m-" + "1" * 32)).symlink_to(target)
    override_folders.remove_stale_folders(root)
    assert (target / "file").read_text() == "keep"
    assert os.listdir(root) == []


def test_the_folders_a_restart_restores_are_those_of_the_loads_in_force() -> None:
    def requested(model: str, repository: str) -> ev.LoadRequested:
        return ev.LoadRequested(
            model=model,
            versions=(1,),
            source=ev.Source.API,
            config_digest="c",
            config_override="{}",
            override_repository=repository,
            options_digest="d",
        )

    def loaded(model: str) -> ev.ModelLoaded:
        return ev.ModelLoaded(model=model, version=1)

    state = ev.fold(
        [
            requested("a", "/state/overrides/a-1"),
            loaded("a"),
            requested("a", "/state/overrides/a-2"),  # replaces a-1
            loaded("a"),
            requested("b", "/state/overrides/b-1"),
            loaded("b"),
            ev.UnloadRequested(model="b", versions=(1,), source=ev.Source.API),
            requested("c", ""),  # a config override alone: no folder
            loaded("c"),
            requested("d", "/state/overrides/d-1"),  # never loaded: nothing to restore
        ]
    )
    assert restored_overrides(state) == [Path("/state/overrides/a-2")]
