from __future__ import annotations

import base64
import json
import os
import stat
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest

from tritonactor._proto.inference import ModelRepositoryParameter
from tritonactor.config.model_config import config_from_json
from tritonactor.control.load_parameters import (
    LoadOptions,
    UnloadOptions,
    options_digest,
    parse_load_parameters,
    parse_unload_parameters,
)
from tritonactor.control.override_folders import (
    materialize,
    override_model_folder,
    remove_stale_folders,
)
from tritonactor.control.repository import scan_repositories
from tritonactor.core.errors import ErrorCode, TritonError

CONFIG = json.dumps(
    {
        "backend": "onnxruntime",
        "max_batch_size": 4,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [16]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [16]}],
    }
)
MODEL_BYTES = b"\x08\x07onnx-bytes\x00\xff" * 10


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def http_parameters(**files: bytes) -> dict[str, object]:
    return {"config": CONFIG, **{f"file:{path}": b64(data) for path, data in files.items()}}


def everything_under(root: Path) -> list[str]:
    return sorted(str(path.relative_to(root)) for path in root.rglob("*")) if root.exists() else []


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def loose_umask() -> Iterator[None]:
    # Modes must be exact whatever the umask: with 0, a plain open() would give 0644/0755.
    previous = os.umask(0)
    yield
    os.umask(previous)


def load_and_write(parameters: Mapping[str, object], model: str, root: Path) -> Path:
    options = parse_load_parameters(parameters, model, base64_files=True)
    return materialize(options, model, root)


def assert_rejected(
    parameters: Mapping[str, object], model: str, root: Path, *needles: str
) -> TritonError:
    with pytest.raises(TritonError) as caught:
        load_and_write(parameters, model, root)
    assert caught.value.code is ErrorCode.INVALID_ARG
    for needle in needles:
        assert needle in caught.value.message
    assert everything_under(root) == []
    return caught.value


# --- load parameters from HTTP (base64) --------------------------------------------------------


def test_http_parameters_decode_base64_files_sorted_by_path() -> None:
    parameters = {
        "file:2/model.onnx": b64(b"two"),
        "config": CONFIG,
        "file:1/model.onnx": b64(MODEL_BYTES),
    }
    options = parse_load_parameters(parameters, "dense", base64_files=True)

    assert options.config_json == CONFIG
    assert options.files == (("1/model.onnx", MODEL_BYTES), ("2/model.onnx", b"two"))
    assert options.has_overrides
    assert options.config is not None and options.config.max_batch_size == 4


def test_base64_may_be_wrapped_over_lines_as_base64_tools_print_it() -> None:
    wrapped = base64.encodebytes(MODEL_BYTES * 4).decode("ascii")
    assert "\n" in wrapped
    options = parse_load_parameters(
        {"config": CONFIG, "file:1/model.onnx": wrapped}, "dense", base64_files=True
    )
    assert options.files == (("1/model.onnx", MODEL_BYTES * 4),)


@pytest.mark.parametrize("content", ["not base64!", "YW=Jj", "Y", "ÿÿ"])
def test_invalid_base64_is_rejected_naming_the_parameter(content: str, tmp_path: Path) -> None:
    parameters = {"config": CONFIG, "file:1/model.onnx": content}
    assert_rejected(parameters, "dense", tmp_path / "state", "'file:1/model.onnx'", "base64")


@pytest.mark.parametrize("content", [5, True, None, ["YWJj"]])
def test_a_file_that_is_not_a_string_is_rejected_over_http(content: object, tmp_path: Path) -> None:
    parameters = {"config": CONFIG, "file:1/model.onnx": content}
    assert_rejected(parameters, "dense", tmp_path / "state", "'file:1/model.onnx'", "string")


def test_no_parameters_means_no_override() -> None:
    options = parse_load_parameters({}, "dense", base64_files=True)
    assert options == LoadOptions()
    assert not options.has_overrides and options.config is None


def test_config_alone_overrides_only_the_config() -> None:
    options = parse_load_parameters({"config": CONFIG}, "dense", base64_files=True)
    assert options.config_json == CONFIG and options.files == ()
    with pytest.raises(ValueError, match="file overrides"):
        materialize(options, "dense", Path("/nonexistent"))


