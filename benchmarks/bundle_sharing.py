"""A fine-tuning bundle's training step alone on a device, and several processes' bundles sharing it: where a
GPU sweep's time goes (issue 31).

    python benchmarks/bundle_sharing.py --device cuda                 # the default cells, below
    python benchmarks/bundle_sharing.py --device cuda --mps           # the same under CUDA MPS
    python benchmarks/bundle_sharing.py --size tiny --cells 0x1 2x1 2x2 --steps 2     # a smoke run on CPU

Session 37's GPU experiment found its sweep bound by the GPU's time at about 2.5 % of the GPU's peak: 8 Ray
trials (processes) of 6-row bundles shared one H200, and each row of a bundle cost the same GPU time whatever
the bundle's size (about 4.7 ms a row-step). Counted, a row-step of that model is far less arithmetic and
memory traffic than that. Two readings are left, and they call for different fixes: (a) one process's step is
slow on the GPU by itself (kernels, the vmapped batching rules, the attention's math form, the per-row
optimizer), or (b) the processes lose time taking turns on the GPU (without MPS a GPU runs one process's
kernels at a time). This benchmark tells them apart with the bundle's own code.

A cell ``RxP`` runs P processes at once, each training a bundle of R rows (R learning rates of one seed, as
the sweep's learning-rate bundles) with ``orchestrator.finetune.bundle``'s ``StackedWeights`` and
``_batched_loss``, on synthetic batches shaped as the GPU ablation's tasks (``--batch`` examples padded to the
batch's longest, lengths drawn between a quarter of ``--length`` and ``--length``) of a random BERT of
``--size`` (the GPU ablation's fine-tuning model: hidden 512, 4 layers, its arms' 8,000-word vocabulary). A
cell ``0xP`` trains the unbundled trial's step instead (``run_trial``'s optimizer, schedule and update: fused
SDPA, fused AdamW, the gradient norm read back each step), one row a step. The processes are Ray actors on an
embedded Ray, each with a 1/P share of the GPU for the largest P (as the sweep's trials are Ray actors with a
GPU share), started once and used by every cell that needs them; in a cell they all warm up, then all time
``--steps`` steps each between two device synchronisations. Per cell it prints the step time (the slowest
process's), the rows trained a second by all P processes together, that throughput against one process of the
same rows alone in this run (the *sharing gain*: P processes sharing well give up to P), and the host CPU time
a step. On a GPU a cell of one process is also profiled over ``--profile`` more steps: its kernels a step and
their summed time, so the GPU's busy share of the step, and its ``--top`` heaviest kernels (by name: the
matrix products, elementwise, softmax and optimizer kernels, their dtypes in their names) with their calls and
milliseconds a step and their share of the kernels' time, so one run says where a slow step's time goes. On a
CPU ``--profile N`` (off by default) lists its heaviest operators by their own CPU time instead.

``--mps`` starts NVIDIA's MPS control daemon (``nvidia-cuda-mps-control -d``) with its pipe and log
directories in a temporary directory before any process touches the GPU, and stops it at the end: under MPS
the processes' kernels run side by side. Without the daemon's binary, or if it does not start, it says so and
exits 2.

Last line: JSON, one object per cell.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.pretrain.config import SIZE_PRESETS  # noqa: E402 (after the path)

SIZES = {"tiny": SIZE_PRESETS["tiny"], "gpu": SIZE_PRESETS["small"]}  # hidden, layers, heads, intermediate: the laptop
# default's pretrain size, and the GPU-scale ablation's (experiments/oubiobert_ablation_gpu.yaml)
DEFAULT_CELLS = ["0x1", "1x1", "3x1", "6x1", "18x1", "0x8", "6x2", "6x4", "6x8", "18x4"]
TASK = "chemprot"  # a [CLS] classification head, as ChemProt's and HoC's trials (NER's head is per token)


def parse_cell(text: str) -> tuple[int, int]:
    """``"RxP"`` -> (rows, processes); R = 0: the unbundled trial."""
    rows, sep, procs = text.partition("x")
    if not sep or not rows.isdigit() or not procs.isdigit() or int(procs) < 1:
        raise argparse.ArgumentTypeError(f"cell {text!r}: expected ROWSxPROCESSES, e.g. 6x8 (0 rows: unbundled)")
    return int(rows), int(procs)


def _model_dir(size: str, vocab: int, out: Path) -> Path:
    """A random BERT of ``size`` saved as a sweep's model directory (config and weights; the benchmark makes
    its own token ids, so no tokenizer)."""
    import torch
    from transformers import BertConfig, BertModel

    hidden, layers, heads, inter = SIZES[size]
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                         intermediate_size=inter)).save_pretrained(out)
    return out


class Bench:
    """One process's models and batches; ``step(rows)`` trains one step of an R-row bundle (or, ``rows=0``,
    the unbundled trial's step)."""

    def __init__(self, model_dir: str, vocab: int, device_name: str, precision: str, batch: int, length: int,
                 seed: int):
        import numpy as np
        import torch
        from transformers.utils import logging as hf_logging

        from orchestrator.finetune import bundle
        from orchestrator.finetune.spec import load_task
        from orchestrator.modeling.precision import allow_tf32

        torch.set_num_threads(1)  # a sweep trial's default
        hf_logging.disable_progress_bar()
        bundle._quiet()  # the warnings a bundle raises on purpose
        self.torch = torch
        self.device = torch.device(device_name)
        allow_tf32(self.device)
        self.precision = precision
        self.spec = load_task(TASK)
        self.model_dir = model_dir
        rng = np.random.default_rng(seed)
        self.batches = []
        for _ in range(8):  # cycled: each step reads another shape, as a sweep's batches padded to their longest
            lengths = rng.integers(max(2, length // 4), length + 1, size=batch)
            width = int(lengths.max())
            ids = rng.integers(1000 if vocab > 2000 else 5, vocab, size=(batch, width))
            mask = (np.arange(width)[None, :] < lengths[:, None]).astype("int64")
            self.batches.append((
                {"input_ids": torch.as_tensor(ids * mask, device=self.device),
                 "attention_mask": torch.as_tensor(mask, device=self.device),
                 "token_type_ids": torch.zeros(batch, width, dtype=torch.long, device=self.device)},
                torch.as_tensor(rng.integers(0, len(self.spec.labels), size=batch), device=self.device)))
        self.built: dict[int, tuple] = {}
        self.calls = 0

    def _build(self, rows: int) -> tuple:
        torch = self.torch
        from orchestrator.finetune import bundle
        from orchestrator.finetune.model import TaskModel
        from orchestrator.finetune.optim import linear_schedule, make_optimizer
        from orchestrator.finetune.trial import TrialSpec
        from orchestrator.modeling.precision import make_scaler

        if rows in self.built:
            return self.built[rows]
        self.built.clear()  # one cell's models at a time: 18 rows of the GPU model hold about 5 GB
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        torch.manual_seed(1)
        model = TaskModel(self.model_dir, self.spec).to(self.device)
        model.train()
        if rows == 0:  # the unbundled trial: run_trial's optimizer, schedule and scaler
            trial = TrialSpec(trial_id="bench", model_name="bench", model_dir=self.model_dir, task=TASK, data_dir="",
                              learning_rate=1e-4, seed=1, eval_epochs=(1,), precision=self.precision)
            trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
            optim = make_optimizer(trained, trial)
            schedule = linear_schedule(optim.param_groups, trial, train_size=10 ** 6)
            scaler = make_scaler(self.precision, self.device, init_scale=2.0 ** 16)
            self.built[rows] = (model, [p for _, p in trained], optim, schedule, scaler)
        else:
            learning_rates = [1e-5 * 100 ** (i / max(rows - 1, 1)) for i in range(rows)]
            stack = bundle.StackedWeights(model, learning_rates, weight_decay=0.01, decoupled=True)
            self.built[rows] = (model, stack, bundle._batched_loss(model, stack))
        return self.built[rows]

    def step(self, rows: int) -> None:
        from orchestrator.finetune import bundle
        from orchestrator.modeling.precision import autocast_context, optimizer_update

        batch, labels = self.batches[self.calls % len(self.batches)]
        self.calls += 1
        built = self._build(rows)
        if rows == 0:  # run_trial's step (nothing read back to the host, as the bundle's)
            model, params, optim, schedule, scaler = built
            with autocast_context(self.precision, self.device):
                loss = model.loss(model(**batch).float(), labels)
            scaler.scale(loss).backward()
            optimizer_update(params, optim, schedule, scaler, grad_clip=1.0, read=False)
            return
        _, stack, batched_loss = built
        with autocast_context(self.precision, self.device):
            losses = batched_loss(batch, labels)
        losses.sum().backward()
        stack.step(1.0, bundle.GRAD_CLIP)

    def sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()

    def warm(self, rows: int, steps: int) -> None:
        for _ in range(steps):
            self.step(rows)
        self.sync()

    def timed(self, rows: int, steps: int, profile_steps: int, top: int = 8) -> dict:
        """``steps`` steps between two synchronisations: their wall and this process's CPU seconds; with
        ``profile_steps``, ``profile``'s figures over that many more."""
        self.sync()
        cpu, tick = time.process_time(), time.perf_counter()
        for _ in range(steps):
            self.step(rows)
        self.sync()
        out = {"seconds": time.perf_counter() - tick, "cpu_seconds": time.process_time() - cpu}
        if profile_steps:
            try:
                out.update(self.profile(rows, profile_steps, top))
            except Exception as err:  # a profiler that fails on this device: the timings stand without it
                out["profile_error"] = f"{type(err).__name__}: {err}"
        return out

    def profile(self, rows: int, steps: int, top: int) -> dict:
        """Over ``steps`` steps: on a CUDA device its kernels a step and their summed device time, and the
        ``top`` heaviest kernels by name; on a CPU the ``top`` heaviest operators by their own CPU time."""
        from torch.profiler import ProfilerActivity, profile

        cuda = self.device.type == "cuda"
        self.sync()
        tick = time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]) as prof:
            for _ in range(steps):
                self.step(rows)
            self.sync()
        wall = time.perf_counter() - tick
        out = {"profiled_step_ms": round(wall * 1e3 / steps, 3)}
        if not cuda:
            ops = [(e.key, e.count, e.self_cpu_time_total) for e in prof.key_averages()]
            return {**out, "top": heaviest(ops, steps, top)}
        kernels = _pretrain_profile().kernel_events(prof)  # by name, the profiler's ranges left out
        busy_us = sum(e.self_device_time_total for e in kernels)
        return {**out, "kernels_a_step": round(sum(e.count for e in kernels) / steps, 1),
                "kernel_ms_a_step": round(busy_us / 1e3 / steps, 3),
                "top": heaviest([(e.key, e.count, e.self_device_time_total) for e in kernels], steps, top)}


