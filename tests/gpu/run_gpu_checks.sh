#!/usr/bin/env bash
# The GPU checks in ONE run of at most 520 s, kit install included, on a bare, offline H100 80 GB or H200
# 141 GB machine (`make gpu-check`; the same script, unchanged, on either). A tiny smoke first, then the
# headline figures:
#   setup             a venv over the image's python3 (--system-site-packages), the kit's wheels installed
#                     offline (--no-index --no-deps), worldstep from this checkout (--no-deps)
#   smoke             check_smoke.py: worldstep/Tiny-v0 on CUDA with sdpa and flashinfer (where its kernels
#                     load): reset, a step, a fork, a close, every page back; seconds
#   kit               versions; the kit's MANIFEST against what flashinfer_modules.py asks for; every
#                     prebuilt module through `ldd -r` and `tvm_ffi.load_module` (check_kit.py)
#   flashinfer_ready  one Edge-shaped flashinfer batch loads the prebuilt modules; FLASHINFER_DISABLE_JIT=1,
#                     so a module that does not load fails here in seconds instead of compiling
#   attention         headline: flashinfer vs sdpa vs fp32 at Edge geometry (check_attention.py)
#   bench_ab          headline: `bench gpu` ab, profile, decoder: today's path (fp32 decode, eager, decode after
#                     the commit) against the new defaults in the same call, interleaved round by round, at
#                     N = 1 and 8, frames and latent mode (each gain a ratio with its interval); one window of
#                     each under the torch profiler (top kernels); the warm decoder alone (ms, TFLOP/s a window)
#   bench_headline    `bench gpu` windows at full context (4 steps, with and without CFG, 5 timed windows at one
#                     context length: ms per window, MFU, real-time factor), the official recipe side by side
#   parity_diffusers  check_parity_diffusers.py: one Edge-geometry bf16 window vs diffusers' Cosmos3 forward
#   gpu_tests         the `gpu`-marked tests: CUDA graphs captured once and replayed equal eager; a window's
#                     denoise loop under set_sync_debug_mode("error"); 8 sessions with decode overlap equal
#                     the same decoded in turn, frame for frame
#   cosmos3_backends  check_cosmos3_backends.py: Edge windows and a rollout, flashinfer vs sdpa
#   bench_more        `bench gpu` backends (ms per denoise step, sdpa next to flashinfer), cadence (time to
#                     first frames, inter-window p50/p95 over 16 windows at full context, RTF at N = 1 and
#                     aggregate at N = 8) and overlap (8 decoding sessions as one forward vs two halves with the
#                     decode overlapped), one Edge build for the three; a section that fails or is cut keeps
#                     the figures of those before it (--partial-json)
# Every step writes its own JSON under $OUT; summary.json (headline figures, then each step's exit code,
# seconds, limit and error) is rewritten after EVERY step, so a run cut short returns what finished; logs/
# holds the output. A failed step makes the exit status 1 and the later steps still run; a step that would
# start past the run's budget, or whose memory plan (PLAN_GIB) exceeds the device's free memory, is skipped
# and named in summary.json with the reason. The limits (LIMIT) add up to the budget (tests/gpu/README.md).
#
# Usage: tests/gpu/run_gpu_checks.sh [--device cpu --tiny]     (the CPU form is the kit's dry run)
# Env:   BASE_PY  python to build the venv over (python3)     GPU_KIT  the kit folder (gpukit)
#        OUT      figures (runs/gpu)                           GPU_CHECK_BUDGET_S  whole run (520)
#        WORK     venv, JIT cache, checkpoints (${TMPDIR:-/tmp}/worldstep-gpu)
#        GPU_CHECK_TIME_SCALE  multiplies every step's limit (1; the dry run on a CPU uses more)
#        GPU_CHECK_INJECT  a step whose command is replaced by a failure (the dry run's proof that the later
#                          steps still report), e.g. flashinfer_ready
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
BUDGET=${GPU_CHECK_BUDGET_S:-520}  # within the device call's 540 s, less the kill grace of the last step
# Each step's limit in seconds: they add up to the 520 s budget (tests/gpu/README.md's table, where each is
# derived from the H200's step times of 2026-12-04, docs/bench/gpu/h200-141gb/steps.jsonl; a test checks the sum)
declare -A LIMIT=([setup]=45 [smoke]=28 [kit]=20 [flashinfer_ready]=10 [attention]=12 [bench_ab]=140
                  [bench_headline]=55 [parity_diffusers]=25 [gpu_tests]=40 [cosmos3_backends]=25 [bench_more]=120)
# Each step's device memory plan in GiB (reasoned: Edge bf16 weights ~8, the KV pool ~1, a decoding 480p
# session ~4-6; measured: 8 decoding sessions 29.6 GiB beyond weights and pool): checked against the device's
# free memory before the step starts; H100 80 GB fits them all (inside bench_ab, the ab section's own plan for
# both paths' 8 decoding sessions, ~80 GB reasoned, skips it there with the reason; the H200 runs it)
declare -A PLAN_GIB=([smoke]=2 [flashinfer_ready]=2 [attention]=4 [bench_ab]=70 [bench_headline]=30
                     [parity_diffusers]=40 [gpu_tests]=8 [cosmos3_backends]=30 [bench_more]=60)
