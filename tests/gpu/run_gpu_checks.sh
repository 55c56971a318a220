#!/usr/bin/env bash
# Device checks for a session lent a CUDA GPU, in one run of under 5 minutes on an H100/H200:
#   1. `worldstep bench gpu`: Cosmos3-Edge at full size, random bf16 weights, 480p, one 16-action
#      window per setting (4 and 30 steps, with and without CFG): ms per denoise step / commit /
#      decode, MFU, real-time factor. Figures land in $OUT/bench_gpu.json.
#   2. every tests/gpu/check_*.py script (each exits non-zero on a failed check).
# Usage: tests/gpu/run_gpu_checks.sh            (PY=python of the env, OUT=folder for the results)
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python )}
OUT=${OUT:-runs/gpu}
mkdir -p "$OUT"
status=0

echo "== bench gpu"
if ! timeout 300 "$PY" -m worldstep.bench gpu --json "$OUT/bench_gpu.json" 2>&1 | tee "$OUT/bench_gpu.txt"; then
  echo "bench gpu FAILED"; status=1
fi

for check in tests/gpu/check_*.py; do
  echo "== $check"
  if ! timeout 300 "$PY" "$check" 2>&1 | tee "$OUT/$(basename "$check" .py).txt"; then
    echo "$check FAILED"; status=1
  fi
done
exit $status
