#!/usr/bin/env bash
# The kit's dry run (`make gpu-kit-dryrun`): the GPU run's own script on this CPU machine, over a stand-in of
# the GPU image, at tiny size. It proves the kit is complete: the venv sees only the image's packages and
# the kit's wheels (installed offline, --no-index --no-deps), every import and every check's code path runs,
# the kit's MANIFEST matches what flashinfer_modules.py asks for, each prebuilt module passes `ldd -r` and
# loads through tvm_ffi.load_module (the kit's stub as libcuda.so.1, this toolkit's libcudart.so.13), and
# nvcc's preprocessor finds every header the JIT sources include in the trimmed tree. It cannot run a CUDA
# kernel: flashinfer's numbers need the GPU.
#
# Stand-ins, said plainly: this machine runs CPython 3.11, the GPU image 3.12, so the kit's three compiled
# wheels (pydantic-core, apache-tvm-ffi, charset-normalizer) are swapped for the cp311 builds of the same
# versions; torch is the local CPU wheel (2.13.0) instead of 2.11.0+cu130; numpy 2.5.2 needs Python 3.12, so
# the newest 2.4 stands in; triton, opencv-python-headless and scipy (unused by worldstep) are left out.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
DRY=${DRY:-build/gpukit-dryrun}
KIT=${GPU_KIT:-gpukit}
START=$(date +%s)
[ -f "$KIT/MANIFEST.json" ] || { echo "no kit in $KIT: run make gpu-kit first" >&2; exit 2; }

# --- the stand-in image: a venv holding only image.txt's packages (built once, rebuilt when the list changes)
IMAGE=$DRY/image
STAMP=$(cat tests/gpu/image.txt tests/gpu/kit-requirements.txt | sha256sum | cut -c1-16)
if [ "$(cat "$IMAGE/.stamp" 2>/dev/null)" != "$STAMP" ]; then
  echo "== building the stand-in image venv in $IMAGE"
  rm -rf "$IMAGE"
  "$PYTHON" -m venv "$IMAGE"
  mapfile -t REQS < <("$PYTHON" - "$TORCH_SPEC" <<'EOF'
import sys
skip = {"triton", "opencv-python-headless", "scipy"}
for line in open("tests/gpu/image.txt"):
    spec = line.split("#")[0].strip()
    name = spec.split("==")[0]
    if not spec or name in skip:
        continue
    print({"torch": sys.argv[1], "numpy": "numpy<2.5"}.get(name, spec))
EOF
)
  "$IMAGE/bin/python" -m pip install -q "${REQS[@]}"
  # The image lacks what the kit carries (the notes); a newer dependency here (typer -> pydantic) may have
  # pulled some in. Out they go, so only the kit's wheels can satisfy them.
  mapfile -t CARRIED < <(sed -e 's/#.*//' -e 's/==.*//' -e '/^ *$/d' tests/gpu/kit-requirements.txt \
    | grep -v -x -E 'pip|setuptools|wheel')
  "$IMAGE/bin/python" -m pip uninstall -q -y "${CARRIED[@]}" 2>/dev/null || true
  echo "$STAMP" > "$IMAGE/.stamp"
fi

# --- the kit for this Python: cp311 builds of the same versions in place of the cp312 wheels
DKIT=$DRY/kit
rm -rf "$DKIT"
mkdir -p "$DKIT/wheels"
cp -r "$KIT/tools" "$KIT/cuda-include" "$KIT/cuda-stubs" "$KIT/MANIFEST.json" "$DKIT/"
SPECS=()
for w in "$KIT"/wheels/*.whl; do
  case $(basename "$w") in
    *-cp312-*) SPECS+=("$(basename "$w" | cut -d- -f1)==$(basename "$w" | cut -d- -f2)") ;;
    *) cp "$w" "$DKIT/wheels/" ;;
  esac
done
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: -d "$DKIT/wheels" "${SPECS[@]}"
echo "== stand-ins: ${SPECS[*]} as cp311 builds; $TORCH_SPEC (CPU) for torch 2.11.0+cu130"

# --- the GPU run's script, on the CPU, at tiny size
rc=0
BASE_PY=$IMAGE/bin/python GPU_KIT=$DKIT OUT=$DRY/out WORK=$DRY/work GPU_CHECK_BUDGET_S=${GPU_CHECK_BUDGET_S:-3600} \
  GPU_CHECK_TIME_SCALE=${GPU_CHECK_TIME_SCALE:-10} \
  tests/gpu/run_gpu_checks.sh --device cpu --tiny || rc=$?
echo "dry run: $([ $rc = 0 ] && echo ok || echo FAILED) in $(($(date +%s) - START))s; figures in $DRY/out"
exit $rc
