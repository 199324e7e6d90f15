"""The parameters of explicit-mode load and unload requests, and the folder a file override is
served from.

Everything a client sends is checked here, before anything touches the disk: a rejected request
writes nothing. A load with `file:` parameters is served from a folder of its own under the
server's state directory, `<root>/<model>-<digest>/<model>/`, so `<root>/<model>-<digest>` is a
one-model repository that `scan_repositories` reads like any other. The digest covers the config
and every file, so the same override always maps to the same folder and a restarted server finds
it again from the digest its journal recorded. The folder is held from here until the load
that asked for it is done, and by each version loaded from it; it is removed once nothing holds
it (`override_folders`).
"""

from __future__ import annotations

import base64
import binascii
import errno
import hashlib
import json
import os
import stat
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import betterproto2
from google.protobuf import message_factory, text_format

from tritonactor._proto.inference import ModelConfig, ModelRepositoryParameter
from tritonactor.config.model_config import ConfigError, config_from_json, config_to_json
from tritonactor.control.override_folders import (
    PARTIAL_SUFFIX,
    folder_lock,
    hold,
    remove_entry,
)
from tritonactor.control.repository import CONFIG_FILENAME
from tritonactor.core.errors import TritonError, internal, invalid_arg
from tritonactor.core.json_depth import DEFAULT_JSON_DEPTH, check_json_depth

