#!/usr/bin/env bash
# The GPU checks in ONE run of at most 8 minutes on a bare, offline H100/H200 machine (`make gpu-check`):
#   setup             a venv over the image's python3 (--system-site-packages), the kit's wheels installed
#                     offline (--no-index --no-deps), worldstep from this checkout (--no-deps)
#   kit               versions; flashinfer modules prebuilt in the kit or cached (check_kit.py)
#   bench_sdpa        worldstep bench gpu on sdpa, no JIT needed: windows, official recipe, sessions 1 and 8
#   flashinfer_ready  loads flashinfer's modules (prebuilt) or compiles them into the run's one JIT cache
#   attention         check_attention.py: flashinfer vs sdpa vs fp32 at Edge geometry
#   cosmos3_backends  check_cosmos3_backends.py: Edge windows and a rollout, flashinfer vs sdpa
#   bench_flashinfer  worldstep bench gpu on flashinfer: windows, sessions 1/4/8, backends
# Every figure is JSON under $OUT (summary.json: each step's exit code, seconds and limit; logs/: output).
# A failed step makes the exit status 1 and the later steps still run; a step that would start past the
# run's budget is skipped and named in summary.json.
#
# Usage: tests/gpu/run_gpu_checks.sh [--device cpu --tiny]     (the CPU form is the kit's dry run)
# Env:   BASE_PY  python to build the venv over (python3)     GPU_KIT  the kit folder (gpukit)
#        OUT      figures (runs/gpu)                           GPU_CHECK_BUDGET_S  whole run (470)
#        WORK     venv, JIT cache, checkpoints (${TMPDIR:-/tmp}/worldstep-gpu)
#        GPU_CHECK_TIME_SCALE  multiplies every step's limit (1; the dry run on a CPU uses more)
set -uo pipefail
cd "$(dirname "$0")/../.."
DEVICE=cuda
TINY=()
while (($#)); do
  case $1 in
    --device) DEVICE=$2; shift 2 ;;
    --tiny) TINY=(--tiny); shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
BASE_PY=${BASE_PY:-python3}
KIT=$(realpath "${GPU_KIT:-gpukit}")
if [ ! -f "$KIT/MANIFEST.json" ]; then
  echo "no GPU kit at $KIT: run 'make gpu-kit' on the CPU machine and carry it (carry: [\"gpukit\"])" >&2
  exit 2
fi
OUT=$(mkdir -p "${OUT:-runs/gpu}" && realpath "${OUT:-runs/gpu}")
WORK=$(mkdir -p "${WORK:-${TMPDIR:-/tmp}/worldstep-gpu}" && realpath "${WORK:-${TMPDIR:-/tmp}/worldstep-gpu}")
BUDGET=${GPU_CHECK_BUDGET_S:-470}
T0=$(date +%s)
STATUS=0
mkdir -p "$OUT/logs" "$WORK"
: > "$OUT/steps.jsonl"

# step NAME MAX_SECONDS COMMAND...: run it under min(MAX, what is left of the budget), log it, record it
step() {
  local name=$1 max=$2; shift 2
  local left=$((BUDGET - ($(date +%s) - T0)))
  if ((left < 20)); then
    echo "== $name: skipped, ${left}s of the ${BUDGET}s budget left"
    printf '{"step": "%s", "skipped": true, "left_s": %d}\n' "$name" "$left" >> "$OUT/steps.jsonl"
    STATUS=1
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
}