def test_repr_shows_sizes_not_contents() -> None:
    options = parse_load_parameters(
        http_parameters(**{"1/model.onnx": MODEL_BYTES}), "dense", base64_files=True
    )
    text = repr(options)
    assert "1/model.onnx: 140 bytes" in text and "onnx-bytes" not in text


# --- load parameters from gRPC (bytes) --------------------------------------------------------


def test_grpc_parameters_carry_bytes_as_they_are() -> None:
    parameters = {
        "config": ModelRepositoryParameter(string_param=CONFIG),
        "file:1/model.onnx": ModelRepositoryParameter(bytes_param=MODEL_BYTES),
        "file:1/empty.txt": ModelRepositoryParameter(bytes_param=b""),
    }
    options = parse_load_parameters(parameters, "dense", base64_files=False)
    assert options.files == (("1/empty.txt", b""), ("1/model.onnx", MODEL_BYTES))
    # Unwrapped values (what a front end may hand over instead) read the same.
    plain = {"config": CONFIG, "file:1/model.onnx": MODEL_BYTES, "file:1/empty.txt": b""}
    assert parse_load_parameters(plain, "dense", base64_files=False) == options


def test_grpc_bytes_are_not_base64_decoded() -> None:
    encoded = b64(MODEL_BYTES).encode("ascii")
    parameters = {"config": CONFIG, "file:1/model.onnx": encoded}
    options = parse_load_parameters(parameters, "dense", base64_files=False)
    assert options.files == (("1/model.onnx", encoded),)


@pytest.mark.parametrize(
    ("name", "value", "needle"),
    [
        ("file:1/model.onnx", ModelRepositoryParameter(string_param="abc"), "must be bytes"),
        ("file:1/model.onnx", ModelRepositoryParameter(), "no value"),
        ("file:1/model.onnx", "abc", "must be bytes"),
        ("config", ModelRepositoryParameter(bytes_param=CONFIG.encode()), "must be a string"),
        ("config", ModelRepositoryParameter(int64_param=3), "an integer"),
    ],
)
def test_grpc_parameters_of_the_wrong_type_are_rejected(
    name: str, value: object, needle: str, tmp_path: Path
) -> None:
    parameters: dict[str, object] = {"config": CONFIG, "file:1/model.onnx": MODEL_BYTES}
    parameters[name] = value
    root = tmp_path / "state"
    with pytest.raises(TritonError) as caught:
        materialize(parse_load_parameters(parameters, "dense", base64_files=False), "dense", root)
    assert caught.value.code is ErrorCode.INVALID_ARG
    assert f"'{name}'" in caught.value.message and needle in caught.value.message
    assert everything_under(root) == []


# --- rejected load parameters ------------------------------------------------------------------


def test_unknown_parameters_are_named(tmp_path: Path) -> None:
    parameters = {"config": CONFIG, "unload_dependents": True, "bogus": "x"}
    assert_rejected(parameters, "dense", tmp_path / "state", "'bogus'", "'unload_dependents'")


def test_a_file_without_config_is_rejected_as_triton_does(tmp_path: Path) -> None:
    parameters = {"file:1/model.onnx": b64(MODEL_BYTES)}
    assert_rejected(parameters, "dense", tmp_path / "state", "'config' must be specified")


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('"dense"', "must be a JSON object"),
        ('{"no_such_field": 1}', "no_such_field"),
        ('{"max_batch_size": "many"}', "max_batch_size"),
        ('{"input": [{"data_type": "TYPE_NOPE"}]}', "TYPE_NOPE"),
        ("[" * 100_000 + "]" * 100_000, "JSON nesting depth exceeds maximum allowed limit (100)"),
    ],
)
def test_a_config_that_is_not_a_model_config_is_rejected_with_the_reason(
    config: str, needle: str, tmp_path: Path
) -> None:
    parameters = {"config": config, "file:1/model.onnx": b64(MODEL_BYTES)}
    assert_rejected(parameters, "dense", tmp_path / "state", "'config'", needle)


def nested_config(depth: int) -> str:
    """A config object `depth` deep (itself included), the rest in an array under "deep"."""
    return '{"deep": ' + "[" * (depth - 1) + "]" * (depth - 1) + "}"


