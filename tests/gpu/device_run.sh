#!/usr/bin/env bash
# The ONE command for a lent GPU (device tool: carry ["gpukit"], timeout_s 540):
#   tests/gpu/device_run.sh
# run_gpu_checks.sh writes its many files under a scratch folder; only summary.json and one archive of them
# all (rewritten after every step, so a call cut short still returns what finished) go to the tool's $OUT: the
# H200's first call got back 8 of the run's files, summary.json not among them. Unpack it into
# docs/bench/gpu/<device>/ and write the README there (tests/gpu/README.md, section 3).
# Env: OUT (set by the device tool), GPU_CHECK_SCRATCH (${TMPDIR:-/tmp}/worldstep-gpu-out); the rest as
# run_gpu_checks.sh's, whose arguments it passes on.
set -uo pipefail
cd "$(dirname "$0")/../.."
RETURN=${OUT:?OUT must name the folder whose files come back (the device tool sets it)}
mkdir -p "$RETURN"
SCRATCH=${GPU_CHECK_SCRATCH:-${TMPDIR:-/tmp}/worldstep-gpu-out}
rm -rf "$SCRATCH"
OUT=$SCRATCH GPU_CHECK_ARCHIVE=$RETURN/gpu_check.tar.gz tests/gpu/run_gpu_checks.sh "$@"
rc=$?
cp "$SCRATCH/summary.json" "$RETURN/" || rc=1
exit $rc
