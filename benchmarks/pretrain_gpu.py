"""Per-device throughput of the engine's pretraining step, and what each speed technique is worth.

    python benchmarks/pretrain_gpu.py                        # GPU: BERT-base and small, bf16, ablation table
    python benchmarks/pretrain_gpu.py --sizes base --precisions fp16,bf16 --ablate none
    python benchmarks/pretrain_gpu.py --device cpu           # tiny model on CPU: the script works (smoke)
    python benchmarks/pretrain_gpu.py --device cpu --sizes mini --batch 32 --length 128 --steps 4 --repeats 3
                                                             # CPU: the masked-only decoder's speed-up

Times what a Ray Train worker does per optimizer step (``orchestrator.pretrain.loop``), not a bare
forward/backward: its data path (instances in parquet, read and batched by Ray Data, collated and
masked by ``micro_batches`` on the loop's ``Prefetcher`` thread, copied to the device by
``_to_device``), ``train_step`` over ``--accumulation`` micro-batches, the optimizer with clipping and
loss scaling, and the all-reduce of the step's statistics over a process group of one (nccl on CUDA,
gloo on CPU), as the loop of a one-worker run does. With ``--ddp`` the module is wrapped in
DistributedDataParallel as in a run of several workers (its hooks, bucket copies and gradient
all-reduce run, with ``no_sync`` on the accumulated micro-batches); Ray Train's ``prepare_model``
leaves a one-worker run unwrapped. Every figure recorded up to session 20 was taken with DDP, a cost a
one-worker run does not pay. The
instances are synthetic (random ids; masks drawn as the instances stage records them); with
``--lengths real`` (the default) the rows are as long as real instances' (37 % full length, the rest
shorter, about a quarter of a batch's positions padding), with ``--lengths full`` every row is full
length (no padding: how the figures before ``pretrain.speed.unpad`` were measured). The clock is read
after ``--warmup`` steps, with the device synchronised around the timed steps.

Per configuration: seq/s, tokens/s, MFU, the first step's time (it holds torch.compile's compile, so
it is reported apart from the steady state), the share of the timed steps spent waiting for the
data thread, and the peak device memory. The ablation (``--ablate each``) measures every
``pretrain.speed`` technique switched off in turn against all of them on, and all off; with
``--repeats`` the configurations run in turn that many times (a load that comes and goes falls on
all of them) and each figure is the median. The ``+ no_host_reads`` row is all on with a step that reads
nothing back to the host: the loop reads the gradient norm (LAMB's skip of a non-finite step is decided on
the host) and the step's all-reduced statistics once a step; the row steps without the skip and reads the
statistics once, after the timed steps, so the host may queue steps ahead of the device. Its gain over all on
is the most that deferring those reads could give (bf16 and fp32: fp16's loss scaler reads its scale).

MFU is ``loop.MFU_FORMULA`` (printed): the training FLOPs (``loop.training_flops_per_token``) per
second over the peak of the device, looked up by its exact name (``orchestrator.pretrain.peaks``); a
device the table does not hold (a CPU) gets ``mfu: null``, never a guessed peak. fp32 with TF32 on
(the engine's setting on CUDA) is divided by the TF32 peak, with ``--no-tf32`` by the fp32 peak.
Last line printed: JSON.
"""
from __future__ import annotations

import argparse
import json
import socket
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from orchestrator.pretrain.config import PretrainConfig

VOCAB = 30522  # BERT's uncased vocabulary size
SPECIAL = {"pad": 0, "cls": 2, "sep": 3, "mask": 4}


#: Real instances' lengths (benchmarks/RESULTS.md, two length-128 sets from ../shared/data): 37 % of the
#: rows full length, the others shorter; batched and padded to their longest row, 25-26 % padding.
FULL_SHARE = 0.37