@pytest.mark.parametrize("wrap", [str, lambda text: ModelRepositoryParameter(string_param=text)])
def test_a_config_nested_past_the_limit_is_refused_before_it_is_parsed(
    wrap: Callable[[str], object],
) -> None:
    # The same check for HTTP's strings and gRPC's parameters, with the server's limit.
    def parse(depth: int, limit: int) -> TritonError:
        with pytest.raises(TritonError) as caught:
            parse_load_parameters(
                {"config": wrap(nested_config(depth))}, "dense", base64_files=True, max_depth=limit
            )
        assert caught.value.code is ErrorCode.INVALID_ARG
        return caught.value

    too_deep = (
        "load parameter 'config' for model 'dense': JSON nesting depth exceeds maximum allowed "
        "limit ({}). Use --http-max-json-depth to increase the limit."
    )
    # At the limit it is parsed, and then it is the field that is wrong.
    assert "no field named" in parse(100, 100).message
    assert parse(101, 100).message == too_deep.format(100)
    assert "no field named" in parse(300, 300).message
    assert parse(301, 300).message == too_deep.format(300)
    # The default is Triton's 100.
    with pytest.raises(TritonError) as caught:
        parse_load_parameters({"config": nested_config(101)}, "dense", base64_files=True)
    assert caught.value.message == too_deep.format(100)


def test_a_config_that_names_another_model_is_rejected(tmp_path: Path) -> None:
    config = json.dumps({"name": "other", "backend": "onnxruntime"})
    parameters = {"config": config, "file:1/model.onnx": b64(MODEL_BYTES)}
    assert_rejected(parameters, "dense", tmp_path / "state", "'other'", "'dense'")


def test_a_config_that_names_the_model_itself_is_accepted() -> None:
    config = json.dumps({"name": "dense", "backend": "onnxruntime"})
    options = parse_load_parameters({"config": config}, "dense", base64_files=True)
    assert options.config is not None and options.config.name == "dense"


@pytest.mark.parametrize(
    ("name", "needle"),
    [
        ("file:", "empty"),
        ("file:/", "empty"),
        ("file:..", "'..'"),
        ("file:../outside/1/model.onnx", "'..'"),
        ("file:1/../../model.onnx", "'..'"),
        ("file:1\\model.onnx", "backslash"),
        ("file:1/model\x00.onnx", "control characters"),
        ("file:1/model\n.onnx", "control characters"),
        ("file:1/", "names a folder"),
        ("file:1/" + "x" * 256, "longer than 255 bytes"),
        ("file:1/\udc80.onnx", "UTF-8"),
        ("file:config.pbtxt/model.onnx", "'config' parameter"),
    ],
)
def test_unsafe_file_paths_are_rejected_naming_the_parameter(
    name: str, needle: str, tmp_path: Path
) -> None:
    parameters = {"config": CONFIG, name: b64(MODEL_BYTES)}
    shown = f"'{name}'" if name.isprintable() else repr(name)
    assert_rejected(parameters, "dense", tmp_path / "state", shown, needle)


def test_file_paths_are_joined_inside_the_model_folder_as_triton_joins_them() -> None:
    # A leading '/', './' and empty components fall away; a config.pbtxt among the files
    # gives way to the 'config' parameter; '=' padding may be left out.
    parameters = {
        "config": CONFIG,
        "file:/1/model.onnx": b64(MODEL_BYTES),
        "file:./2//model.onnx": b64(MODEL_BYTES).rstrip("="),
        "file:config.pbtxt": b64(b"ignored"),
    }
    options = parse_load_parameters(parameters, "dense", base64_files=True)
    assert options.files == (("1/model.onnx", MODEL_BYTES), ("2/model.onnx", MODEL_BYTES))


def test_a_path_that_is_a_file_and_a_folder_is_rejected(tmp_path: Path) -> None:
    parameters = http_parameters(**{"1": b"file", "1/model.onnx": MODEL_BYTES})
    assert_rejected(
        parameters, "dense", tmp_path / "state", "'file:1/model.onnx'", "'file:1' is a file"
    )