T0=$(date +%s)
STATUS=0
mkdir -p "$OUT/logs" "$WORK"
: > "$OUT/steps.jsonl"
rm -f "$OUT/summary.json"
source tests/gpu/steps.sh

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
run setup bash -c setup

# --- the environment every later step shares -------------------------------------------------------
export PATH="$VENV/bin:$PATH"  # ninja (kit) for flashinfer's JIT builds
export GPU_KIT=$KIT
export WORLDSTEP_CACHE=$WORK/wscache
export FLASHINFER_WORKSPACE_BASE=$WORK/flashinfer  # ONE JIT cache: a module compiled by one step serves the rest
export FLASHINFER_JIT_BUILD_LOG=$OUT/flashinfer_jit_builds.jsonl
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
export PYTHONUNBUFFERED=1  # a step killed at its limit still leaves its output in its log
export TVM_FFI_DISABLE_TORCH_C_DLPACK=1  # tvm-ffi would JIT-build a torch DLPack addon on torch 2.11 otherwise
if [ ! -e "$CUDA_HOME/include/curand_kernel.h" ] && [ ! -e "$CUDA_HOME/targets/x86_64-linux/include/curand_kernel.h" ]; then
  export FLASHINFER_EXTRA_CUDAFLAGS="-isystem $KIT/cuda-include"  # CUTLASS includes curand_kernel.h
fi
if [ ! -e "$CUDA_HOME/lib64/stubs/libcuda.so" ]; then
  export FLASHINFER_EXTRA_LDFLAGS="-L$KIT/cuda-stubs"  # flashinfer links -lcuda; the driver serves it at load
fi
CHECK=(--device "$DEVICE" "${TINY[@]}" --out "$OUT")
BENCH=("$PY" -m worldstep.bench gpu)
FLASHINFER_BACKEND=flashinfer
TIMED_WINDOWS=5  # per setting, all at full context (one context length)
HEADLINE_STEPS=4  # the targets' step count (30 steps cost 25 s more: left out of the budget)
AB=(--ab-sessions 1,8 --ab-rounds 4 --ab-warmup 2)  # warm-up rounds fill Edge's 8-frame context (2 windows)
MORE_WINDOWS=2  # bench_more: 1 warm-up + 2 timed windows of 8 decoding sessions (5.2 s each on the H200 in fp32)
if [ "$DEVICE" = cpu ]; then
  export FLASHINFER_CUDA_ARCH_LIST=9.0a  # no GPU to ask: name the H200's arch
  BENCH+=(--arch tiny --allow-cpu --height 256 --width 256 --steps 1 --guidance 1,2 --session-steps 1 --context-frames 2
          --official-steps 1)
  SESSIONS=1,2
  TIMED_WINDOWS=2
  HEADLINE_STEPS=1
  AB=(--ab-sessions 1,2 --ab-rounds 2 --ab-warmup 0)
  MORE_WINDOWS=1
  LIMIT[flashinfer_ready]=240  # on a CPU: nvcc's preprocessor over every module source instead
  FLASHINFER_BACKEND=auto  # sdpa on a CPU: the same code path
fi

# The kit's prebuilt modules are what the run loads; a JIT build would eat the budget, so it is an error.
if grep -q '"sha256"' "$KIT/MANIFEST.json"; then
  export FLASHINFER_DISABLE_JIT=${FLASHINFER_DISABLE_JIT:-1}
fi

run smoke "$PY" tests/gpu/check_smoke.py "${CHECK[@]}"
run kit "$PY" tests/gpu/check_kit.py "${CHECK[@]}"
run flashinfer_ready "$PY" tests/gpu/check_kit.py "${CHECK[@]}" --ready
HEADLINE_BACKEND=$FLASHINFER_BACKEND
if ((LAST_RC != 0)); then
  HEADLINE_BACKEND=sdpa  # flashinfer did not load: the headline figures on sdpa rather than none
fi
run attention "$PY" tests/gpu/check_attention.py "${CHECK[@]}"
run bench_ab "${BENCH[@]}" --attention-backend "$HEADLINE_BACKEND" --sections ab,profile,decoder "${AB[@]}" \
  --json "$OUT/bench_gpu_ab.json" --partial-json "$OUT/bench_gpu_ab.json"
run bench_headline "${BENCH[@]}" --attention-backend "$HEADLINE_BACKEND" --sections windows,official \
  --steps "$HEADLINE_STEPS" --windows "$TIMED_WINDOWS" --json "$OUT/bench_gpu_headline.json" \
  --partial-json "$OUT/bench_gpu_headline.json"
run parity_diffusers "$PY" tests/gpu/check_parity_diffusers.py "${CHECK[@]}"
run gpu_tests "$PY" -m pytest -q -p no:cacheprovider --noconftest -m gpu tests/test_gpu_regime.py \
  tests/test_stream_handover.py --junitxml "$OUT/gpu_tests.xml"
run cosmos3_backends "$PY" tests/gpu/check_cosmos3_backends.py "${CHECK[@]}"
run bench_more "${BENCH[@]}" --attention-backend "$HEADLINE_BACKEND" --sections backends,cadence,overlap \
  --sessions "${SESSIONS:-1,8}" --windows "$MORE_WINDOWS" --json "$OUT/bench_gpu_more.json" \
  --partial-json "$OUT/bench_gpu_more.json"

summarize --final
exit $STATUS
