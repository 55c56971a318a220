#!/usr/bin/env bash
# The trust targets' one sealed run, in resumable stretches. It was made once, at commit 0d880ce, on the range
# 60,000,000.. (now `test_read_4`): docs/fidelity/pusher/. `--split test_read_4` reproduces it; `--split test`
# would read the next sealed range (70,000,000..), which is for the next model's report, not this one's.
#
# Every section the targets need, with the frozen rule: the open loop (vanish, moved-block error, reported beside),
# the graded policies continued 4 windows past their first success (the rule needs success held 3 windows) with
# each policy's first 10 episodes paired for the prediction-powered rates, and the planner, whose model loop stops
# on the rule (the selective stop). The rule uses no agreement, so no forks are run.
#
# Each stretch runs --stop-after-minutes and saves every finished task; the next one resumes. The journal records
# the commit and code hash the run started at and refuses a stretch at another (python -m worldstep.fidelity
# --resume). Killed midway: run the same command again. The report lands in OUT/report.json after the last stretch.
#
#   tools/sealed_trust_run.sh --split test_read_4 --out runs/again   # the fourth sealed report again
#   tools/sealed_trust_run.sh --split validation --out runs/dry --minutes 2 -- --budget small   # a dry run
#
# report.json's `seconds` is its last stretch's; OUT/stretch_seconds.txt lists every stretch's.
#
# Options: --split S (default test), --out DIR (default runs/sealed_trust), --minutes N per stretch (default 60),
# --stretches K (stop after K stretches, 0: until done; default 0), --workers W (default 2); arguments after --
# go to python -m worldstep.fidelity (they override the ones below).
set -euo pipefail

split=test out=runs/sealed_trust minutes=60 stretches=0 workers=2
while [[ $# -gt 0 ]]; do
  case "$1" in
    --split) split=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --minutes) minutes=$2; shift 2 ;;
    --stretches) stretches=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "sealed_trust_run.sh: unknown option $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done

cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
rule=docs/fidelity/pusher/validation/trust_study/rule.json
if [[ $split == test && -n "$(git status --porcelain --untracked-files=no)" ]]; then
  echo "sealed_trust_run.sh: the tree has uncommitted changes; the sealed run goes at a recorded commit" >&2
  exit 2
fi

args=(--checkpoint configs/models/pusher --split "$split" --budget full --sections openloop,policies,planning
      --continue-windows 4 --agreement-forks 0 --paired 10 --rule "$rule" --workers "$workers" --out "$out"
      "$@")
echo "sealed_trust_run.sh: commit $(git rev-parse HEAD), split $split, $minutes min per stretch -> $out" >&2
mkdir -p "$out"
n=0
while [[ ! -f $out/report.json ]]; do
  n=$((n + 1))
  start=$(date +%s)
  "$python" -m worldstep.fidelity "${args[@]}" --resume --stop-after-minutes "$minutes" > "$out/stretch$n.json"
  echo "sealed_trust_run.sh: stretch $n took $(( $(date +%s) - start )) s" >&2
  echo "stretch $n: $(( $(date +%s) - start )) s at $(git rev-parse HEAD)" >> "$out/stretch_seconds.txt"
  if [[ ! -f $out/report.json && $stretches -gt 0 && $n -ge $stretches ]]; then
    echo "sealed_trust_run.sh: stopped after $n stretch(es); run the same command to go on" >&2
    exit 0
  fi
done
echo "sealed_trust_run.sh: done: $out/report.json" >&2
