# Sourced by run_gpu_checks.sh (and its CPU test): run each step under its own time limit, record it, and
# rewrite $OUT/summary.json after it, so a run cut short (by a step's limit, the budget or the device's own
# limit) still returns every figure that finished.
# Needs: OUT, BUDGET (s), T0 (date +%s at the start), BASE_PY (a python3), DEVICE, LIMIT (for `run`); sets STATUS
# and LAST_RC.
STATUS=${STATUS:-0}
LAST_RC=0
SUMMARY_PY=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/summary.py

# PLAN_GIB[NAME]: the device memory a step plans to use (run_gpu_checks.sh); none: nothing to check
if ! declare -p PLAN_GIB > /dev/null 2>&1; then declare -A PLAN_GIB=(); fi

# free_gib: free memory of the device in GiB (nothing printed when there is no NVIDIA device to ask)
free_gib() {
  command -v nvidia-smi > /dev/null 2>&1 || return 0
  nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits -i "${CUDA_VISIBLE_DEVICES:-0}" 2>/dev/null \
    | head -n 1 | awk '$1 ~ /^[0-9]+$/ {printf "%d", $1 / 1024}'  # "[N/A]" (a MIG slice): nothing to check
}

# skip NAME REASON: record a step that did not run, and why
skip() {
  echo "== $1: skipped, $2"
  printf '{"step": "%s", "skipped": true, "reason": "%s", "left_s": %d}\n' "$1" "$2" \
    "$((BUDGET - ($(date +%s) - T0)))" >> "$OUT/steps.jsonl"
  STATUS=1
  LAST_RC=124
  summarize
}

# step NAME MAX_SECONDS COMMAND...: run it under min(MAX, what is left of the budget), log it, record it; a step
# whose memory plan (PLAN_GIB) exceeds the device's free memory is skipped with the reason, never run out of memory
step() {
  local name=$1 max=$2; shift 2
  local left=$((BUDGET - ($(date +%s) - T0)))
  if ((left < 20)); then
    skip "$name" "${left}s of the ${BUDGET}s budget left"
    return
  fi
  local plan=${PLAN_GIB[$name]:-0} free
  free=$(free_gib)
  if ((plan > 0)) && [ -n "$free" ] && ((plan > free)); then
    skip "$name" "its memory plan is ${plan} GiB and the device has ${free} GiB free"
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
# GPU_CHECK_ARCHIVE=FILE: also pack everything under $OUT into FILE (a .tar.gz, rewritten each time), for a
# device tool that returns only a few files
summarize() {
  "$BASE_PY" "$SUMMARY_PY" "$OUT" "$DEVICE" "$(($(date +%s) - T0))" "$STATUS" "$@" \
    || echo "summary.json could not be written" >&2
  if [ -n "${GPU_CHECK_ARCHIVE:-}" ]; then
    tar -czf "$GPU_CHECK_ARCHIVE.tmp" -C "$OUT" . && mv "$GPU_CHECK_ARCHIVE.tmp" "$GPU_CHECK_ARCHIVE" \
      || echo "$GPU_CHECK_ARCHIVE could not be written" >&2
  fi
}

# run STEP COMMAND...: `step` with the step's LIMIT; GPU_CHECK_INJECT=STEP replaces its command by a failure;
# a step named in GPU_CHECK_SKIP (space-separated) is recorded as skipped (a rerun leaves out what already passed)
run() {
  local name=$1; shift
  if [[ " ${GPU_CHECK_SKIP:-} " == *" $name "* ]]; then
    skip "$name" "named in GPU_CHECK_SKIP"
  elif [ "${GPU_CHECK_INJECT:-}" = "$name" ]; then
    step "$name" "${LIMIT[$name]}" bash -c "echo 'RuntimeError: injected failure of $name (GPU_CHECK_INJECT)' >&2; exit 1"
  else
    step "$name" "${LIMIT[$name]}" "$@"
  fi
}
