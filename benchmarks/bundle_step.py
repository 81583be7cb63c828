"""A learning-rate bundle's optimizer step: PyTorch's fused AdamW kernel per row against the same update as
[T, N] tensor operations (the bundle's step before session 28).

    python benchmarks/bundle_step.py                          # the GPU ablation's fine-tuning model, 3/6/18 rows
    python benchmarks/bundle_step.py --rows 6 --size tiny     # the laptop's
    python benchmarks/bundle_step.py --device cuda            # on a GPU

``orchestrator.finetune.bundle.StackedWeights`` holds a bundle's T rows of trained weights in one [T, N]
buffer. Its step clips each row by its own norm, skips a row whose gradients are not finite, and takes
PyTorch's AdamW step on each row. As [T, N] tensor operations (``elementwise_step`` below: clip, mask,
decay, moments, bias corrections, update) that step passes over the buffers about 30 times; a small
model's bundle step moves far more memory in its optimizer than in its forward and backward. Now each
row's two segments (weights with decay, the rest) are one call of ``torch._fused_adamw_`` each, the
kernel of ``AdamW(fused=True)``, which reads the weights, gradients and moments once and writes them once.

For each row count it builds a BERT classifier of ``--size`` (hidden, layers; MiniLM's 30,522-word
vocabulary, whose embeddings dominate a small model's parameters), stacks it ``--rows`` times, fills the
gradients with the same random values before every step, and times ``--steps`` steps of each after
``--warmup`` (synchronised on a GPU). It prints the time a step of each, their ratio (the reference over
the fused step), and how far the two sets of weights drift apart over the timed steps (they compute the
same update in another order of rounding). Last line: JSON.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.pretrain.config import SIZE_PRESETS  # noqa: E402 (after the path)

SIZES = {"tiny": SIZE_PRESETS["tiny"], "gpu": SIZE_PRESETS["small"]}  # hidden, layers, heads, intermediate: the laptop
# default's pretrain size, and the GPU-scale ablation's (experiments/oubiobert_ablation_gpu.yaml)
VOCAB = 30522  # MiniLM's, which sweep_overhead.py's models use


def elementwise_step(stack, factor: float, grad_clip: float) -> None:
    """The bundle's step from 65d607f to 6ad82a7 (before session 28), kept as the reference: the same update
    as [T, N] tensor operations, on ``stack``'s buffers and layout."""
    import torch

    from orchestrator.finetune.bundle import ADAM_BETAS, ADAM_EPS

    g = stack.grad
    decay = torch.zeros(1, stack.flat.size(1), device=g.device)
    for start, end, wd in stack.segments:
        decay[:, start:end] = wd
    norm = torch.linalg.vector_norm(g, dim=1, keepdim=True)
    if grad_clip > 0:
        g.mul_((grad_clip / (norm + 1e-6)).clamp_(max=1.0))
    ok = torch.isfinite(norm)
    g.masked_fill_(~ok, 0.0)
    okf = ok.double()
    steps = stack.steps.view(-1, 1)
    steps += okf.float()
    beta1, beta2 = ADAM_BETAS
    lr = (stack.lr.view(-1, 1) * factor * okf).float()
    stack.flat.mul_(1 - lr * decay)
    stack.exp_avg.lerp_(g, ((1 - beta1) * okf).float())
    stack.exp_avg_sq.mul_(torch.where(ok, beta2, 1.0).float()).addcmul_(g, g, value=1 - beta2)
    steps = steps.double().clamp(min=1)
    step_size = (lr / (1 - beta1 ** steps)).float()
    denom = (stack.exp_avg_sq.sqrt() / (1 - beta2 ** steps).sqrt().float()).add_(ADAM_EPS)
    stack.flat.sub_(step_size * stack.exp_avg / denom)
    g.zero_()


def _stack(size: str, rows: int, device):
    import torch
    from transformers import BertConfig, BertModel

    from orchestrator.finetune.bundle import StackedWeights

    hidden, layers, heads, inter = SIZES[size]
    torch.manual_seed(0)
    model = torch.nn.Sequential()
    model.add_module("bert", BertModel(BertConfig(vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=layers,
                                                  num_attention_heads=heads, intermediate_size=inter)))
    model.add_module("head", torch.nn.Linear(hidden, 2))
    model.to(device)
    # learning rates spread from 1e-5 to 1e-3, as a sweep's grid (a rate x weight decay near 1 would blow up)
    return StackedWeights(model, [1e-5 * 100 ** (i / max(rows - 1, 1)) for i in range(rows)], weight_decay=0.01,
                          decoupled=True)


def measure(size: str, rows: int, device_name: str, warmup: int, steps: int) -> dict:
    import torch

    device = torch.device(device_name)
    fused, reference = _stack(size, rows, device), _stack(size, rows, device)
    gen = torch.Generator(device=device).manual_seed(1)
    grads = [torch.randn(fused.grad.shape, generator=gen, device=device) * 1e-2 for _ in range(4)]

    def timed(stack, step) -> float:
        total = 0.0
        for i in range(warmup + steps):
            stack.grad.copy_(grads[i % len(grads)])
            if device.type == "cuda":
                torch.cuda.synchronize()
            tick = time.perf_counter()
            step(stack)
            if device.type == "cuda":
                torch.cuda.synchronize()
            if i >= warmup:
                total += time.perf_counter() - tick
        return total / steps

    fused_s = timed(fused, lambda s: s.step(factor=1.0, grad_clip=1.0))
    reference_s = timed(reference, lambda s: elementwise_step(s, factor=1.0, grad_clip=1.0))
    drift = float((fused.flat - reference.flat).abs().max() / reference.flat.abs().max())
    return {"size": size, "rows": rows, "parameters": fused.flat.size(1), "device": device_name,
            "fused_ms": round(fused_s * 1e3, 3), "elementwise_ms": round(reference_s * 1e3, 3),
            "ratio": round(reference_s / fused_s, 3), "relative_drift": drift}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="gpu")
    ap.add_argument("--rows", type=int, nargs="+", default=[3, 6, 18],
                    help="rows a bundle (the GPU ablation: 3 and 6; with sweep.bundle_seeds 9 and 18)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch threads on CPU (a sweep trial's default: 1)")
    args = ap.parse_args(argv)
    if any(r < 1 for r in args.rows) or args.steps < 1 or args.warmup < 0:
        ap.error("--rows and --steps must be >= 1 and --warmup >= 0")
    import torch

    torch.set_num_threads(args.threads)
    results = []
    for rows in args.rows:
        out = measure(args.size, rows, args.device, args.warmup, args.steps)
        results.append(out)
        print(f"{args.size} BERT ({out['parameters']:,} trained weights a row) x {rows} rows on {args.device}: "
              f"fused {out['fused_ms']:.1f} ms a step, elementwise {out['elementwise_ms']:.1f} ms: "
              f"{out['ratio']:.2f}x; weights apart after {args.warmup + args.steps} steps: "
              f"{out['relative_drift']:.1e} of the largest", flush=True)
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