# --- setup: a venv over the image's python, the kit and worldstep installed offline --------------------
VENV=$WORK/venv
PY=$VENV/bin/python
setup() {
  rm -rf "$VENV" "$WORK/build-tools"
  if "$BASE_PY" -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)'; then
    # The base is itself a venv (the dry run's stand-in image): lend its packages through a .pth, as
    # --system-site-packages does for a real interpreter, and nothing else of the machine's.
    "$BASE_PY" -m venv --without-pip "$VENV" || return 1
    local base_site site
    base_site=$("$BASE_PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "import site; site.addsitedir('$base_site')" > "$site/_base_image.pth"
  else
    "$BASE_PY" -m venv --without-pip --system-site-packages "$VENV" || return 1
  fi
  local pip=("$PY" "$(ls "$KIT"/tools/pip-*.whl)/pip" --disable-pip-version-check)
  "${pip[@]}" install -q --no-index --no-deps "$KIT"/wheels/*.whl || return 1
  "${pip[@]}" install -q --no-index --no-deps --target "$WORK/build-tools" "$KIT"/tools/setuptools-*.whl \
    "$KIT"/tools/wheel-*.whl || return 1
  PYTHONPATH=$WORK/build-tools "${pip[@]}" install -q --no-index --no-deps --no-build-isolation . || return 1
  "$PY" -c 'import worldstep, diffusers, gymnasium, pydantic, flashinfer; print("imports ok", worldstep.__file__)'
}
export BASE_PY KIT WORK VENV PY
export -f setup
step setup 120 bash -c setup

# --- the environment every later step shares -------------------------------------------------------
export PATH="$VENV/bin:$PATH"  # ninja (kit) for flashinfer's JIT builds
export GPU_KIT=$KIT
export WORLDSTEP_CACHE=$WORK/wscache
export FLASHINFER_WORKSPACE_BASE=$WORK/flashinfer  # ONE JIT cache: a module compiled by one step serves the rest
export FLASHINFER_JIT_BUILD_LOG=$OUT/flashinfer_jit_builds.jsonl
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
if [ ! -e "$CUDA_HOME/include/curand_kernel.h" ] && [ ! -e "$CUDA_HOME/targets/x86_64-linux/include/curand_kernel.h" ]; then
  export FLASHINFER_EXTRA_CUDAFLAGS="-isystem $KIT/cuda-include"  # CUTLASS includes curand_kernel.h
fi
if [ ! -e "$CUDA_HOME/lib64/stubs/libcuda.so" ]; then
  export FLASHINFER_EXTRA_LDFLAGS="-L$KIT/cuda-stubs"  # flashinfer links -lcuda; the driver serves it at load
fi
CHECK=(--device "$DEVICE" "${TINY[@]}" --out "$OUT")
BENCH=("$PY" -m worldstep.bench gpu)
FLASHINFER_BACKEND=flashinfer
if [ "$DEVICE" = cpu ]; then
  export FLASHINFER_CUDA_ARCH_LIST=9.0a  # no GPU to ask: name the H200's arch
  BENCH+=(--arch tiny --allow-cpu --height 256 --width 256 --steps 1 --guidance 1,2 --windows 1 --sessions 1,2
          --session-steps 1 --official-steps 1)
  SDPA_SESSIONS=1,2
  FLASHINFER_BACKEND=auto  # sdpa on a CPU: the same code path
fi

step kit 60 "$PY" tests/gpu/check_kit.py "${CHECK[@]}"
step bench_sdpa 150 "${BENCH[@]}" --attention-backend sdpa --sections windows,official,sessions \
  --sessions "${SDPA_SESSIONS:-1,8}" --json "$OUT/bench_gpu_sdpa.json" --partial-json "$OUT/bench_gpu_sdpa.json"
step flashinfer_ready 240 "$PY" tests/gpu/check_kit.py "${CHECK[@]}" --ready
step attention 60 "$PY" tests/gpu/check_attention.py "${CHECK[@]}"
step cosmos3_backends 120 "$PY" tests/gpu/check_cosmos3_backends.py "${CHECK[@]}"
step bench_flashinfer 150 "${BENCH[@]}" --attention-backend "$FLASHINFER_BACKEND" \
  --sections windows,sessions,backends --json "$OUT/bench_gpu_flashinfer.json" \
  --partial-json "$OUT/bench_gpu_flashinfer.json"

"$BASE_PY" - "$OUT" "$STATUS" "$(($(date +%s) - T0))" "$DEVICE" <<'EOF'
import json, pathlib, sys
out, status, seconds, device = pathlib.Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
summary = {"ok": status == 0, "device": device, "seconds": seconds, "steps": steps}
(out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
for s in steps:
    state = "skipped" if s.get("skipped") else "TIMEOUT" if s["timed_out"] else "ok" if s["rc"] == 0 else f"rc {s['rc']}"
    print(f"{s['step']:>17}: {state:8s} {s.get('seconds', 0):6.1f}s / {s.get('limit_s', 0)}s")
print(f"{'all':>17}: {'ok' if status == 0 else 'FAILED'} in {seconds}s; figures in {out}")
EOF
exit $STATUS