@pytest.mark.parametrize(
    ("model", "needle"),
    [
        ("", "empty"),
        ("   ", "empty"),
        (".hidden", "starts with '.'"),
        ("..", "starts with '.'"),
        ("a/b", "path separator"),
        ("a\\b", "path separator"),
        ("a\x00b", "control characters"),
        ("m" * 223, "longer than 222 bytes"),
    ],
)
def test_model_names_that_cannot_be_a_folder_are_rejected_with_files(
    model: str, needle: str, tmp_path: Path
) -> None:
    parameters = http_parameters(**{"1/model.onnx": MODEL_BYTES})
    assert_rejected(parameters, model, tmp_path / "state", needle)


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        (LoadOptions(CONFIG, (("../escape", b"x"),)), "'..'"),
        (LoadOptions(CONFIG, (("1/model.onnx", b"a"), ("1/model.onnx", b"b"))), "given twice"),
        (LoadOptions(None, (("1/model.onnx", b"a"),)), "'config' must be specified"),
        (LoadOptions('{"name": "other"}', (("1/model.onnx", b"a"),)), "'other'"),
    ],
)
def test_options_built_by_hand_are_checked_again_before_writing(
    options: LoadOptions, needle: str, tmp_path: Path
) -> None:
    root = tmp_path / "state"
    with pytest.raises(TritonError) as caught:
        materialize(options, "dense", root)
    assert caught.value.code is ErrorCode.INVALID_ARG and needle in caught.value.message
    assert everything_under(root) == []


def test_top_level_files_and_other_folders_are_allowed_as_in_triton() -> None:
    # Triton writes any path inside the model folder: labels files live beside config.pbtxt.
    parameters = http_parameters(
        **{"labels.txt": b"cat\ndog\n", "1/model.onnx": MODEL_BYTES, "configs/h100.pbtxt": b""}
    )
    options = parse_load_parameters(parameters, "dense", base64_files=True)
    assert [path for path, _ in options.files] == [
        "1/model.onnx",
        "configs/h100.pbtxt",
        "labels.txt",
    ]


# --- unload parameters -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("parameters", "expected"),
    [
        ({}, False),
        ({"unload_dependents": True}, True),
        ({"unload_dependents": False}, False),
        ({"unload_dependents": ModelRepositoryParameter(bool_param=True)}, True),
    ],
)
def test_unload_dependents_is_a_boolean(parameters: dict[str, object], expected: bool) -> None:
    options = parse_unload_parameters(parameters, model="dense")
    assert options == UnloadOptions(unload_dependents=expected)


@pytest.mark.parametrize(
    ("parameters", "needle"),
    [
        ({"unload_dependents": "true"}, "a string"),
        ({"unload_dependents": 1}, "an integer"),
        ({"unload_dependents": ModelRepositoryParameter(int64_param=1)}, "an integer"),
        ({"unload_dependents": ModelRepositoryParameter()}, "no value"),
        ({"config": CONFIG}, "'config'"),
    ],
)
def test_bad_unload_parameters_are_rejected(parameters: dict[str, object], needle: str) -> None:
    with pytest.raises(TritonError) as caught:
        parse_unload_parameters(parameters, model="dense")
    assert caught.value.code is ErrorCode.INVALID_ARG
    assert needle in caught.value.message and "'dense'" in caught.value.message


# --- digest ------------------------------------------------------------------------------------


def test_the_digest_ignores_json_spelling_and_file_order() -> None:
    respelled = json.dumps(json.loads(CONFIG), indent=2, sort_keys=True)
    first = LoadOptions(CONFIG, (("1/a", b"A"), ("2/b", b"B")))
    second = LoadOptions(respelled, (("2/b", b"B"), ("1/a", b"A")))
    assert options_digest(first) == options_digest(second)
    assert len(options_digest(first)) == 32
    int(options_digest(first), 16)


def test_the_digest_changes_with_any_content() -> None:
    base = LoadOptions(CONFIG, (("1/a", b"A"),))
    others = [
        LoadOptions(None, (("1/a", b"A"),)),
        LoadOptions(CONFIG),
        LoadOptions('{"backend": "pytorch"}', (("1/a", b"A"),)),
        LoadOptions(CONFIG, (("1/a", b"B"),)),
        LoadOptions(CONFIG, (("1/b", b"A"),)),
        # The same bytes split differently between path and content.
        LoadOptions(CONFIG, (("1/aA", b""),)),
    ]
    digests = {options_digest(base), *map(options_digest, others)}
    assert len(digests) == len(others) + 1


