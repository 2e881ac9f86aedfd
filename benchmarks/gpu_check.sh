#!/usr/bin/env bash
# Prepared GPU check (about ten minutes at most): Triton kernels vs the reference in bf16 on the GPU,
# then prefill 32k/64k/128k and decode 32k/128k timings vs SDPA flash (and flash-attn 2 if installed),
# density 0.1/0.2/0.3. Prints tables; writes $OUT/gpu_check.json when OUT is set.
# Usage: benchmarks/gpu_check.sh [--skip-check] [--prefill N ...] [--decode N ...] [--density R ...]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
if [ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ]; then PY=.venv/bin/python; fi
if ! "$PY" -c "import sketchwalk.kernels" 2>/dev/null; then
  "$PY" -m pip install -q --no-deps --no-build-isolation -e . || export PYTHONPATH="$PWD:${PYTHONPATH:-}"
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
exec timeout "${GPU_CHECK_TIMEOUT:-590}" "$PY" benchmarks/gpu_check.py "$@"
