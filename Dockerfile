# tritonactor on the CPU: HTTP 8000, gRPC 8001, metrics 8002.
#
#   docker build -t tritonactor .
#   docker run --init -p 8000-8002:8000-8002 tritonactor                      # the bundled examples
#   docker run --init --shm-size 1g -p 8000-8002:8000-8002 -v "$PWD/models:/models:ro" tritonactor
#
# --shm-size: Python backend models exchange tensors through /dev/shm (Docker's default: 64 MB).
#
# Arguments after the image name are `tritonactor serve` flags (tritonserver's names), e.g.
# `--model-control-mode explicit --load-model simple`. Set the HTTP port and address with
# `-e TRITONACTOR_HTTP_PORT=...` rather than `--http-port`: the HEALTHCHECK runs apart from the
# server and reads the container's environment only. compose.yaml runs it beside Jaeger,
# Prometheus and Grafana; docs/operations.md walks through both.

ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim AS build
# Must equal the torch pin of the `cpu` extra in pyproject.toml (tests/test_deploy.py checks).
ARG TORCH_VERSION=2.13.0
# PyPI's Linux torch wheel depends on several GB of CUDA libraries; the CPU build satisfies the
# same `torch==X` pin (its `+cpu` local version matches it) at a fraction of the size.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# Its own layer, before the sources are copied: editing the code does not download torch again.
RUN pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY tritonactor ./tritonactor
# The OTLP exporter compose.yaml's OTEL_EXPORTER_OTLP_PROTOCOL (http/protobuf) needs: the server
# imports it only when tracing is configured, so the package does not depend on it.
RUN pip install ".[cpu]" "opentelemetry-exporter-otlp-proto-http>=1.27"

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
