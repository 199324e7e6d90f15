"""Regenerate tritonactor/_proto from the .proto files in this folder (betterproto2 for grpclib).

    python protos/generate.py           # rewrite tritonactor/_proto
    python protos/generate.py --check   # exit 1 if tritonactor/_proto is stale

Needs the `dev` extra (grpcio-tools and betterproto2-compiler, pinned beside the runtime).
"""

from __future__ import annotations

import argparse
import filecmp
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PROTOS = Path(__file__).resolve().parent
TARGET = PROTOS.parent / "tritonactor" / "_proto"
OPTIONS = "client_generation=async,server_generation=async,google_protobuf_descriptors"


def generate(out: Path) -> None:
    sources = sorted(str(p.name) for p in PROTOS.glob("*.proto"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{PROTOS}",
            f"--python_betterproto2_out={out}",
            f"--python_betterproto2_opt={OPTIONS}",
            *sources,
        ],
        check=True,
        capture_output=True,
        cwd=PROTOS.parent,  # the compiler formats its output with the project's ruff settings
        # The compiler's plugin and ruff from this Python's environment, also when it is not
        # activated (`venv/bin/python -m pytest`).
        env={
            **os.environ,
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        },
    )


def stale_files(generated: Path, committed: Path) -> list[str]:
    names = {p.relative_to(generated) for p in generated.rglob("*") if p.is_file()}
    names |= {
        p.relative_to(committed)
        for p in committed.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    return sorted(
        str(name)
        for name in names
        if not (generated / name).is_file()
        or not (committed / name).is_file()
        or not filecmp.cmp(generated / name, committed / name, shallow=False)
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale generated files")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        generate(out)
        if args.check:
            stale = stale_files(out, TARGET)
            for name in stale:
                print(f"stale: tritonactor/_proto/{name}")
            return 1 if stale else 0
        shutil.rmtree(TARGET, ignore_errors=True)
        shutil.copytree(out, TARGET)
    print(f"regenerated {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
