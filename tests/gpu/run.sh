#!/usr/bin/env bash
# The GPU check, in one command on a CUDA machine (a few minutes, most of it pip):
#
#     bash tests/gpu/run.sh               # a fresh venv with '.[gpu,test]', then tests/gpu
#     bash tests/gpu/run.sh --no-install  # an environment that already has them (offline)
#
# Paste its output into the Results section of docs/tensorrt-backend.md.
set -euo pipefail
cd "$(dirname "$0")/../.."

if [[ "${1:-}" != "--no-install" ]]; then
  venv="${VENV:-${TMPDIR:-/tmp}/tritonactor-gpu-venv}"
  "${PYTHON:-python3}" -m venv "$venv"
  # shellcheck disable=SC1091
  . "$venv/bin/activate"
  python -m pip install -q --upgrade pip
  python -m pip install -q -e '.[gpu,test]'
fi

echo "== versions"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || nvidia-smi || true
python --version
python -c 'import tensorrt; print("tensorrt", tensorrt.__version__)' || true
python -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
           "available", torch.cuda.is_available())' || true
python -c 'import onnxruntime as ort; print("onnxruntime", ort.__version__,
           ort.get_available_providers())' || true

echo "== tests/gpu"
python -m pytest tests/gpu -v -rs
