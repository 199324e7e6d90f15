"""Project hygiene CI enforces: lint, formatting, generated code in step with the protos, no
import cycles, no exception raised inside `except*`."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff is not installed")
def test_ruff_check_is_clean() -> None:
    result = run("ruff", "check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff is not installed")
def test_ruff_format_is_clean() -> None:
    result = run("ruff", "format", "--check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_generated_protobuf_code_is_up_to_date() -> None:
    result = run(sys.executable, "protos/generate.py", "--check")
    assert result.returncode == 0, (
        "tritonactor/_proto is stale; run `python protos/generate.py`\n" + result.stdout
    )


def module_imports() -> dict[str, set[str]]:
    """Each tritonactor module and the tritonactor modules it imports anywhere in its source
    (TYPE_CHECKING and function-level imports included: a cycle there is a cycle of design)."""
    import ast

    package = ROOT / "tritonactor"
    names = {
        ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): path
        for path in package.rglob("*.py")
        if "_proto" not in path.parts
    }
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                # `from package import module` depends on the module; `from module import
                # name` on the module.
                submodules = [f"{node.module}.{a.name}" for a in node.names]
                targets = [t for t in submodules if t in names]
                if len(targets) < len(submodules):
                    targets.append(node.module)
            else:
                continue
            found.update(t for t in targets if t in names and t != name)
        graph[name] = found
    return graph


def test_no_import_cycles() -> None:
    graph = module_imports()
    cycles = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                cycles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)
    assert cycles == [], "\n".join(" -> ".join(cycle) for cycle in cycles)


def raises_inside_except_star(tree: ast.AST) -> list[int]:
    """The lines of `raise <exception>` statements inside an `except*` clause (a bare `raise`,
    which re-raises the clause's own group, is not one of them). A function defined inside a
    clause counts too, though it might run after the clause: cautious, and there is none."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.TryStar):
            for handler in node.handlers:
                for inner in ast.walk(handler):
                    if isinstance(inner, ast.Raise) and inner.exc is not None:
                        lines.append(inner.lineno)
    return lines


def test_no_exception_is_raised_inside_an_except_star_clause() -> None:
    """CPython before 3.11.4 wraps an exception raised inside `except*` in a new exception
    group (gh-103590): grpclib answered such a stream's status UNKNOWN on 3.11.2. The
    code catches the group with a plain `except` instead (docs/decisions.md)."""
    assert raises_inside_except_star(
        ast.parse("try:\n    pass\nexcept* ValueError as e:\n    raise e.exceptions[0]\n")
    ) == [4]
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in sorted((ROOT / "tritonactor").rglob("*.py"))
        for line in raises_inside_except_star(ast.parse(path.read_text(), str(path)))
    ]
    assert found == []