# --- materialize -------------------------------------------------------------------------------


def test_materialize_writes_a_one_model_repository_the_scanner_reads(
    tmp_path: Path, loose_umask: None
) -> None:
    root = tmp_path / "state"
    parameters = http_parameters(**{"1/model.onnx": MODEL_BYTES, "labels.txt": b"cat\n"})
    options = parse_load_parameters(parameters, "dense", base64_files=True)

    folder = materialize(options, "dense", root)

    assert folder == override_model_folder(root, "dense", options_digest(options))
    assert folder.parent.name == f"dense-{options_digest(options)}"
    found = scan_repositories([folder.parent])
    assert list(found) == ["dense"]
    source = found["dense"]
    assert source.error is None and source.path == folder and source.versions == (1,)
    expected = config_from_json(CONFIG)
    expected.name = "dense"
    assert source.config == expected
    assert (folder / "1" / "model.onnx").read_bytes() == MODEL_BYTES
    assert (folder / "labels.txt").read_bytes() == b"cat\n"
    for path in [folder.parent, folder, folder / "1"]:
        assert mode(path) == 0o700, path
    for path in [folder / "config.pbtxt", folder / "labels.txt", folder / "1" / "model.onnx"]:
        assert mode(path) == 0o600, path
    # Nothing half-written is left beside it.
    assert [entry.name for entry in root.iterdir()] == [folder.parent.name]


def test_the_same_override_maps_to_the_same_folder_and_is_reused(tmp_path: Path) -> None:
    root = tmp_path / "state"
    parameters = http_parameters(**{"1/model.onnx": MODEL_BYTES})
    first = load_and_write(parameters, "dense", root)
    written = os.lstat(first / "1" / "model.onnx")

    respelled = dict(parameters, config=json.dumps(json.loads(CONFIG), indent=1))
    second = load_and_write(respelled, "dense", root)

    assert second == first
    again = os.lstat(second / "1" / "model.onnx")
    assert (again.st_ino, again.st_mtime_ns) == (written.st_ino, written.st_mtime_ns)
    assert len(list(root.iterdir())) == 1


def test_another_override_gets_another_folder(tmp_path: Path) -> None:
    root = tmp_path / "state"
    first = load_and_write(http_parameters(**{"1/model.onnx": b"one"}), "dense", root)
    second = load_and_write(http_parameters(**{"1/model.onnx": b"two"}), "dense", root)
    assert first != second
    assert (first / "1" / "model.onnx").read_bytes() == b"one"
    assert (second / "1" / "model.onnx").read_bytes() == b"two"


def test_a_symlink_planted_where_the_folder_belongs_is_not_followed(tmp_path: Path) -> None:
    root = tmp_path / "state"
    options = parse_load_parameters(
        http_parameters(**{"1/model.onnx": MODEL_BYTES}), "dense", base64_files=True
    )
    # A decoy holding exactly what the override would write, so only the link gives it away.
    decoy_root = tmp_path / "decoy"
    decoy = materialize(options, "dense", decoy_root).parent
    before = everything_under(decoy_root)
    target = override_model_folder(root, "dense", options_digest(options)).parent
    root.mkdir()
    target.symlink_to(decoy, target_is_directory=True)

    folder = materialize(options, "dense", root)

    assert not target.is_symlink() and stat.S_ISDIR(os.lstat(target).st_mode)
    assert (folder / "1" / "model.onnx").read_bytes() == MODEL_BYTES
    assert everything_under(decoy_root) == before


def test_a_symlink_planted_inside_an_existing_folder_is_replaced_not_followed(
    tmp_path: Path,
) -> None:
    root = tmp_path / "state"
    parameters = http_parameters(**{"1/model.onnx": MODEL_BYTES})
    folder = load_and_write(parameters, "dense", root)
    outside = tmp_path / "secret.onnx"
    outside.write_bytes(b"s" * len(MODEL_BYTES))  # same size: only the link gives it away
    (folder / "1" / "model.onnx").unlink()
    (folder / "1" / "model.onnx").symlink_to(outside)

    again = load_and_write(parameters, "dense", root)

    assert again == folder
    assert not (again / "1" / "model.onnx").is_symlink()
    assert (again / "1" / "model.onnx").read_bytes() == MODEL_BYTES
    assert outside.read_bytes() == b"s" * len(MODEL_BYTES)