def row_lengths(gen: np.random.Generator, rows: int, length: int, lengths: str) -> np.ndarray:
    """Each row's real length: ``full`` = every row ``length`` (no padding, the earlier figures);
    ``real`` = FULL_SHARE of the rows full, the rest uniform between a quarter and all of ``length``."""
    if lengths == "full":
        return np.full(rows, length)
    short = gen.integers(max(8, length // 4), length, size=rows)
    return np.where(gen.random(rows) < FULL_SHARE, length, short)


def write_instances(out: Path, rows: int, length: int, masking: str, seed: int = 0, lengths: str = "full") -> Path:
    """Synthetic NSP instances in the instances stage's parquet schema: [CLS] A [SEP] B [SEP], each row
    as long as ``row_lengths`` says; static masks as the stage draws them (15 %, at most 20 per 128
    tokens), or none (dynamic)."""
    import pyarrow as pa  # heavy: pyarrow
    import pyarrow.parquet as pq

    gen = np.random.default_rng(seed)
    sizes = row_lengths(gen, rows, length, lengths)
    ids = [gen.integers(5, VOCAB, size=n, dtype=np.int32) for n in sizes]
    split = [int(gen.integers(n // 4, 3 * n // 4)) for n in sizes]
    types = []
    for row, cut in zip(ids, split):
        row[0], row[cut], row[-1] = SPECIAL["cls"], SPECIAL["sep"], SPECIAL["sep"]
        types.append((np.arange(len(row)) > cut).astype(np.int8))
    positions, originals = [], []
    for row, cut in zip(ids, split):
        if masking == "static":
            predictions = max(1, min(round(0.15 * len(row)), round(20 * length / 128)))
            candidates = np.setdiff1d(np.arange(1, len(row) - 1), [cut])
            chosen = np.sort(gen.choice(candidates, size=predictions, replace=False)).astype(np.int32)
            positions.append(chosen)
            originals.append(row[chosen].copy())
            row[chosen] = SPECIAL["mask"]
        else:
            positions.append(np.zeros(0, np.int32))
            originals.append(np.zeros(0, np.int32))
    table = pa.table({"input_ids": ids, "token_type_ids": types, "masked_lm_positions": positions,
                      "masked_lm_ids": originals, "next_sentence_label": gen.integers(0, 2, rows).astype(np.int8)},
                     schema=pa.schema([("input_ids", pa.list_(pa.int32())), ("token_type_ids", pa.list_(pa.int8())),
                                       ("masked_lm_positions", pa.list_(pa.int32())),
                                       ("masked_lm_ids", pa.list_(pa.int32())), ("next_sentence_label", pa.int8())]))
    out.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, out / "part-00000.parquet")
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_group(device: torch.device) -> None:
    """A torch.distributed world of one on loopback (nccl on CUDA, gloo on CPU), as a Train worker has."""
    import torch.distributed as dist  # heavy: torch.distributed

    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


#: A row's pseudo-setting (not a ``pretrain.speed`` field): the timed steps read nothing back (``measure``).
NO_HOST_READS = "no_host_reads"


class _StepsWithoutSkip:
    """The optimizer as ``optimizer_update(read=False)`` takes one that skips on the device, stepping always:
    a step with non-finite gradients is not skipped (the benchmark's are finite). LAMB skips on the host, so
    the loop reads the gradient norm; this wrapper measures the step without that read."""
    skips_on_device = True

    def __init__(self, optimizer):
        self.optimizer = optimizer

    def step(self, found_inf=None):
        self.optimizer.step()

    def __getattr__(self, name):
        return getattr(self.optimizer, name)


def speed_configs(ablate: str, compile_on: bool, optim: str, precision: str = "bf16") -> list[tuple[str, dict]]:
    """(label, pretrain.speed overrides): all on, then each technique off in turn, then all off. With
    compile on, "all on" compiles the unpadded encoder (dynamic shapes) and "- compile" is the engine's
    default (unpad, eager); the techniques not yet on by default follow it: "+ compile_head" (the heads
    and losses compiled too), "+ compile_optimizer" (LAMB's update compiled; LAMB only), "+ cuda_graphs",
    all of these together, then (bf16) "+ cuda_graphs + fp8" (FP8's casts are more kernels: without
    the graphs a host-bound step would only get slower)."""
    on = {"masked_only_head": True, "attention": "sdpa", "fused_optimizer": True, "compile": compile_on,
          "unpad": True}
    # the step reading nothing back to the host (no grad-norm read for the skip, no per-step statistics read):
    # what deferring the loop's one host sync a step would gain at most
    configs = [("all on", on), ("+ no_host_reads", {**on, NO_HOST_READS: True})]
    if compile_on:  # not yet on by default: measured beside all on until they are
        extras = ["compile_head", *(["compile_optimizer"] if optim == "lamb" else []), "cuda_graphs"]
        configs += [(f"+ {key}", {**on, key: True}) for key in extras]
        configs.append(("+ " + " + ".join(extras), {**on, **dict.fromkeys(extras, True)}))
        if precision == "bf16":
            configs.append(("+ cuda_graphs + fp8", {**on, "cuda_graphs": True, "fp8": True}))
    if ablate == "none":
        return configs
    offs = [("masked_only_head", False), ("attention", "eager")]
    if optim == "adamw":  # LAMB is always multi-tensor: the switch changes nothing there
        offs.append(("fused_optimizer", False))
    if compile_on:
        offs.append(("compile", False))
    offs.append(("unpad", False))
    configs += [(f"- {key}" if value is False else f"- {key}={value}", {**on, key: value}) for key, value in offs]
    configs.append(("all off", {**on, **dict(offs)}))
    return configs


def select_rows(configs: list[tuple[str, dict]], rows: str) -> list[tuple[str, dict]]:
    """The configurations ``--rows`` names (comma-separated labels), in the table's order; a label the
    table does not have is an error, not a row silently left out."""
    wanted = [label.strip() for label in rows.split(",") if label.strip()]
    unknown = [label for label in wanted if label not in dict(configs)]
    if unknown:
        raise SystemExit(f"--rows: no row {', '.join(map(repr, unknown))}; this run's rows: "
                         f"{', '.join(label for label, _ in configs)}")
    return [(label, speed) for label, speed in configs if label in wanted]


def measure(size: str, precision: str, speed: dict, batch: int, accumulation: int, length: int, steps: int,
            warmup: int, device: torch.device, instances: Path, masking: str, tf32: bool, cpus: int,
            optim: str, ddp: bool = False) -> dict:
    import ray.data  # heavy: ray
    from torch.nn.parallel import DistributedDataParallel

    from orchestrator.core.artifacts import INSTANCE_COLUMNS
    from orchestrator.core.config import from_dict
    from orchestrator.core.runtime import seed_everything
    from orchestrator.instances.config import MaskingRule, Specials
    from orchestrator.modeling.precision import make_scaler
    from orchestrator.pretrain.config import PretrainConfig
    from orchestrator.pretrain.data import Prefetcher, micro_batches
    from orchestrator.pretrain.loop import (
        STAT_FIELDS,
        _all_reduce,
        _batch_to_torch,
        _to_device,
        estimate_mfu,
        static_shapes,
        train_step,
        training_flops_per_token,
    )
    from orchestrator.pretrain.optim import build_scheduler

    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    torch._dynamo.reset()  # each configuration compiles afresh (its first step holds the compile)
    read = not speed.get(NO_HOST_READS, False)
    speed = {k: v for k, v in speed.items() if k != NO_HOST_READS}
    cfg = from_dict(PretrainConfig, {
        "model": {"size": size, "max_position_embeddings": max(512, length)}, "precision": precision,
        "phase1": {"max_seq_length": length, "steps": warmup + steps, "global_batch_size": batch * accumulation,
                   "device_batch_size": batch, "learning_rate": 1e-4, "warmup_proportion": 0.0},
        "optim": {"name": optim}, "speed": speed, "num_workers": 1, "cpus_per_worker": cpus})
    seed_everything(cfg.seed)
    special = Specials(cls=SPECIAL["cls"], sep=SPECIAL["sep"], mask=SPECIAL["mask"], vocab_size=VOCAB,
                       continuation=frozenset(), pad=SPECIAL["pad"])

    def ddp_wrap(m: torch.nn.Module) -> torch.nn.Module:
        """As Ray Train's prepare_model wraps the module in a world of more than one worker (not of one)."""
        return DistributedDataParallel(m, device_ids=[device.index] if device.type == "cuda" else None)

    model, module, optimizer, params = engine(cfg, device, wrap=ddp_wrap if ddp else None)
    scheduler = build_scheduler(optimizer, 0, cfg.phase1.steps, cfg.optim.decay_power)
    scaler = make_scaler(precision, device, cfg.init_loss_scale)
    if not read:  # fp16's scaler still reads its scale: the row is for bf16 and fp32
        optimizer = _StepsWithoutSkip(optimizer)
    shard = ray.data.read_parquet(str(instances)).select_columns(list(INSTANCE_COLUMNS)).iterator()
    rule = MaskingRule() if masking == "dynamic" else None
    # the loop's data path: read, collate, mask and pin on a background thread, ahead of the steps
    stream = Prefetcher(micro_batches(shard, batch, special, rule, seed=cfg.seed, seed_key=(0, 0, 0),
                                      prefetch=cfg.dataloader_prefetch, pad_to=8 if device.type == "cuda" else 1,
                                      shapes=static_shapes(cfg.speed, batch, length)),
                        depth=max(1, cfg.dataloader_prefetch) * accumulation,
                        transform=_batch_to_torch(True, pin=device.type == "cuda"), name="data-benchmark")

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    # the packed encoder's input shapes (its token count) by when each was first seen: a compiled encoder
    # specialises, and CUDA graphs record, per shape, so a shape first seen in the timed steps puts that
    # cost in the figure
    shapes: dict[str, set] = {"warm-up": set(), "timed": set()}
    phase = "warm-up"

    timed_totals = []  # the timed steps' statistics, on the device: read once, after the steps

    def step() -> tuple[float, float]:
        waited = 0.0
        micro = []
        for _ in range(accumulation):
            t = time.perf_counter()
            batch_ = next(stream)[0]
            waited += time.perf_counter() - t
            shapes[phase].add(len(batch_["real_index"]) if "real_index" in batch_ else tuple(batch_["input_ids"].shape))
            micro.append(_to_device(batch_, device))
        module.train()
        stats = train_step(module, micro, optimizer, scheduler, scaler, precision=precision, device=device,
                           grad_clip=cfg.optim.grad_clip, params=params, cuda_graphs=cfg.speed.cuda_graphs,
                           read=read)
        if read:
            _all_reduce(stats.totals, device)  # the loop's host sync a step (it reads the all-reduced values)
        if phase == "timed":
            timed_totals.append(stats.totals)
        return float(stats.sequences), waited

    with stream:  # the data thread stops with the measurement
        sync()
        t0 = time.perf_counter()
        first_wait = step()[1]
        sync()
        first_step_s = time.perf_counter() - t0 - first_wait  # compute only: Ray Data's start-up is not in it
        for _ in range(warmup - 1):
            step()
        sync()
        phase = "timed"
        start = time.perf_counter()
        seqs = waited = 0.0
        for _ in range(steps):
            s, w = step()
            seqs, waited = seqs + s, waited + w
        sync()
        elapsed = time.perf_counter() - start
    sums = dict(zip(STAT_FIELDS, torch.stack(timed_totals).sum(0).tolist()))
    toks, masked = sums["tokens"], sums["mlm_count"]
    name = device_name(device)
    per_token = training_flops_per_token(model, toks / seqs, masked / toks)
    mfu = estimate_mfu(per_token, toks / elapsed, 1, name, precision)
    peak_mem = torch.cuda.max_memory_allocated(device) / 2 ** 30 if device.type == "cuda" else None
    return {"size": size, "precision": precision, "speed": speed, "seq_per_s": seqs / elapsed,
            "tokens_per_s": toks / elapsed, "mfu": mfu, "first_step_s": first_step_s, "step_s": elapsed / steps,
            "data_wait_share": waited / elapsed, "peak_memory_gib": peak_mem,
            "shapes_warmup": len(shapes["warm-up"]), "shapes_new_timed": len(shapes["timed"] - shapes["warm-up"]),
            "loss": sums["loss"] / steps}  # the timed steps' mean loss: the row trained


def synthetic_batches(batch: int, length: int, lengths: str, count: int, device: torch.device,
                      static: bool = False) -> list[dict]:
    """``count`` collated micro-batches of ``batch`` random rows (``row_lengths``), masked as the
    instances stage does, with the data thread's token positions (``indices``), on ``device``;
    ``static``: in ``speed.cuda_graphs``' static shapes."""
    from orchestrator.instances.config import MaskingRule, Specials
    from orchestrator.pretrain.data import StaticShapes, collate
    from orchestrator.pretrain.loop import _to_device

    special = Specials(cls=SPECIAL["cls"], sep=SPECIAL["sep"], mask=SPECIAL["mask"], vocab_size=VOCAB,
                       continuation=frozenset(), pad=SPECIAL["pad"])
    gen = np.random.default_rng(0)
    shapes = StaticShapes.for_batch(batch, length) if static else None
    sizes = row_lengths(gen, batch, length, lengths)
    rows = {"input_ids": [gen.integers(5, VOCAB, size=n) for n in sizes], "token_type_ids":
            [np.zeros(n, np.int64) for n in sizes], "next_sentence_label": gen.integers(0, 2, batch)}
    return [_to_device({k: torch.from_numpy(v) for k, v in collate(rows, special, rule=MaskingRule(), gen=gen,
                                                                   indices=True, shapes=shapes).items()}, device)
            for _ in range(count)]


def step_setup(size: str, speed: dict, optim: str, batch: int, length: int, device: torch.device,
               precision: str) -> tuple:
    """What ``train_step`` takes for one configuration, without Ray or DDP: (module, optimizer,
    scheduler, scaler, trained parameters); the model seeded alike for every configuration, compiled
    when ``speed`` says so."""
    from orchestrator.core.config import from_dict
    from orchestrator.modeling.precision import make_scaler
    from orchestrator.pretrain.config import PretrainConfig
    from orchestrator.pretrain.optim import build_scheduler

    cfg = from_dict(PretrainConfig, {"model": {"size": size, "max_position_embeddings": max(512, length)},
                                     "optim": {"name": optim}, "speed": speed, "num_workers": 1,
                                     "precision": precision,
                                     "phase1": {"max_seq_length": length, "global_batch_size": batch,
                                                "device_batch_size": batch, "learning_rate": 1e-4}})
    torch.manual_seed(0)
    _, module, optimizer, params = engine(cfg, device)
    return (module, optimizer, build_scheduler(optimizer, 0, 10 ** 6, 1.0), make_scaler(precision, device, 2.0 ** 16),
            params)


def engine(cfg: PretrainConfig, device: torch.device,
           wrap: Callable[[torch.nn.Module], torch.nn.Module] | None = None) -> tuple:
    """The model, the module the step runs, the optimizer and the trained parameters, built from ``cfg``
    as the loop builds them (``training_module``, ``optimizer_for``; FP8 checked first), on ``device``:
    (model, module, optimizer, parameters). ``wrap``: as the loop's ``prepare_model``."""
    from orchestrator.pretrain.float8 import check_fp8
    from orchestrator.pretrain.model import build_model, training_module
    from orchestrator.pretrain.optim import optimizer_for

    if cfg.speed.fp8:
        check_fp8(device)
    model = build_model(cfg.model, VOCAB, SPECIAL["pad"], attention=cfg.speed.attention,
                        fp8=cfg.speed.fp8).to(device)
    module = training_module(model, cfg.speed, wrap=wrap)
    optimizer = optimizer_for(model, cfg, cfg.phase1.learning_rate)
    return model, module, optimizer, [p for p in model.parameters() if p.requires_grad]


def step_ratios(size: str, batch: int, length: int, steps: int, repeats: int, device: torch.device,
                precision: str, optim: str, lengths: str = "full") -> dict:
    """The engine's ``train_step`` alone (no Ray Data, no DDP: the model's work only), each technique
    off against all on, interleaved ``repeats`` times on the same pre-collated batches: the median
    ratio of step times. On a loaded CPU this isolates what a technique saves from the data path's
    noise (``--step-only``). On CPU the clock is the process's CPU time on one torch thread: a loaded
    machine stretches the wall time of a step, much less the CPU time it takes."""
    from orchestrator.pretrain.loop import train_step

    batches = synthetic_batches(batch, length, lengths, steps, device)
    configs = [(label, speed) for label, speed in speed_configs("each", False, optim) if label != "all off"]
    setups = {label: step_setup(size, speed, optim, batch, length, device, precision) for label, speed in configs}

    clock = time.perf_counter if device.type == "cuda" else time.process_time
    if device.type != "cuda":
        torch.set_num_threads(1)

    def timed(label: str) -> float:
        module, optimizer, scheduler, scaler, params = setups[label]
        module.train()
        start = clock()
        for b in batches:
            train_step(module, [b], optimizer, scheduler, scaler, precision=precision, device=device,
                       grad_clip=1.0, params=params)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return (clock() - start) / len(batches)

    for label, _ in configs:  # warm-up: allocator, first-call costs
        timed(label)
    ratios: dict[str, list[float]] = {label: [] for label, _ in configs[1:]}
    seconds: dict[str, list[float]] = {label: [] for label, _ in configs}
    for _ in range(repeats):
        base = timed("all on")
        seconds["all on"].append(base)
        for label, _ in configs[1:]:
            t = timed(label)
            seconds[label].append(t)
            ratios[label].append(t / base)
    return {"size": size, "batch": batch, "length": length, "precision": precision, "optim": optim,
            "repeats": repeats, "step_s": {k: statistics.median(v) for k, v in seconds.items()},
            "all_on_speedup_over": {k: statistics.median(v) for k, v in ratios.items()},
            "paired": {k: [round(x, 3) for x in v] for k, v in ratios.items()}}


def _median_of(runs: list[dict]) -> dict:
    out = dict(runs[0])
    for key in ("seq_per_s", "tokens_per_s", "mfu", "first_step_s", "step_s", "data_wait_share", "peak_memory_gib"):
        values = [r[key] for r in runs if r[key] is not None]
        out[key] = statistics.median(values) if values else None
    return out


def _fmt(value, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def table(rows: list[dict]) -> str:
    """The ablation as a markdown table; ``vs all on`` is the configuration's seq/s over all-on's."""
    lines = ["| configuration | seq/s | tokens/s | MFU | vs all on | first step s | steady step s | data wait | "
             "peak mem GiB |", "|---|---|---|---|---|---|---|---|---|"]
    base = rows[0]["seq_per_s"]
    for r in rows:
        lines.append(f"| {r['label']} | {r['seq_per_s']:,.1f} | {r['tokens_per_s']:,.0f} | {_fmt(r['mfu'], '.3f')} | "
                     f"{r['seq_per_s'] / base:.3f} | {r['first_step_s']:.2f} | {r['step_s']:.3f} | "
                     f"{r['data_wait_share']:.1%} | {_fmt(r['peak_memory_gib'], '.2f')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto", help="auto (cuda when there is one), cuda, cuda:N or cpu")
    p.add_argument("--sizes", default=None, help="comma-separated size presets (default: base,small on GPU, tiny "
                                                 "on CPU); small = 4 layers, hidden 512")
    p.add_argument("--batch", type=int, default=None, help="sequences per micro-batch (default 256 GPU / 8 CPU)")
    p.add_argument("--accumulation", type=int, default=2, help="micro-batches per optimizer step")
    p.add_argument("--length", type=int, default=None, help="sequence length (default 128 GPU / 32 CPU)")
    p.add_argument("--steps", type=int, default=None, help="timed steps (default 20 GPU / 2 CPU)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps first, the first one timed apart "
                                                            "(default 5 GPU / 1 CPU; at least 1)")
    p.add_argument("--precisions", default=None, help="comma-separated: fp32, bf16, fp16 (default bf16 GPU / fp32 CPU)")
    p.add_argument("--optim", choices=("lamb", "adamw"), default="lamb",
                   help="lamb (the recipe; always multi-tensor) or adamw (fused on CUDA: its switch is ablated)")
    p.add_argument("--ablate", choices=("each", "none"), default="each",
                   help="each: every pretrain.speed technique off in turn, then all off; none: all on only")
    p.add_argument("--ddp", action="store_true",
                   help="wrap the module in DistributedDataParallel (a world of one: its hooks, bucket copies and "
                        "all-reduce launches), as a run of several workers does; without it, as a one-worker run "
                        "does (Ray Train's prepare_model wraps only for more than one)")
    p.add_argument("--rows", default=None,
                   help="comma-separated row labels to measure, of those --ablate gives (e.g. 'all on,+ cuda_graphs')")
    p.add_argument("--compile", choices=("auto", "on", "off"), default="auto",
                   help="torch.compile in the all-on configuration (auto: on for CUDA, off on CPU: inductor "
                        "takes minutes of CPU to compile)")
    p.add_argument("--repeats", type=int, default=1, help="rounds of all configurations, run in turn; medians")
    p.add_argument("--step-only", action="store_true",
                   help="time train_step alone (no Ray Data, no DDP) with each technique off against all on, "
                        "interleaved --repeats times: the median ratio (what each saves, on a loaded CPU)")
    p.add_argument("--lengths", choices=("real", "full"), default="real",
                   help="real: rows as long as real instances (37 %% full length, the rest shorter: ~24 %% padding "
                        "in batches), where pretrain.speed.unpad saves work; full: every row full length (no "
                        "padding: the figures recorded before unpad)")
    p.add_argument("--masking", choices=("static", "dynamic"), default="static",
                   help="static: masks read from the instances (the default recipe); dynamic: drawn per batch")
    p.add_argument("--no-tf32", dest="tf32", action="store_false",
                   help="fp32 matmuls in full fp32 (the engine turns TF32 on for CUDA)")
    p.add_argument("--cpus", type=int, default=None,
                   help="Ray CPUs for the data reads (and torch threads on CPU); default 2 on CPU, up to 8 on GPU")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    from orchestrator.core.runtime import ray_session
    from orchestrator.pretrain.loop import MFU_FORMULA
    from orchestrator.pretrain.peaks import peak_flops

    wanted = "cuda" if args.device == "auto" and torch.cuda.is_available() else args.device
    device = torch.device("cpu" if wanted == "auto" else wanted)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    gpu = device.type == "cuda"
    if args.cpus is None:
        from orchestrator.core.runtime import available_cpus

        args.cpus = min(8, available_cpus()) if gpu else 2
    sizes = (args.sizes or ("base,small" if gpu else "tiny")).split(",")
    precisions = (args.precisions or ("bf16" if gpu else "fp32")).split(",")
    batch = args.batch or (256 if gpu else 8)
    length = args.length or (128 if gpu else 32)
    steps = args.steps or (20 if gpu else 2)
    warmup = max(1, args.warmup if args.warmup is not None else (5 if gpu else 1))
    compile_on = args.compile == "on" or (args.compile == "auto" and gpu)
    if not gpu:
        print("no GPU: a CPU run (checks the script works; these are not GPU numbers)")
        torch.set_num_threads(args.cpus)
    name = device_name(device)
    print(f"device {name}; MFU: {MFU_FORMULA}")
    for prec in precisions:
        peak = peak_flops(name, prec, tf32=gpu and args.tf32)
        print(f"  peak for {prec}: " + (f"{peak / 1e12:g} TFLOP/s" if peak else
                                        "none in orchestrator/pretrain/peaks.py (exact names): MFU n/a"))
    if args.step_only:
        out = [step_ratios(size, batch, length, steps, args.repeats, device, prec, args.optim, args.lengths)
               for size in sizes for prec in precisions]
        for r in out:
            print(f"{name}: {r['size']} len {r['length']} batch {r['batch']} {r['precision']}: all on "
                  f"{r['step_s']['all on']:.3f} s/step; speed-up of all on over " +
                  ", ".join(f"[{k}] {v:.3f}x" for k, v in r["all_on_speedup_over"].items()), flush=True)
        summary = {"gpu": gpu, "device": name, "step_only": out}
        print(json.dumps(summary))
        return summary
    process_group(device)
    results = []
    with tempfile.TemporaryDirectory(prefix="pretrain_gpu_") as tmp, \
            ray_session(num_cpus=args.cpus, log_to_driver=False):
        rows = (warmup + steps) * args.accumulation * batch
        instances = write_instances(Path(tmp) / "instances", rows, length, args.masking, lengths=args.lengths)
        for size in sizes:
            for prec in precisions:
                configs = speed_configs(args.ablate, compile_on, args.optim, prec)
                if args.rows:
                    configs = select_rows(configs, args.rows)
                runs: dict[str, list[dict]] = {label: [] for label, _ in configs}
                for _ in range(args.repeats):
                    for label, speed in configs:
                        runs[label].append(measure(size, prec, speed, batch, args.accumulation, length, steps,
                                                   warmup, device, instances, args.masking, args.tf32, args.cpus,
                                                   args.optim, ddp=args.ddp))
                        r = runs[label][-1]
                        print(f"  {size} {prec} [{label}]: {r['seq_per_s']:,.1f} seq/s, MFU {_fmt(r['mfu'], '.3f')}, "
                              f"first step {r['first_step_s']:.2f}s, encoder shapes {r['shapes_warmup']} in warm-up "
                              f"+ {r['shapes_new_timed']} new in the timed steps", flush=True)
                block = [{"label": label, **_median_of(runs[label])} for label, _ in configs]
                print(f"\n{name}: {size}, length {length}, batch {batch} x {args.accumulation}, {prec}"
                      f"{' (TF32)' if gpu and args.tf32 and prec == 'fp32' else ''}, {args.optim}, "
                      f"{args.repeats} repeat(s), medians\n{table(block)}\n", flush=True)
                results += [{**r, "device": name, "batch": batch, "accumulation": args.accumulation,
                             "length": length, "optim": args.optim} for r in block]
    summary = {"gpu": gpu, "smoke": not gpu, "device": name, "mfu_formula": MFU_FORMULA, "ddp": args.ddp,
               "results": results}
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