def _pretrain_profile():
    """benchmarks/pretrain_profile.py as a module (the benchmarks are scripts, not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("pretrain_profile", ROOT / "benchmarks" / "pretrain_profile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def heaviest(timed: list[tuple[str, int, float]], steps: int, top: int) -> list[dict]:
    """The ``top`` entries of (name, calls, microseconds) over ``steps`` steps with the most time: each one's
    calls and milliseconds a step and its share of all the entries' time, heaviest first."""
    total = sum(us for _, _, us in timed) or 1.0
    ranked = sorted(timed, key=lambda entry: (-entry[2], entry[0]))[:top]
    return [{"name": name[:300], "calls_a_step": round(calls / steps, 2), "ms_a_step": round(us / 1e3 / steps, 3),
             "share": round(us / total, 4)} for name, calls, us in ranked]


def start_mps(directory: Path) -> dict[str, str]:
    """Start NVIDIA's MPS control daemon with its pipes and logs under ``directory``; the environment that
    reaches it. SystemExit(2) when it cannot start."""
    control = shutil.which("nvidia-cuda-mps-control")
    if control is None:
        raise SystemExit("bundle_sharing.py: --mps: nvidia-cuda-mps-control is not on PATH")
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(directory / "pipe"), "CUDA_MPS_LOG_DIRECTORY": str(directory / "log")}
    for path in env.values():
        os.makedirs(path, exist_ok=True)
    done = subprocess.run([control, "-d"], env={**os.environ, **env}, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"bundle_sharing.py: --mps: {control} -d exited {done.returncode}: "
                         f"{(done.stderr or done.stdout).strip()}")
    os.environ.update(env)  # the benchmark's processes, started after this, connect to it
    return env


