#!/usr/bin/env bash
# The GPU measurements still open in benchmarks/RESULTS.md, in priority order, in one device call that
# fits a short lease. Each step has its own time limit and is skipped when the budget is spent. Each
# writes its whole output to $OUT/<step>.txt, and its table or summary lines go to the terminal.
#
#   bash benchmarks/gpu_session.sh [BUDGET_S]          # default 540 s; run from the repository root
#
# Expects the project importable (on a bare GPU host: the packed site on PYTHONPATH, as
# ../shared/gpu/pack_site.sh prints). Steps, with what each answers:
#   0 share      (issue 31, session 38) where the GPU sweep's time goes: session 37's experiment found 8 trial
#                processes of 6-row bundles sharing the GPU at ~4.7 ms a row-step, 2.5 % of its peak.
#                benchmarks/bundle_sharing.py times one bundle's step alone at 1-18 rows (kernels a step, the
#                GPU's busy share and the heaviest kernels, profiled) and 2-8 processes side by side;
#                0-share-mps the same under CUDA MPS (its daemon started and stopped by the benchmark).
#                Their sharing gains say whether
#                the processes lose their time taking turns (then MPS, or fewer processes of more rows) or
#                whether one process's step is itself slow (then the step)
#   0 bundle     a fine-tuning bundle's optimizer step (issue 31): PyTorch's fused AdamW per row against the
#                elementwise step it replaced (session 28; 13.7-20.4x on one CPU thread), 3, 6 and 18 rows of
#                the GPU ablation's model size
#   1 graphs     compile + unpad (all on) against the same with speed.cuda_graphs, with 20 warm-up and 60
#                timed steps, both sizes. Session 20 measured the graphs slower (0.80x base, 0.93x small)
#                over 5 warm-up and 20 timed steps; the suspect is graphs recorded inside the timed steps
#                (one per new token bucket). The benchmark now prints the encoder's shapes seen in the
#                warm-up and first seen in the timed steps, and TORCH_LOGS=cudagraphs logs each recording
#                ("Recording function") and any skip ("skipping cudagraphs", at WARNING). A third row adds
#                speed.compile_head and speed.compile_optimizer (session 21: the heads and losses compiled,
#                and graphed, too; LAMB's update compiled)
#   2 profile    the compiled encoder against the whole step compiled (heads, losses, LAMB) and graphed:
#                kernels launched, GPU busy
#   3 large      BERT-large, all on and + cuda_graphs (the issue's MFU anchors are BERT-large runs: larger
#                matmuls, nearer cuBLAS's peak than BERT-base's at K = 768)
#   4 ablation   the whole ablation with compile (each technique off in turn, each one not yet on alone), both sizes
#   5 ddp        all on, BERT-base, with the module wrapped in DDP as every figure up to session 20 was
#                (a one-worker run is not: Ray Train wraps only for more than one); against step 1's row
# Steps 1-4 measure the one-worker loop (no DDP), so their rows compare with each other, not with
# the figures recorded up to session 20 (all taken with DDP).
# The GPU sweep (bundled against separate) was measured in session 20; its commands are in RESULTS.
set -u
OUT=${OUT:-gpu_session_out}
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
step 0-share 150 'row-steps|heaviest|calls a step|Error|MPS' python3 benchmarks/bundle_sharing.py --device cuda
step 0-share-mps 120 'row-steps|Error|MPS|mps' python3 benchmarks/bundle_sharing.py --device cuda --mps \
  --cells 0x1 6x1 18x1 0x8 6x4 6x8 18x4
step 0-bundle 60 'rows on|Error' python3 benchmarks/bundle_step.py --device cuda --size gpu --rows 3 6 18
TORCH_LOGS=recompiles,cudagraphs step 1-graphs 330 "$TABLE|seq/s|Recompiling|skipping cudagraphs" \
  python3 benchmarks/pretrain_gpu.py --compile on --ablate none \
  --rows "all on,+ cuda_graphs,+ compile_head + compile_optimizer + cuda_graphs" \
  --warmup 20 --steps 60
echo "[1-graphs] graphs recorded: $(grep -c 'Recording function' "$OUT/1-graphs.txt")"
step 2-profile 150 '^[a-z]+ (eager|compile|graphs):|^  [a-z/ ()-]+ +[0-9.]+ ms|Error' \
  python3 benchmarks/pretrain_profile.py --sizes base,small --modes compile,step_graphs
step 3-large 150 "$TABLE|seq/s" python3 benchmarks/pretrain_gpu.py --compile on --ablate none \
  --rows "all on,+ cuda_graphs" --sizes large --batch 128 --accumulation 4 --warmup 10 --steps 20
step 4-ablation 420 "$TABLE" python3 benchmarks/pretrain_gpu.py
step 5-ddp 120 "$TABLE" python3 benchmarks/pretrain_gpu.py --compile on --ablate none --rows "all on" --ddp \
  --sizes base --warmup 20 --steps 60
echo "done at t+$(($(date +%s) - T0))s; outputs in $OUT"
