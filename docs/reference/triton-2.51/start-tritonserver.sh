#!/bin/bash
# Usage: start.sh [none|explicit]   (default none)
MODE=${1:-none}
O=/tmp/oracle
SP=$O/venv/lib/python3.11/site-packages
export LD_LIBRARY_PATH=$SP/nvidia_pytriton.libs
export PYTHONPATH=$SP            # numpy for the python-backend stub (stub links system libpython3.11)
export PATH=$O/venv/bin:$PATH
EXTRA=""
if [ "$MODE" = explicit ]; then EXTRA="--load-model=simple"; fi
# $O/triton = copy of pytriton/tritonserver/{bin,backends,caches} + python_backend_stubs/3.11/triton_python_backend_stub -> backends/python/
exec $O/triton/bin/tritonserver \
  --model-repository=$O/repo \
  --model-control-mode=$MODE $EXTRA \
  --backend-directory=$O/triton/backends \
  --cache-directory=$O/triton/caches \
  --http-address=127.0.0.1 --http-port=18000 \
  --grpc-address=127.0.0.1 --grpc-port=18001 \
  --metrics-address=127.0.0.1 --metrics-port=18002 \
  --allow-metrics=true --allow-gpu-metrics=false --allow-cpu-metrics=true \
  --exit-on-error=false --strict-readiness=true \
  --log-verbose=0