def stop_mps(env: dict[str, str]) -> None:
    control = shutil.which("nvidia-cuda-mps-control")
    if control:
        subprocess.run([control], input="quit\n", env={**os.environ, **env}, capture_output=True, text=True)


def run(cells: list[tuple[int, int]], args: argparse.Namespace, model_dir: Path) -> list[dict]:
    """Every cell on an embedded Ray, with as many benchmark actors (processes) as the largest cell needs,
    each holding a 1/P share of the GPU as a sweep's trials do, started once."""
    import ray

    from orchestrator.core.runtime import init_ray

    count = max(p for _, p in cells)
    gpu = args.device.startswith("cuda")
    init_ray(num_cpus=max(count, os.cpu_count() or 1), num_gpus=1 if gpu else None, log_to_driver=False)
    try:
        bench = ray.remote(num_cpus=1, num_gpus=1 / count if gpu else 0)(Bench)
        actors = [bench.remote(str(model_dir), args.vocab, args.device, args.precision, args.batch, args.length,
                               seed=100 + i) for i in range(count)]
        ray.get([a.sync.remote() for a in actors], timeout=args.timeout)
        out: list[dict] = []
        alone: dict[int, float] = {}  # rows -> one process's rows a second
        for rows, procs in cells:
            profile_steps = args.profile if procs == 1 else 0
            ray.get([a.warm.remote(rows, args.warmup) for a in actors[:procs]], timeout=args.timeout)
            done = ray.get([a.timed.remote(rows, args.steps, profile_steps, args.top) for a in actors[:procs]],
                           timeout=args.timeout)
            slowest = max(d["seconds"] for d in done)
            rate = procs * max(rows, 1) * args.steps / slowest
            if procs == 1:
                alone.setdefault(rows, rate)
            cell = {"cell": f"{rows}x{procs}", "rows": rows, "processes": procs,
                    "step_ms": round(slowest * 1e3 / args.steps, 3), "row_steps_per_s": round(rate, 2),
                    "sharing_gain": round(rate / alone[rows], 3) if rows in alone else None,
                    "host_cpu_ms_a_step": round(max(d["cpu_seconds"] for d in done) * 1e3 / args.steps, 3)}
            for key in ("kernels_a_step", "kernel_ms_a_step", "profiled_step_ms", "top", "profile_error"):
                if key in done[0]:
                    cell[key] = done[0][key]
            if "kernel_ms_a_step" in cell and cell["profiled_step_ms"]:
                cell["gpu_busy"] = round(cell["kernel_ms_a_step"] / cell["profiled_step_ms"], 3)
            out.append(cell)
            print(_line(cell), flush=True)
        return out
    finally:
        ray.shutdown()


