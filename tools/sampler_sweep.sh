#!/usr/bin/env bash
# Sampler sweep on the validation range: UniPC steps x flow_shift, shipped weights, policies section only.
set -u
cd "$(dirname "$0")/.."
OUT=${1:-runs/sweep}
mkdir -p "$OUT"
for steps in 4 8; do
  for shift in 1 2 3 5; do
    out=${OUT}/s${steps}_f${shift}
    [ -f $out/report.json ] && continue
    start=$(date +%s)
    .venv/bin/python -m worldstep.fidelity --checkpoint configs/models/pusher --split validation --sections policies \
      --episodes 50 --plan-episodes 0 --num-steps $steps --flow-shift $shift --workers 1 --threads 1 --out $out > $out.log 2>&1
    echo "steps=$steps shift=$shift rc=$? $(( $(date +%s) - start ))s" >> ${OUT}/done.txt
  done
done
