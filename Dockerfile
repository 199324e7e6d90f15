# tritonactor: HTTP 8000, gRPC 8001, metrics 8002.
#
#   docker build -t tritonactor:local .                                     # CPU (the `cpu` extra)
#   docker build --build-arg EXTRA=gpu -t tritonactor:local-gpu .           # NVIDIA GPUs (`gpu`)
#   docker run --init -p 8000-8002:8000-8002 tritonactor:local              # the bundled examples
#   docker run --init --shm-size 1g -p 8000-8002:8000-8002 -v "$PWD/models:/models:ro" tritonactor:local
#   docker run --init --gpus all -p 8000-8002:8000-8002 tritonactor:local-gpu
#
# The two tags are the images compose.yaml (tritonactor:local) and the Kubernetes overlays
# (deploy/kubernetes/overlays/cpu and gpu) run. Both images carry the `s3` extra, so
# `--model-repository=s3://bucket/path` works in either.
#
# The GPU image is the same slim Python base: PyPI's CUDA builds of torch, TensorRT and
# onnxruntime-gpu bring their CUDA libraries as wheels, and the host's NVIDIA container toolkit
# (or the Kubernetes device plugin) brings the driver. No CUDA base image is needed. The build
# must reach https://pypi.nvidia.com: PyPI's TensorRT library packages download their wheels
# from there while they install.
#
# --shm-size: Python backend models exchange tensors through /dev/shm (Docker's default: 64 MB).
#
# Arguments after the image name are `tritonactor serve` flags (tritonserver's names), e.g.
# `--model-control-mode explicit --load-model simple`. Set the HTTP port and address with
# `-e TRITONACTOR_HTTP_PORT=...` rather than `--http-port`: the HEALTHCHECK runs apart from the
# server and reads the container's environment only. compose.yaml runs it beside Jaeger,
# Prometheus and Grafana; docs/operations.md walks through both, docs/kubernetes.md the cluster.

ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim AS build
# The package's hardware extra: cpu (ONNX Runtime, PyTorch's CPU build) or gpu (onnxruntime-gpu,
# TensorRT, PyTorch's CUDA build, NVML).
ARG EXTRA=cpu
# Must equal the torch pin of the `cpu` extra in pyproject.toml (tests/test_deploy.py checks).
ARG TORCH_VERSION=2.13.0
# PyPI's Linux torch wheel depends on several GB of CUDA libraries; for the cpu extra the CPU
# build satisfies the same `torch==X` pin (its `+cpu` local version matches it) at a fraction of
# the size. The gpu extra takes PyPI's CUDA wheel.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# Its own layer, before the sources are copied: editing the code does not download torch again.
RUN if [ "${EXTRA}" = gpu ]; then pip install "torch==${TORCH_VERSION}"; \
    else pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"; fi
WORKDIR /src
COPY pyproject.toml README.md ./
COPY tritonactor ./tritonactor
# s3: fsspec's S3 filesystem, for model repositories in object storage.
RUN pip install ".[${EXTRA},s3]"

FROM python:${PYTHON_VERSION}-slim
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    TRITONACTOR_MODEL_REPOSITORY=/models \
    TRITONACTOR_JOURNAL=/var/lib/tritonactor/journal.jsonl
COPY --from=build /opt/venv /opt/venv
# A fixed uid, so that a host folder mounted for the journal can be given to it (chown 10001).
RUN useradd --system --uid 10001 --user-group --create-home --home-dir /home/tritonactor \
        tritonactor \
    && mkdir -p /var/lib/tritonactor \
    && chown tritonactor:tritonactor /var/lib/tritonactor
# The bundled examples, so that the image serves something with no volume; mounting a
# repository on /models replaces them.
COPY --chown=tritonactor:tritonactor tritonactor/examples/models /models
# A named volume mounted here starts with this folder's owner, so the journal stays writable.
VOLUME ["/var/lib/tritonactor"]
USER tritonactor
WORKDIR /home/tritonactor
EXPOSE 8000 8001 8002
# The slim image has no curl; the venv's Python asks the liveness endpoint on whatever HTTP port
# the settings give. A long start period: a large repository takes a while to load.
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/v2/health/live' % os.environ.get('TRITONACTOR_HTTP_PORT', '8000'), timeout=2)"]
# `serve` starts the engine, then execs the ASGI server (uvicorn), which is PID 1's child under
# --init (or PID 1 without it) and receives the runtime's SIGTERM directly; the engine is
# told to stop when that process ends.
ENTRYPOINT ["tritonactor", "serve"]