def test_a_tampered_folder_is_written_again(tmp_path: Path) -> None:
    root = tmp_path / "state"
    parameters = http_parameters(**{"1/model.onnx": MODEL_BYTES})
    folder = load_and_write(parameters, "dense", root)
    (folder / "1" / "model.onnx").write_bytes(b"short")
    (folder / "config.pbtxt").unlink()
    os.mkfifo(folder / "config.pbtxt")  # reading it must not hang

    again = load_and_write(parameters, "dense", root)

    assert (again / "1" / "model.onnx").read_bytes() == MODEL_BYTES
    assert 'name: "dense"' in (again / "config.pbtxt").read_text()


def test_an_extra_entry_in_an_existing_folder_is_not_served(tmp_path: Path) -> None:
    root = tmp_path / "state"
    parameters = http_parameters(**{"1/model.onnx": MODEL_BYTES})
    folder = load_and_write(parameters, "dense", root)
    (folder / "2").mkdir()  # the scanner would see a version 2

    again = load_and_write(parameters, "dense", root)

    assert scan_repositories([again.parent])["dense"].versions == (1,)


def test_a_file_where_the_folder_belongs_is_replaced(tmp_path: Path) -> None:
    root = tmp_path / "state"
    options = LoadOptions(CONFIG, (("1/model.onnx", MODEL_BYTES),))
    target = override_model_folder(root, "dense", options_digest(options)).parent
    root.mkdir()
    target.write_bytes(b"junk")
    folder = materialize(options, "dense", root)
    assert (folder / "1" / "model.onnx").read_bytes() == MODEL_BYTES


def test_a_write_failure_is_internal_and_leaves_nothing(tmp_path: Path) -> None:
    root = tmp_path / "state"
    root.write_bytes(b"not a folder")
    options = LoadOptions(CONFIG, (("1/model.onnx", MODEL_BYTES),))
    with pytest.raises(TritonError) as caught:
        materialize(options, "dense", root)
    assert caught.value.code is ErrorCode.INTERNAL and "'dense'" in caught.value.message
    assert root.read_bytes() == b"not a folder"


def test_partial_folders_of_an_interrupted_write_are_removed(tmp_path: Path) -> None:
    root = tmp_path / "state"
    folder = load_and_write(http_parameters(**{"1/model.onnx": MODEL_BYTES}), "dense", root)
    leftover = root / ".0123abcd.x1y2z3.partial"
    (leftover / "dense" / "1").mkdir(parents=True)
    (leftover / "dense" / "1" / "model.onnx").write_bytes(b"half")

    remove_stale_folders(root, keep=[folder.parent])
    remove_stale_folders(tmp_path / "never-created")

    assert [entry.name for entry in root.iterdir()] == [folder.parent.name]


def test_a_config_naming_another_model_is_refused_in_tritons_words() -> None:
    with pytest.raises(TritonError) as caught:
        parse_load_parameters({"config": '{"name": "other"}'}, "m", base64_files=True)
    assert caught.value.message.startswith(
        "unexpected directory name 'm' for model 'other', directory name must equal model name"
    )


def test_a_config_file_alone_among_the_files_is_refused(tmp_path: Path) -> None:
    # Files make a folder of their own; with only the config.pbtxt that 'config' writes, it
    # would hold no model (Triton's fails the load for want of a version).
    parameters = {"config": CONFIG, "file:config.pbtxt": b64(b"ignored")}
    assert_rejected(parameters, "dense", tmp_path / "state", "'file:config.pbtxt'", "no other")


def test_a_name_of_dots_alone_is_a_file_name() -> None:
    parameters = {"config": CONFIG, "file:1/model.onnx": b64(MODEL_BYTES), "file:...": b64(b"x")}
    options = parse_load_parameters(parameters, "dense", base64_files=True)
    assert [path for path, _ in options.files] == ["...", "1/model.onnx"]
