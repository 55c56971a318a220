#!/usr/bin/env bash
# The README's headline figures, every bench alone on an idle box, one after another (docs/performance.md lists
# them): each run records the load at its start, and the report refuses a headline taken above a 1-minute load of
# 1.5 (worldstep.bench.report). Before each run, waits (up to WAIT_S, default 600 s) for the load to fall below
# 1.2, so the previous run's own load does not carry into the next. Usage: tools/bench_headline.sh [BENCH...]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
export WORLDSTEP_CACHE=${WORLDSTEP_CACHE:-$PWD/.wscache}
declare -A RUNS=(
  [rollout]="rollout --threads 1 --scan-windows 64 --pipeline-windows 8 --json docs/bench/rollout.json"
  [decode]="decode --threads 1 --json docs/bench/decode.json"
  [vector]="vector --threads 1 --json docs/bench/vector.json"
  [vector_pusher]="vector --threads 1 --arch pusher --json docs/bench/vector_pusher.json"
  [soak]="soak --threads 1 --json docs/bench/soak.json"
  [profile]="profile --threads 1 --json docs/bench/profile.json"
  [view]="view --threads 1 --windows 16 --json docs/bench/view.json"
  [gpu]="gpu --json docs/bench/gpu.json"
  [serve]="serve --threads 1 --json docs/bench/serve.json"
)
ORDER=(rollout decode vector vector_pusher soak profile view gpu serve)
wait_idle() {
  local waited=0
  while awk '{exit !($1 >= 1.2)}' /proc/loadavg && [ "$waited" -lt "${WAIT_S:-600}" ]; do sleep 10; waited=$((waited + 10)); done
}
for name in "${@:-${ORDER[@]}}"; do
  wait_idle
  echo "bench $name (load $(cut -d' ' -f1 /proc/loadavg))"
  # shellcheck disable=SC2086
  $PY -m worldstep.bench ${RUNS[$name]}
done
$PY -m worldstep.bench.report docs/bench/*.json --update README.md --update docs/performance.md
