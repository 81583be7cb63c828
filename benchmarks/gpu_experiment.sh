#!/usr/bin/env bash
# Seed 000's ablation at GPU scale (experiments/oubiobert_ablation_gpu.yaml) on a bare GPU host, which
# has no ../shared: pack the data it reads here, carry the archive, run it there in one device call.
#
#   bash benchmarks/gpu_experiment.sh pack                 # here: writes .gpu/data.tar.xz (~2.3 MB)
#   PACK_ALSO_HOST="transformers tokenizers huggingface-hub safetensors" ../shared/gpu/pack_site.sh
#                                                          # here: the site, .gpu/site312.tar.xz (~35 MB)
#   bash benchmarks/gpu_experiment.sh run [ARGS...]        # there: the experiment, outputs under $OUT
#
# `run` extracts the archive beside a copy of the checkout (the experiment's paths start ../shared/),
# runs `jobs/blue_sweep.py --config experiments/oubiobert_ablation_gpu.yaml ARGS...` (e.g. --dry-run)
# and brings back three files in $OUT (a device call returns at most 8): experiment.txt (the terminal
# output, its summary with each stage's time at the end), report.md (the table, paired differences and
# p-values) and results.tar.xz (the report, the sweep's results and trial records, every manifest, the
# logs and the MLflow store); where nvidia-smi is, also gpu.txt (the device, its driver, torch's
# version) and dmon.txt (`nvidia-smi dmon -s u` every 5 s through the run: how busy the GPU was in each
# stage). PYTHON: the interpreter (default python3; a path is taken from here).
# Its wall time is the last line. The site must hold `cryptography` (MLflow's SQLite store needs it, and
# the GPU image had none in 2026-11): keep it out of PACK_ALSO_HOST; `run` warns when it is missing.
# The issue's target: the whole experiment in <= 10 minutes on one H100.
# LIMIT=S stops the job (SIGINT, then SIGKILL 20 s later) after S seconds and still brings back what it
# wrote: set it under the device call's limit (e.g. LIMIT=560 in a 600 s call), or a run cut off by
# the call brings back only its log.
# The run lives in WORK (default .gpu/experiment: ignored, so it does not travel, and a warm device
# machine keeps it between calls), so the same command again continues a run that was cut off: finished
# stages and trials are reused and pretraining resumes from its last checkpoint. FRESH=1 starts over.
# A device machine goes back 30 s after a call: have the continuing call ready before the first ends.
# If the run fails (not cut off by LIMIT) before both pretrained arms' pretraining has finished, the same
# call runs it once more, in what LIMIT leaves, with FALLBACK's overrides appended (default: the arms one
# after the other, each pretraining on a whole GPU: `arm_concurrency=1 pretrain.resources_per_worker.GPU=1`;
# the stage keys are the same, so finished stages are reused); FALLBACK= turns that off. A failure's
# traceback files (the job's, in the temp directory) and Tune's error.txt files come back in errors.txt.
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
    work=$(realpath -m "${WORK:-.gpu/experiment}")
    case "$work/" in  # the checkout is copied into it: anywhere else in the checkout it would copy itself
      "$PWD"/.gpu/*) ;;
      "$PWD"/*) echo "WORK=$WORK: must be under .gpu/ or outside the checkout" >&2; exit 2 ;;
    esac
    [ "${FRESH:-0}" = 1 ] && rm -rf "$work/repo" "$work/shared"
    if [ -d "$work/repo/runs" ]; then
      echo "continuing the run in $work/repo/runs (stages and finished trials reused; FRESH=1 starts over)"
    fi
    mkdir -p "$work/shared" "$work/repo"
    tar xJf .gpu/data.tar.xz -C "$work/shared"
    tar cf - --exclude=./.gpu --exclude=./.venv --exclude=./.git --exclude=./runs . | tar xf - -C "$work/repo"
    python=${PYTHON:-python3}
    case $python in */*) python=$(realpath -ms "$python") ;; esac  # the job runs in the copy, not here
    limit=${LIMIT:-0}
    start=$(date +%s)
    stamp=$(mktemp)  # what is newer than it was written by this call
    dmon=""
    if command -v nvidia-smi >/dev/null 2>&1; then
      { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
        "$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1
        echo "cpus $(nproc)"; } > "$OUT/gpu.txt" || true
      nvidia-smi dmon -s u -d 5 > "$OUT/dmon.txt" 2>&1 &
      dmon=$!
    fi
    attempt() {  # attempt SECONDS ARGS...: the job under SECONDS (0: no limit), its terminal output appended
      local seconds=$1
      shift
      (cd "$work/repo" && PYTHONPATH="$work/repo:${PYTHONPATH:-}" timeout --signal=INT --kill-after=20 "$seconds" \
        "$python" jobs/blue_sweep.py --config "$CONFIG" "$@") 2>&1 | tee -a "$OUT/experiment.txt"
    }
    : > "$OUT/experiment.txt"
    "$python" -c 'import cryptography' 2>/dev/null \
      || echo "gpu_experiment: warning: no cryptography here, so MLflow will log nothing (the report and results" \
              "are files); pack the site with it: leave it out of PACK_ALSO_HOST" | tee -a "$OUT/experiment.txt"
    status=0
    attempt "$limit" "$@" || status=$?
    fallback=${FALLBACK-arm_concurrency=1 pretrain.resources_per_worker.GPU=1}
    pretrained=$(grep -cE '(^|[^a-z_])pretrain: (done in|output complete)' "$OUT/experiment.txt" || true)
    case $status in
      0|124|130|137) ;;  # finished, cut off by LIMIT, interrupted
      *)
        left=0 room="no LIMIT"  # what LIMIT leaves (0: no LIMIT)
        if [ "$limit" -gt 0 ]; then left=$((limit - ($(date +%s) - start))) room="LIMIT leaves ${left} s"; fi
        if [ -n "$fallback" ] && [ "$pretrained" -lt 2 ] && { [ "$limit" -eq 0 ] || [ "$left" -ge 60 ]; }; then
          echo "gpu_experiment: exit $status before both pretrained arms finished pretraining; once more with" \
               "$fallback ($room)" | tee -a "$OUT/experiment.txt"
          status=0
          # shellcheck disable=SC2086  # the overrides are words
          attempt "$left" "$@" $fallback || status=$?
        fi
        ;;
    esac
    wall=$(($(date +%s) - start))
    [ -n "$dmon" ] && kill "$dmon" 2>/dev/null || true
    # the tracebacks of a failure: the job keeps its own in the temp directory, Tune writes error.txt per trial
    { find "${TMPDIR:-/tmp}" -maxdepth 1 -name 'bioptorch-*.txt' -newer "$stamp" 2>/dev/null
      [ -d "$work/repo/runs" ] && find "$work/repo/runs" -name error.txt -newer "$stamp"
    } | head -20 | while read -r f; do echo "==> $f"; tail -c 20000 "$f"; done > "$OUT/errors.txt" || true
    [ -s "$OUT/errors.txt" ] || rm -f "$OUT/errors.txt"
    runs="$work/repo/runs"
    if [ -d "$runs" ]; then
      table=$(find "$runs" -path '*/report/blue_table.md' | head -1)
      if [ -n "$table" ]; then
        cp "$table" "$OUT/report.md"
        [ "$table" -nt "$stamp" ] || echo "report.md: written by an earlier call, not by this one"
      fi
      # what a record needs, not the weights, instances or corpora (a file comes back only under 16 MiB)
      # (find's * matches across /: */sweep/*.json takes the trial records too, and the tokenised-split cache
      # unless excluded)
      (cd "$runs" && find . -type f -size -16M \( -path '*/report/*' -o -path '*/logs/*' -o -path '*/sweep/*.json' \
        -o -name manifest.json -o -name experiment.json -o -name mlflow.db \) ! -path '*/cache/*' -print0 \
        | tar cJf - --null -T -) > "$OUT/results.tar.xz"
      echo "brought back: $(cd "$OUT" && ls | tr '\n' ' ')($(du -h "$OUT/results.tar.xz" | cut -f1) archive)"
    fi
    rm -f "$stamp"
    echo "experiment: exit $status, wall ${wall} s"
    exit "$status"
    ;;
  *)
    awk 'NR > 1 && !/^#/ {exit} NR > 1 {print}' "$0"
    exit 2
    ;;
esac
