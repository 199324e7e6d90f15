"""Small TorchScript models for tests, built with `torch.jit.script` / `torch.jit.trace`.

Every builder writes one `model.pt` and returns its path (creating folders):

    add_sub_model(tmp_path / "simple/1/model.pt")        # (a + b, a - b)
    named_add_sub_model(path)                           # forward(self, left, right)
    dict_output_model(path)                             # {"SUM": a + b, "DIFF": a - b}
    failing_model(path)                                 # raises when any input element < 0
"""

from __future__ import annotations

from pathlib import Path

import torch

__all__ = [
    "add_sub_model",
    "dict_input_model",
    "dict_output_model",
    "failing_model",
    "named_add_sub_model",
    "save",
    "string_upper_model",
    "traced_add_sub_model",
    "wrong_dtype_model",
]


def save(module: torch.nn.Module, path: Path | str) -> Path:
    """Script `module` (unless it already is TorchScript) and save it to `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    scripted = module if isinstance(module, torch.jit.ScriptModule) else torch.jit.script(module)
    scripted.save(str(path))
    return path


class _AddSub(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return a + b, a - b


class _NamedAddSub(torch.nn.Module):
    def forward(self, left: torch.Tensor, right: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return left + right, left - right


class _DictOutput(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"SUM": a + b, "DIFF": a - b}


class _DictInput(torch.nn.Module):
    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return inputs["X"] * inputs["Y"]


class _Failing(torch.nn.Module):
    def forward(self, a: torch.Tensor) -> torch.Tensor:
        if bool((a < 0).any()):
            raise RuntimeError("negative input")
        return a


class _WrongDtype(torch.nn.Module):
    def forward(self, a: torch.Tensor) -> torch.Tensor:
        return a.to(torch.float64)


class _StringUpper(torch.nn.Module):
    def forward(self, text: list[str]) -> list[str]:
        return [item.upper() for item in text]


def add_sub_model(path: Path | str) -> Path:
    """forward(a, b) -> (a + b, a - b): Triton's `simple` model, for INPUT__0/INPUT__1 ->
    OUTPUT__0/OUTPUT__1 configs of any numeric type and shape."""
    return save(_AddSub(), path)


def traced_add_sub_model(path: Path | str, example: torch.Tensor) -> Path:
    """The same as `add_sub_model`, built by tracing with `example` for both inputs."""
    traced = torch.jit.trace(_AddSub(), (example, example))
    return save(traced, path)


def named_add_sub_model(path: Path | str) -> Path:
    """forward(left, right) -> (left + right, left - right): bind inputs by argument name."""
    return save(_NamedAddSub(), path)


def dict_output_model(path: Path | str) -> Path:
    """forward(a, b) -> {"SUM": a + b, "DIFF": a - b}: outputs bound by name."""
    return save(_DictOutput(), path)


def dict_input_model(path: Path | str) -> Path:
    """forward({"X": x, "Y": y}) -> x * y: a single Dict[str, Tensor] argument."""
    return save(_DictInput(), path)


def failing_model(path: Path | str) -> Path:
    """forward(a) -> a, raising RuntimeError("negative input") when any element is < 0."""
    return save(_Failing(), path)


def wrong_dtype_model(path: Path | str) -> Path:
    """forward(a) -> a as float64, whatever the config says."""
    return save(_WrongDtype(), path)


def string_upper_model(path: Path | str) -> Path:
    """forward(text: List[str]) -> [s.upper() for s in text]."""
    return save(_StringUpper(), path)
