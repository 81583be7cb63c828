"""Where a pretraining step's GPU time goes: kernel families, kernels launched, the busiest kernels.

    python3 benchmarks/pretrain_profile.py                   # GPU: base and small, eager unpad vs compiled
    python3 benchmarks/pretrain_profile.py --sizes small --modes compile

Profiles ``train_step`` alone (two micro-batches of 256 rows as long as real instances, bf16, LAMB; no
Ray Data, no DDP: the model's and the optimizer's work) with ``torch.profiler`` after three untimed
steps, per speed mode: ``eager`` (the engine's default: unpad, no compile) and ``compile`` (unpad with
the compiled packed encoder) and ``graphs`` (that encoder replayed as CUDA graphs, in static shapes:
``speed.cuda_graphs``); ``step`` and ``step_graphs`` add the compiled heads and LAMB update
(``speed.compile_head``, ``speed.compile_optimizer``). Prints the step's wall time, the sum of its
GPU kernels' time and their share of the wall (how busy the GPU was: what is not covered is launch
and host time), the kernels launched per step, the time per kernel family (GEMMs, attention,
LayerNorm, optimizer, inductor's fused Triton kernels, index/scatter, the rest) and the twelve
busiest kernels. Profiler ranges (``Optimizer.step#...``, ``ProfilerStep``) are not kernels and are
left out. The profiler slows the host side, so the wall times here are above ``pretrain_gpu.py``'s.
On CPU it runs (no kernel table): a check that the script works. Last line: JSON.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FAMILIES = [("gemm", ("gemm", "cutlass", "nvjet", "xmma", "cublas", "wgmma")),
            ("attention", ("fmha", "flash", "sdpa", "attention")),
            ("optimizer", ("multi_tensor", "foreach", "lamb", "adam")),
            ("layernorm", ("layer_norm", "layernorm")),
            ("softmax/cross-entropy", ("softmax", "nll", "cross_entropy")),
            ("index/scatter", ("index", "scatter", "gather", "nonzero")),
            ("triton (other fused)", ("triton",))]
STEP = {"compile": True, "compile_head": True, "compile_optimizer": True}  # the whole step compiled
MODES = {"eager": {"compile": False}, "compile": {"compile": True},  # pretrain.speed over its defaults
         "graphs": {"compile": True, "cuda_graphs": True}, "graphs_fp8": {"compile": True, "cuda_graphs": True,
                                                                          "fp8": True},
         "step": STEP, "step_graphs": {**STEP, "cuda_graphs": True}}


def family(name: str) -> str:
    lower = name.lower()
    return next((fam for fam, keys in FAMILIES if any(k in lower for k in keys)), "other elementwise")


def kernel_events(prof) -> list:
    """A finished ``torch.profiler.profile``'s GPU kernels, averaged by name (``key_averages``): its profiler
    ranges (``Optimizer.step#...``, ``ProfilerStep``), which the CUDA timeline holds too, are not kernels and
    are left out."""
    return [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA
            and "#" not in e.key and not e.key.startswith("ProfilerStep")]


def profile_step(size: str, mode: str, batch: int, length: int, steps: int, device: torch.device) -> dict:
    from torch.profiler import ProfilerActivity, profile

    from orchestrator.pretrain.loop import train_step

    spec = importlib.util.spec_from_file_location("pretrain_gpu", ROOT / "benchmarks" / "pretrain_gpu.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    micro = bench.synthetic_batches(batch, length, "real", 2, device, static=MODES[mode].get("cuda_graphs", False))
    precision = "bf16" if device.type == "cuda" or MODES[mode].get("fp8") else "fp32"  # fp8 needs bf16
    module, optimizer, scheduler, scaler, params = bench.step_setup(size, MODES[mode], "lamb", 2 * batch, length,
                                                                    device, precision)
    module.train()

    def step():
        train_step(module, micro, optimizer, scheduler, scaler, precision=precision, device=device, grad_clip=1.0,
                   params=params, cuda_graphs=MODES[mode].get("cuda_graphs", False))

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(3):  # the compile, the allocator, cuBLAS's choices
        step()
    sync()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            step()
        sync()
        wall = (time.perf_counter() - start) / steps
    kernels = kernel_events(prof)
    busy = sum(e.self_device_time_total for e in kernels) / steps / 1e6
    families: dict[str, float] = {}
    for e in kernels:
        families[family(e.key)] = families.get(family(e.key), 0.0) + e.self_device_time_total / steps / 1e6
    top = sorted(kernels, key=lambda e: -e.self_device_time_total)[:12]
    return {"size": size, "mode": mode, "batch": batch, "length": length, "wall_ms": wall * 1e3,
            "kernels_ms": busy * 1e3, "gpu_busy": busy / wall if kernels else None,
            "kernels_per_step": sum(e.count for e in kernels) // steps,
            "families_ms": {k: v * 1e3 for k, v in sorted(families.items(), key=lambda kv: -kv[1])},
            "top": [(e.key[:100], e.self_device_time_total / steps / 1e3, e.count // steps) for e in top]}


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default=None,
                    help="comma-separated size presets (default base,small on GPU, tiny on CPU)")
    ap.add_argument("--modes", default="eager,compile",
                    help="comma-separated: eager (unpad), compile (unpad, compiled), graphs (compiled + "
                         "speed.cuda_graphs), graphs_fp8 (+ speed.fp8), step (compiled + speed.compile_head + "
                         "speed.compile_optimizer), step_graphs (step + speed.cuda_graphs)")
    ap.add_argument("--batch", type=int, default=None, help="rows per micro-batch (default 256 GPU / 4 CPU)")
    ap.add_argument("--length", type=int, default=128)
    ap.add_argument("--steps", type=int, default=4, help="profiled steps")
    args = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    gpu = device.type == "cuda"
    sizes = (args.sizes or ("base,small" if gpu else "tiny")).split(",")
    out = []
    for size in sizes:
        for mode in args.modes.split(","):
            r = profile_step(size, mode, args.batch or (256 if gpu else 4), args.length, args.steps, device)
            out.append(r)
            busy = "" if r["gpu_busy"] is None else f", GPU kernels {r['kernels_ms']:.1f} ms (busy {r['gpu_busy']:.0%})"
            print(f"\n{size} {mode}: step (2 x {r['batch']} x {r['length']}) {r['wall_ms']:.1f} ms{busy}; "
                  f"{r['kernels_per_step']} kernels a step")
            for fam, ms in r["families_ms"].items():
                print(f"  {fam:24s} {ms:8.2f} ms {ms / r['kernels_ms']:6.1%}")
            for name, ms, count in r["top"]:
                print(f"  {ms:8.2f} ms x{count:4d}  {name}")
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
