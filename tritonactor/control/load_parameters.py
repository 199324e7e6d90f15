"""The parameters of explicit-mode load and unload requests, and the digest of a load's overrides.

Everything a client sends is checked here, before anything touches the disk: a rejected request
writes nothing. A load with `file:` parameters is then served from a folder of its own, named
after `options_digest` and written by `override_folders.materialize`, which makes the checks of
a file override again (`check_file_override`) before it writes anything.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import betterproto2

from tritonactor._proto.inference import ModelConfig, ModelRepositoryParameter
from tritonactor.config.model_config import ConfigError, config_from_json, config_to_json
from tritonactor.control.repository import CONFIG_FILENAME
from tritonactor.core.errors import TritonError, invalid_arg
from tritonactor.core.json_depth import DEFAULT_JSON_DEPTH, check_json_depth

__all__ = [
    "CONFIG_PARAMETER",
    "FILE_PREFIX",
    "UNLOAD_DEPENDENTS_PARAMETER",
    "LoadOptions",
    "UnloadOptions",
    "check_file_override",
    "options_digest",
    "parse_load_parameters",
    "parse_unload_parameters",
]

CONFIG_PARAMETER = "config"
FILE_PREFIX = "file:"
UNLOAD_DEPENDENTS_PARAMETER = "unload_dependents"

_MAX_NAME_BYTES = 255  # NAME_MAX on the filesystems a server runs on
# 128 bits: the folder is reused on a digest match, so a collision must be out of reach even
# for a client who tries to make one (64 bits would fall to a birthday search).
_DIGEST_CHARS = 32
_MAX_MODEL_NAME_BYTES = _MAX_NAME_BYTES - 1 - _DIGEST_CHARS
_BASE64_WHITESPACE = str.maketrans("", "", " \t\r\n")


@dataclass(frozen=True, slots=True, repr=False)
class LoadOptions:
    """What a load request asks for beyond the model's name.

    `config_json` replaces the repository's config.pbtxt. `files` (relative path, content),
    sorted by path, replace the whole model folder: with files, nothing of the repository's
    folder is used.
    """

    config_json: str | None = None
    files: tuple[tuple[str, bytes], ...] = ()

    @property
    def has_overrides(self) -> bool:
        return self.config_json is not None or bool(self.files)

    @property
    def config(self) -> ModelConfig | None:
        """The override config, parsed (the name may be empty: it is the model's)."""
        return None if self.config_json is None else config_from_json(self.config_json)

    def __repr__(self) -> str:
        # Files can be gigabytes; a log line shows their names and sizes only.
        files = ", ".join(f"{path}: {len(content)} bytes" for path, content in self.files)
        config = "None" if self.config_json is None else f"<{len(self.config_json)} chars>"
        return f"LoadOptions(config_json={config}, files=[{files}])"


@dataclass(frozen=True, slots=True)
class UnloadOptions:
    unload_dependents: bool = False


# ---------------------------------------------------------------------------------------------
# Parsing


def parse_load_parameters(
    parameters: Mapping[str, object],
    model: str,
    *,
    base64_files: bool,
    max_depth: int = DEFAULT_JSON_DEPTH,
) -> LoadOptions:
    """The checked options of a load request, or INVALID_ARG naming the parameter at fault.

    Values are plain JSON values from HTTP (`base64_files=True`: file contents are base64
    strings) or gRPC `ModelRepositoryParameter`s, or their unwrapped values (file contents
    are bytes). The `config` JSON may nest at most `max_depth` deep (the server's
    `http_max_json_depth`, on either protocol), checked before it is parsed.
    """
    unknown = [name for name in parameters if not _is_load_parameter(name)]
    if unknown:
        names = ", ".join(_quote(name) for name in sorted(unknown))
        raise invalid_arg(
            f"unknown load parameter(s) {names} for model {_quote(model)}; "
            f"accepted are '{CONFIG_PARAMETER}' and '{FILE_PREFIX}<path>'"
        )
    file_names = [name for name in parameters if name.startswith(FILE_PREFIX)]
    if file_names and CONFIG_PARAMETER not in parameters:
        raise _missing_config(model)
    config_json = None
    if CONFIG_PARAMETER in parameters:
        config_json = _config_parameter(_unwrap(parameters[CONFIG_PARAMETER]), model, max_depth)
    if not file_names:
        return LoadOptions(config_json)
    _check_model_name(model)
    # (A config.pbtxt among the files gives way to the 'config' parameter, as in Triton.)
    named = [(path, name) for name in file_names if (path := _file_path(name, model))]
    if not named:  # files meant a folder of its own: one with a config alone serves nothing
        raise _parameter_error(
            file_names[0],
            model,
            f"{CONFIG_FILENAME} is written from the '{CONFIG_PARAMETER}' "
            "parameter, and no other file is given",
        )
    _check_layout([path for path, _ in named], model)
    files = [
        (path, _file_content(name, _unwrap(parameters[name]), model, base64_files))
        for path, name in named
    ]
    return LoadOptions(config_json, tuple(sorted(files)))


def parse_unload_parameters(parameters: Mapping[str, object], *, model: str) -> UnloadOptions:
    """The checked options of an unload request; `unload_dependents` must be a boolean."""
    unknown = [name for name in parameters if name != UNLOAD_DEPENDENTS_PARAMETER]
    if unknown:
        names = ", ".join(_quote(name) for name in sorted(unknown))
        raise invalid_arg(
            f"unknown unload parameter(s) {names} for model {_quote(model)}; "
            f"accepted is '{UNLOAD_DEPENDENTS_PARAMETER}'"
        )
    value = _unwrap(parameters.get(UNLOAD_DEPENDENTS_PARAMETER, False))
    if not isinstance(value, bool):
        raise invalid_arg(
            f"unload parameter '{UNLOAD_DEPENDENTS_PARAMETER}' for model {_quote(model)} must be a "
            f"boolean, not {_kind(value)}"
        )
    return UnloadOptions(unload_dependents=value)


def _is_load_parameter(name: str) -> bool:
    return name == CONFIG_PARAMETER or name.startswith(FILE_PREFIX)


def _unwrap(value: object) -> object:
    if isinstance(value, ModelRepositoryParameter):
        _, inner = betterproto2.which_one_of(value, "parameter_choice")
        return inner
    return value


def _kind(value: object) -> str:
    # Worded to fit both wires: a JSON value, or the member set in gRPC's oneof.
    if value is None:
        return "no value"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "bytes"
    return f"a {type(value).__name__}"


def _config_parameter(value: object, model: str, max_depth: int) -> str:
    if not isinstance(value, str):
        raise invalid_arg(
            f"load parameter '{CONFIG_PARAMETER}' for model {_quote(model)} must be a string "
            f"holding the model configuration as JSON, not {_kind(value)}"
        )
    _checked_config(value, model, max_depth)
    return value


def _checked_config(config_json: str, model: str, max_depth: int | None = None) -> ModelConfig:
    """`config_json` as a ModelConfig, or INVALID_ARG naming the parameter; its depth is
    checked first when `max_depth` is given (None: a front end has checked it already)."""
    where = f"load parameter '{CONFIG_PARAMETER}' for model {_quote(model)}"
    if max_depth is not None:
        try:
            check_json_depth(config_json, max_depth)
        except TritonError as exc:
            raise invalid_arg(f"{where}: {exc.message}") from None
    try:
        data = json.loads(config_json)
    except (ValueError, RecursionError) as exc:
        raise invalid_arg(f"{where} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise invalid_arg(f"{where} must be a JSON object")
    try:
        config = config_from_json(data)
    except ConfigError as exc:
        raise invalid_arg(f"{where}: {exc}") from None
    if config.name and config.name != model:
        raise invalid_arg(  # Triton's words, then which name is which
            f"unexpected directory name {_quote(model)} for model {_quote(config.name)}, "
            f"directory name must equal model name (load parameter '{CONFIG_PARAMETER}' names "
            f"model {_quote(config.name)}, the request loads {_quote(model)}: leave the name "
            "out or make them equal)"
        )
    return config


def _quote(text: str) -> str:
    # Names come from clients: control characters are shown escaped, never written raw to logs.
    return f"'{text}'" if text.isprintable() else repr(text)


def _missing_config(model: str) -> TritonError:
    # Triton's rule: the files form the whole model folder, and the config is its config.pbtxt.
    return invalid_arg(
        f"load parameter '{CONFIG_PARAMETER}' must be specified for model file override "
        f"(model {_quote(model)})"
    )


def _file_path(name: str, model: str) -> str:
    """The file's path in the model folder, as Triton joins it there (a leading '/', './' and
    empty components fall away); "" for the config.pbtxt the 'config' parameter writes."""
    path = name.removeprefix(FILE_PREFIX)
    problem = _path_problem(path)
    if problem is not None:
        raise _parameter_error(name, model, problem)
    path = _joined(path)
    return "" if path == CONFIG_FILENAME else path


def _joined(path: str) -> str:
    """`path` as Triton joins it inside the model folder: without a leading '/', './' or
    empty components."""
    return "/".join(part for part in path.split("/") if part not in ("", "."))


def _parameter_error(name: str, model: str, problem: str) -> TritonError:
    return invalid_arg(
        f"invalid load parameter {_quote(name)} for model {_quote(model)}: {problem}"
    )


def _file_content(name: str, value: object, model: str, base64_files: bool) -> bytes:
    if not base64_files:
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise _parameter_error(name, model, f"the content must be bytes, not {_kind(value)}")
        return bytes(value)
    if not isinstance(value, str):
        raise _parameter_error(
            name, model, f"the content must be a base64 string, not {_kind(value)}"
        )
    # Line breaks are tolerated: `base64` tools wrap their output; and, as by Triton, missing
    # '=' padding at the end.
    value = value.translate(_BASE64_WHITESPACE)
    try:
        return base64.b64decode(value + "=" * (-len(value) % 4), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise _parameter_error(name, model, f"the content is not valid base64: {exc}") from None


def _path_problem(path: str) -> str | None:
    if ".." in path.split("/"):
        return "'..' is not allowed: files must stay inside the model folder"
    if not _joined(path):
        return "the file path is empty"
    if path.endswith("/"):
        return "the file path names a folder, not a file"
    if "\\" in path:
        return "backslashes are not allowed in file paths; separate folders with '/'"
    if any(ord(char) < 0x20 or char == "\x7f" for char in path):
        return "control characters (NUL included) are not allowed in file paths"
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return "the file path is not valid UTF-8"
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if any(len(part.encode("utf-8")) > _MAX_NAME_BYTES for part in parts):
        return f"a path component is longer than {_MAX_NAME_BYTES} bytes"
    if parts[0] == CONFIG_FILENAME and len(parts) > 1:
        return f"{CONFIG_FILENAME} is written from the '{CONFIG_PARAMETER}' parameter"
    return None


def _check_layout(paths: Iterable[str], model: str) -> None:
    # A path that is also a folder of another ("1" and "1/model.onnx") cannot be written.
    files: set[str] = set()
    for path in paths:
        if path in files:
            raise _parameter_error(FILE_PREFIX + path, model, "the file is given twice")
        files.add(path)
    for path in sorted(files):
        parts = path.split("/")
        for end in range(1, len(parts)):
            folder = "/".join(parts[:end])
            if folder in files:
                raise _parameter_error(
                    FILE_PREFIX + path,
                    model,
                    f"{_quote(FILE_PREFIX + folder)} is a file, so it cannot also be a folder",
                )


def _check_model_name(model: str) -> None:
    # The name becomes a folder name: it must be one path component the scanner will read
    # (it skips hidden folders), and fit beside the digest.
    problem = None
    if not model.strip():
        problem = "is empty"
    elif model.startswith("."):
        problem = "starts with '.'"
    elif "/" in model or "\\" in model:
        problem = "contains a path separator"
    elif any(ord(char) < 0x20 or char == "\x7f" for char in model):
        problem = "contains control characters"
    else:
        try:
            if len(model.encode("utf-8")) > _MAX_MODEL_NAME_BYTES:
                problem = f"is longer than {_MAX_MODEL_NAME_BYTES} bytes"
        except UnicodeEncodeError:
            problem = "is not valid UTF-8"
    if problem is not None:
        raise invalid_arg(
            f"model name {_quote(model)} cannot be used with file overrides: it {problem}"
        )


def check_file_override(options: LoadOptions, model: str) -> ModelConfig:
    """The checks `parse_load_parameters` makes of a file override (config, model name, paths,
    layout), made again on `options` (which may have been built by hand); returns its config."""
    if options.config_json is None:
        raise _missing_config(model)
    _check_model_name(model)
    for path, _ in options.files:
        problem = _path_problem(path)
        if problem is None and (path != _joined(path) or path == CONFIG_FILENAME):
            problem = "the path is not one `parse_load_parameters` gives"
        if problem is not None:
            raise _parameter_error(FILE_PREFIX + path, model, problem)
    _check_layout((path for path, _ in options.files), model)
    return _checked_config(options.config_json, model)


# ---------------------------------------------------------------------------------------------
# Digest


def options_digest(options: LoadOptions) -> str:
    """A digest of the override: equal for equal configs (whatever their JSON spelling) and
    equal files (whatever their order)."""
    digest = hashlib.sha256(b"tritonactor load override 1\n")
    if options.config_json is None:
        digest.update(b"-")
    else:
        config = config_to_json(config_from_json(options.config_json))
        canonical = json.dumps(config, sort_keys=True, separators=(",", ":"))
        encoded = canonical.encode("utf-8")
        digest.update(_frame_header(b"c", encoded))
        digest.update(encoded)
    for path, content in sorted(options.files):
        encoded_path = path.encode("utf-8")
        digest.update(_frame_header(b"p", encoded_path))
        digest.update(encoded_path)
        digest.update(_frame_header(b"f", content))
        digest.update(content)
    return digest.hexdigest()[:_DIGEST_CHARS]


def _frame_header(tag: bytes, data: bytes) -> bytes:
    # Every field is tagged and length-prefixed, so no two different overrides hash the same
    # byte stream.
    return tag + len(data).to_bytes(8, "big")