def _line(cell: dict) -> str:
    what = "unbundled trials" if cell["rows"] == 0 else f"{cell['rows']}-row bundles"
    text = (f"{cell['cell']}: {cell['processes']} process(es) of {what}: step {cell['step_ms']:.1f} ms, "
            f"{cell['row_steps_per_s']:.1f} row-steps/s together")
    if cell["sharing_gain"] is not None and cell["processes"] > 1:
        text += f", {cell['sharing_gain']:.2f}x one such process alone (up to {cell['processes']})"
    text += f"; host CPU {cell['host_cpu_ms_a_step']:.1f} ms a step"
    if "kernel_ms_a_step" in cell:
        text += (f"; {cell['kernels_a_step']:.0f} kernels, {cell['kernel_ms_a_step']:.2f} ms of kernels a step "
                 f"(GPU busy {cell['gpu_busy']:.0%})")
    if "profile_error" in cell:
        text += f"; profile failed: {cell['profile_error']}"
    what = "kernels" if "kernel_ms_a_step" in cell else "operators (own CPU time)"
    if cell.get("top"):
        text += f"\n  heaviest {what}:"
    for entry in cell.get("top", []):
        name = entry["name"].removeprefix("void ")
        text += (f"\n    {entry['share']:6.1%} {entry['ms_a_step']:8.3f} ms {entry['calls_a_step']:7.1f} calls a step  "
                 + (name if len(name) <= 110 else name[:107] + "..."))
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--size", choices=sorted(SIZES), default="gpu")
    ap.add_argument("--vocab", type=int, default=8000, help="vocabulary (the GPU ablation's arms: 8,000 WordPiece)")
    ap.add_argument("--cells", type=parse_cell, nargs="+", default=[parse_cell(c) for c in DEFAULT_CELLS],
                    metavar="RxP", help=f"rows x processes (default: {' '.join(DEFAULT_CELLS)})")
    ap.add_argument("--precision", choices=("fp32", "bf16"), default=None, help="default: bf16 on cuda, else fp32")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--length", type=int, default=64, help="the longest example (tokens); the shortest a quarter")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--profile", type=int, default=None,
                    help="steps profiled in each one-process cell (default: 5 on cuda, 0 (none) on cpu)")
    ap.add_argument("--top", type=int, default=8, help="the heaviest kernels (cpu: operators) a profile lists")
    ap.add_argument("--mps", action="store_true", help="run the processes under CUDA MPS (starts its daemon)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for a process's answer")
    args = ap.parse_args(argv)
    if args.profile is None:
        args.profile = 5 if args.device.startswith("cuda") else 0
    if (args.steps < 1 or args.warmup < 0 or args.batch < 1 or args.length < 2 or args.vocab < 10 or args.profile < 0
            or args.top < 1):
        ap.error("--steps, --batch, --top must be >= 1, --warmup, --profile >= 0, --length >= 2, --vocab >= 10")
    if args.mps and not args.device.startswith("cuda"):
        ap.error("--mps needs --device cuda")
    args.precision = args.precision or ("bf16" if args.device.startswith("cuda") else "fp32")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    with tempfile.TemporaryDirectory(prefix="bundle_sharing_") as tmp:
        model_dir = _model_dir(args.size, args.vocab, Path(tmp) / "model")
        mps = start_mps(Path(tmp) / "mps") if args.mps else None
        try:
            print(f"{args.size} BERT, vocabulary {args.vocab:,}, batch {args.batch}, lengths up to {args.length}, "
                  f"{args.precision} on {args.device}{' under MPS' if mps else ''}; {args.warmup} warm-up and "
                  f"{args.steps} timed steps a cell", flush=True)
            cells = run(args.cells, args, model_dir)
        finally:
            if mps:
                stop_mps(mps)
    print(json.dumps(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
