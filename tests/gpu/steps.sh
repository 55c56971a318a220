# Sourced by run_gpu_checks.sh (and its CPU test): run each step under its own time limit, record it, and
# rewrite $OUT/summary.json after it, so a run cut short (by a step's limit, the budget or the device's own
# limit) still returns every figure that finished.
# Needs: OUT, BUDGET (s), T0 (date +%s at the start), BASE_PY (a python3), DEVICE; sets STATUS and LAST_RC.
STATUS=${STATUS:-0}
LAST_RC=0
SUMMARY_PY=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/summary.py

# step NAME MAX_SECONDS COMMAND...: run it under min(MAX, what is left of the budget), log it, record it
step() {
  local name=$1 max=$2; shift 2
  local left=$((BUDGET - ($(date +%s) - T0)))
  if ((left < 20)); then
    echo "== $name: skipped, ${left}s of the ${BUDGET}s budget left"
    printf '{"step": "%s", "skipped": true, "left_s": %d}\n' "$name" "$left" >> "$OUT/steps.jsonl"
    STATUS=1
    LAST_RC=124
    summarize
    return
  fi
  max=$((max * ${GPU_CHECK_TIME_SCALE:-1}))  # the dry run on a busy 2-core box scales every limit
  local limit=$((max < left ? max : left)) start=$(date +%s%N)
  echo "== $name (limit ${limit}s)"
  timeout -k 10 "$limit" "$@" 2>&1 | tail -c 300000 > "$OUT/logs/$name.log"
  local rc=${PIPESTATUS[0]}
  tail -n 8 "$OUT/logs/$name.log" | cut -c1-300
  local ms=$((($(date +%s%N) - start) / 1000000))
  printf '{"step": "%s", "rc": %d, "timed_out": %s, "seconds": %d.%03d, "limit_s": %d}\n' "$name" "$rc" \
    "$([ "$rc" = 124 ] || [ "$rc" = 137 ] && echo true || echo false)" $((ms / 1000)) $((ms % 1000)) "$limit" \
    >> "$OUT/steps.jsonl"
  ((rc == 0)) || STATUS=1
  LAST_RC=$rc
  summarize
}

# summarize [--final]: summary.json from what the steps wrote so far (headline figures first)
summarize() {
  "$BASE_PY" "$SUMMARY_PY" "$OUT" "$DEVICE" "$(($(date +%s) - T0))" "$STATUS" "$@" \
    || echo "summary.json could not be written" >&2
}
