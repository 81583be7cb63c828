#!/usr/bin/env bash
# Seed 000's ablation at GPU scale (experiments/oubiobert_ablation_gpu.yaml) on a bare GPU host, which
# has no ../shared: pack the data it reads here, carry the archive, run it there in one device call.
#
#   bash benchmarks/gpu_experiment.sh pack                 # here: writes .gpu/data.tar.xz (~4 MB)
#   bash benchmarks/gpu_experiment.sh run [ARGS...]        # there: the experiment, outputs under $OUT
#
# `run` extracts the archive beside a copy of the checkout (the experiment's paths start ../shared/),
# runs `jobs/blue_sweep.py --config experiments/oubiobert_ablation_gpu.yaml ARGS...` (e.g. --dry-run)
# and copies its report, results and manifests to $OUT (PYTHON: the interpreter, default python3). Its
# wall time is the last line. The issue's target: the whole experiment in <= 10 minutes on one H100.
# LIMIT=S stops the job (SIGINT, then SIGKILL 20 s later) after S seconds and still copies what it
# wrote: set it under the device call's limit (e.g. LIMIT=560 in a 600 s call), or a run cut off by
# the call brings back only its log.
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG=experiments/oubiobert_ablation_gpu.yaml
# every path under ../shared/ the experiment names (corpora, the AmpV target, the tasks' directories)
paths() { grep -v '^[[:space:]]*#' "$CONFIG" | grep -o '\.\./shared/[^],}[:space:]]*' | sed 's#^\.\./shared/##' | sort -u; }

case "${1:-}" in
  pack)
    mkdir -p .gpu
    list=$(paths)
    (cd ../shared && tar cJf - $list) > .gpu/data.tar.xz.part
    mv .gpu/data.tar.xz.part .gpu/data.tar.xz
    echo "wrote .gpu/data.tar.xz ($(du -h .gpu/data.tar.xz | cut -f1)): $(echo $list)"
    ;;
  run)
    shift
    OUT=${OUT:-gpu_experiment_out}
    mkdir -p "$OUT"
    work=$(mktemp -d)
    mkdir -p "$work/shared" "$work/repo"
    tar xJf .gpu/data.tar.xz -C "$work/shared"
    tar cf - --exclude=./.gpu --exclude=./.venv --exclude=./.git . | tar xf - -C "$work/repo"
    start=$(date +%s)
    status=0
    (cd "$work/repo" && PYTHONPATH="$work/repo:${PYTHONPATH:-}" timeout --signal=INT --kill-after=20 "${LIMIT:-0}" \
      ${PYTHON:-python3} jobs/blue_sweep.py --config "$CONFIG" "$@") \
      2>&1 | tee "$OUT/experiment.txt" \
      || status=$?
    wall=$(($(date +%s) - start))
    for f in "$work"/repo/runs/*/report* "$work"/repo/runs/*/*/results.json "$work"/repo/runs/*/*manifest*.json \
             "$work"/repo/runs/*/logs/*.log; do
      [ -e "$f" ] && cp "$f" "$OUT/$(echo "${f#"$work"/repo/runs/}" | tr / _)"
    done
    echo "experiment: exit $status, wall ${wall} s"
    exit "$status"
    ;;
  *)
    sed -n '2,14p' "$0"
    exit 2
    ;;
esac