__all__ = [
    "CONFIG_PARAMETER",
    "FILE_PREFIX",
    "UNLOAD_DEPENDENTS_PARAMETER",
    "LoadOptions",
    "UnloadOptions",
    "materialize",
    "options_digest",
    "override_model_folder",
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
_DIR_MODE = 0o700
_FILE_MODE = 0o600
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_CREATE_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_BASE64_WHITESPACE = str.maketrans("", "", " \t\r\n")

_PROTOBUF_CONFIG = message_factory.GetMessageClass(ModelConfig.DESCRIPTOR)


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
    paths = [_file_path(name, model) for name in file_names]
    _check_layout(paths, model)
    files = [
        (path, _file_content(name, _unwrap(parameters[name]), model, base64_files))
        for path, name in zip(paths, file_names, strict=True)
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
        raise invalid_arg(
            f"load parameter '{CONFIG_PARAMETER}' names model {_quote(config.name)}, but the "
            f"request loads {_quote(model)}; leave the name out or make them equal"
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
    path = name.removeprefix(FILE_PREFIX)
    problem = _path_problem(path)
    if problem is not None:
        raise _parameter_error(name, model, problem)
    return path


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
    # Line breaks are tolerated: `base64` tools wrap their output.
    try:
        return base64.b64decode(value.translate(_BASE64_WHITESPACE), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise _parameter_error(name, model, f"the content is not valid base64: {exc}") from None


def _path_problem(path: str) -> str | None:
    if not path:
        return "the file path is empty"
    if path.startswith("/"):
        return "the file path must be relative to the model folder"
    if "\\" in path:
        return "backslashes are not allowed in file paths; separate folders with '/'"
    if any(ord(char) < 0x20 or char == "\x7f" for char in path):
        return "control characters (NUL included) are not allowed in file paths"
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return "the file path is not valid UTF-8"
    parts = path.split("/")
    if ".." in parts:
        return "'..' is not allowed: files must stay inside the model folder"
    if any(part in ("", ".") for part in parts):
        return "empty and '.' path components are not allowed"
    if any(len(part.encode("utf-8")) > _MAX_NAME_BYTES for part in parts):
        return f"a path component is longer than {_MAX_NAME_BYTES} bytes"
    if parts[0] == CONFIG_FILENAME:
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


# ---------------------------------------------------------------------------------------------
# The override folder


def override_model_folder(root: Path, model: str, digest: str) -> Path:
    """Where the override with `digest` of `model` lives; its parent is a one-model repository."""
    return root / f"{model}-{digest}" / model


def materialize(options: LoadOptions, model: str, root: Path) -> Path:
    """Write a file override as `<root>/<model>-<digest>/<model>/` and return that model folder.

    The folder appears whole or not at all (written in a hidden sibling, then renamed), holds
    config.pbtxt written from the config JSON beside the given files, and is reused when it
    already exists with the same content. No symlink is followed or created: a link found where
    the folder belongs is removed, never written through. Folders are 0700, files 0600.
    The folder returned is held for the load (`override_folders.release` once it is done).
    """
    if not options.files:
        raise ValueError("only a load with file overrides needs a folder of its own")
    if options.config_json is None:
        raise _missing_config(model)
    _check_model_name(model)
    for path, _ in options.files:
        problem = _path_problem(path)
        if problem is not None:
            raise _parameter_error(FILE_PREFIX + path, model, problem)
    _check_layout((path for path, _ in options.files), model)
    pbtxt = _config_pbtxt(_checked_config(options.config_json, model), model)

    digest = options_digest(options)
    folder = override_model_folder(root, model, digest)
    try:
        _write_override(root, folder.parent, digest, model, pbtxt, options.files)
    except OSError as exc:
        raise internal(f"cannot write the file override of model {_quote(model)}: {exc}") from None
    return folder


def _config_pbtxt(config: ModelConfig, model: str) -> bytes:
    if not config.name:
        config.name = model
    message = _PROTOBUF_CONFIG.FromString(bytes(config))
    return text_format.MessageToString(message).encode("utf-8")


def _write_override(
    root: Path,
    repository: Path,
    digest: str,
    model: str,
    pbtxt: bytes,
    files: tuple[tuple[str, bytes], ...],
) -> None:
    root.mkdir(mode=_DIR_MODE, parents=True, exist_ok=True)
    # Checked and held under the folders' lock: a removal cannot slip in between.
    with folder_lock():
        if _is_intact(repository, model, pbtxt, files):
            hold(repository, model)
            return
    staging = Path(tempfile.mkdtemp(prefix=f".{digest}.", suffix=PARTIAL_SUFFIX, dir=root))
    try:
        _write_tree(staging, model, pbtxt, files)
        with folder_lock():
            _move_into_place(staging, repository, model, pbtxt, files)
            hold(repository, model)
        _fsync_directory(root)
    finally:
        if os.path.lexists(staging):
            remove_entry(staging)


def _write_tree(
    staging: Path, model: str, pbtxt: bytes, files: tuple[tuple[str, bytes], ...]
) -> None:
    opened: dict[str, int] = {}
    try:
        opened[""] = os.open(staging, _OPEN_DIR)
        model_fd = _make_directory(opened[""], model)
        opened[model] = model_fd
        _write_file(model_fd, CONFIG_FILENAME, pbtxt)
        for path, content in files:
            parent_fd = model_fd
            parts = path.split("/")
            for end in range(1, len(parts)):
                key = f"{model}/{'/'.join(parts[:end])}"
                if key not in opened:
                    opened[key] = _make_directory(parent_fd, parts[end - 1])
                parent_fd = opened[key]
            _write_file(parent_fd, parts[-1], content)
        # Deepest folders first, so each folder's entries are durable before its parent's.
        for key in sorted(opened, key=lambda name: name.count("/"), reverse=True):
            os.fsync(opened[key])
    finally:
        for fd in opened.values():
            os.close(fd)


def _make_directory(parent_fd: int, name: str) -> int:
    os.mkdir(name, _DIR_MODE, dir_fd=parent_fd)
    fd = os.open(name, _OPEN_DIR, dir_fd=parent_fd)
    try:
        os.fchmod(fd, _DIR_MODE)  # exact, whatever the umask
    except OSError:
        os.close(fd)
        raise
    return fd


def _write_file(parent_fd: int, name: str, content: bytes) -> None:
    fd = os.open(name, _CREATE_FILE, _FILE_MODE, dir_fd=parent_fd)
    with open(fd, "wb", closefd=True) as stream:
        os.fchmod(fd, _FILE_MODE)
        stream.write(content)
        stream.flush()
        os.fsync(fd)


def _move_into_place(
    staging: Path,
    repository: Path,
    model: str,
    pbtxt: bytes,
    files: tuple[tuple[str, bytes], ...],
) -> None:
    try:
        os.rename(staging, repository)
        return
    except OSError as exc:
        if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR):
            raise
    # Something holds the name: the same override written meanwhile (keep it), or a stale or
    # foreign entry, a symlink included (remove the entry itself, never what it points to).
    if _is_intact(repository, model, pbtxt, files):
        return
    remove_entry(repository)
    os.rename(staging, repository)


def _is_intact(
    repository: Path, model: str, pbtxt: bytes, files: tuple[tuple[str, bytes], ...]
) -> bool:
    """Whether `repository` is a real folder holding exactly this override: the same entries
    (no link, nothing extra: an extra version folder would be served), files of the right
    sizes, the same config.pbtxt. Model files are not read again: the digest in the name
    vouches for what was renamed into place."""
    try:
        repository_fd = os.open(repository, _OPEN_DIR)
    except OSError:
        return False
    try:
        found: dict[str, int] = {}
        _list_entries(repository_fd, "", found)
        if found != _expected_entries(model, pbtxt, files):
            return False
        model_fd = os.open(model, _OPEN_DIR, dir_fd=repository_fd)
        try:
            return _read_regular_file(model_fd, CONFIG_FILENAME) == pbtxt
        finally:
            os.close(model_fd)
    except OSError:
        return False
    finally:
        os.close(repository_fd)


_FOLDER = -1
_NOT_OURS = -2  # a symlink, FIFO, socket or device: materialize never writes one


def _expected_entries(
    model: str, pbtxt: bytes, files: tuple[tuple[str, bytes], ...]
) -> dict[str, int]:
    expected = {f"{model}/": _FOLDER, f"{model}/{CONFIG_FILENAME}": len(pbtxt)}
    for path, content in files:
        parts = path.split("/")
        for end in range(1, len(parts)):
            expected[f"{model}/{'/'.join(parts[:end])}/"] = _FOLDER
        expected[f"{model}/{path}"] = len(content)
    return expected


def _list_entries(directory_fd: int, prefix: str, found: dict[str, int]) -> None:
    """Every entry below the folder: relative path -> size, `_FOLDER` or `_NOT_OURS`."""
    with os.scandir(directory_fd) as entries:
        for entry in entries:
            relative = prefix + entry.name
            if entry.is_dir(follow_symlinks=False):
                found[relative + "/"] = _FOLDER
                child_fd = os.open(entry.name, _OPEN_DIR, dir_fd=directory_fd)
                try:
                    _list_entries(child_fd, relative + "/", found)
                finally:
                    os.close(child_fd)
            elif entry.is_file(follow_symlinks=False):
                found[relative] = entry.stat(follow_symlinks=False).st_size
            else:
                found[relative] = _NOT_OURS


def _read_regular_file(parent_fd: int, name: str) -> bytes | None:
    # O_NONBLOCK: should a FIFO have replaced the file meanwhile, opening it must not hang.
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    fd = os.open(name, flags, dir_fd=parent_fd)
    with open(fd, "rb", closefd=True) as stream:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return stream.read()


def _fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
