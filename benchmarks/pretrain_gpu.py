"""Per-device throughput of the engine's pretraining step: BERT-base at length 128, fp16 and bf16, seq/s and MFU.

    python benchmarks/pretrain_gpu.py                      # on a GPU: BERT-base, fp16 + bf16
    python benchmarks/pretrain_gpu.py --device cpu         # tiny model on CPU: the script works (not a measurement)
    python benchmarks/pretrain_gpu.py --precisions fp32 --no-tf32   # fp32 against the fp32 peak

Times what a Ray Train worker does per optimizer step (``orchestrator.pretrain.loop``), not a bare
forward/backward: its data path (instances in parquet, read and batched by Ray Data, collated and
masked by the loop's ``_micro_batches``, copied to the device by ``_to_device``), ``train_step`` over
``--accumulation`` micro-batches of the module wrapped in DistributedDataParallel (a process group of
one: nccl on CUDA, gloo on CPU, so DDP's hooks and its gradient all-reduce run, with ``no_sync`` on
the accumulated micro-batches), LAMB with clipping and loss scaling, and the all-reduce of the step's
statistics, as the loop does. The instances are synthetic (random ids, every row full length, masks
drawn as the instances stage records them): the data path has the work of a real run. The clock is
read after ``--warmup`` steps, with the device synchronised around the timed steps.

MFU is the training FLOPs (``loop.training_flops_per_token``) per second over the peak of the device,
looked up by its exact name (``orchestrator.pretrain.peaks``: "NVIDIA H100 80GB HBM3" and "NVIDIA H100
PCIe" have different peaks); a device the table does not hold gets ``mfu: null`` and a note, never a
guessed peak. fp32 with TF32 on (the engine's setting on CUDA) is divided by the TF32 peak, fp32 with
``--no-tf32`` by the fp32 peak. Last line printed: JSON.
"""
from __future__ import annotations

import argparse
import json
import socket
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

VOCAB = 30522  # BERT's uncased vocabulary size
SPECIAL = {"pad": 0, "cls": 2, "sep": 3, "mask": 4}


def write_instances(out: Path, rows: int, length: int, masking: str, seed: int = 0) -> Path:
    """Synthetic NSP instances in the instances stage's parquet schema: [CLS] A [SEP] B [SEP], full
    length; static masks as the stage draws them (15 %, at most 20 per 128 tokens), or none (dynamic)."""
    import pyarrow as pa  # heavy: pyarrow
    import pyarrow.parquet as pq

    gen = np.random.default_rng(seed)
    ids = gen.integers(5, VOCAB, size=(rows, length), dtype=np.int32)
    split = gen.integers(length // 4, 3 * length // 4, size=rows)
    ids[:, 0] = SPECIAL["cls"]
    ids[np.arange(rows), split] = SPECIAL["sep"]
    ids[:, -1] = SPECIAL["sep"]
    types = (np.arange(length)[None, :] > split[:, None]).astype(np.int8)
    predictions = max(1, min(round(0.15 * length), round(20 * length / 128)))
    positions, originals = [], []
    for r in range(rows):
        if masking == "static":
            candidates = np.setdiff1d(np.arange(1, length - 1), [split[r]])
            chosen = np.sort(gen.choice(candidates, size=predictions, replace=False)).astype(np.int32)
            positions.append(chosen)
            originals.append(ids[r, chosen].copy())
            ids[r, chosen] = SPECIAL["mask"]
        else:
            positions.append(np.zeros(0, np.int32))
            originals.append(np.zeros(0, np.int32))
    table = pa.table({"input_ids": list(ids), "token_type_ids": list(types), "masked_lm_positions": positions,
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


def measure(size: str, precision: str, batch: int, accumulation: int, length: int, steps: int, warmup: int,
            device: torch.device, instances: Path, masking: str, tf32: bool, cpus: int) -> dict:
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
        _all_reduce,
        _batch_to_torch,
        _to_device,
        estimate_mfu,
        train_step,
        training_flops_per_token,
    )
    from orchestrator.pretrain.model import PretrainingModule, build_model
    from orchestrator.pretrain.optim import build_optimizer, build_scheduler
    from orchestrator.pretrain.peaks import peak_flops

    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
    cfg = from_dict(PretrainConfig, {
        "model": {"size": size, "max_position_embeddings": max(512, length)}, "precision": precision,
        "phase1": {"max_seq_length": length, "steps": warmup + steps, "global_batch_size": batch * accumulation,
                   "device_batch_size": batch, "learning_rate": 1e-4, "warmup_proportion": 0.0},
        "num_workers": 1, "cpus_per_worker": cpus})
    seed_everything(cfg.seed)
    special = Specials(cls=SPECIAL["cls"], sep=SPECIAL["sep"], mask=SPECIAL["mask"], vocab_size=VOCAB,
                       continuation=frozenset(), pad=SPECIAL["pad"])
    model = build_model(cfg.model, VOCAB, SPECIAL["pad"]).to(device)
    module = DistributedDataParallel(PretrainingModule(model), device_ids=[device.index] if device.type == "cuda"
                                     else None)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = build_optimizer(model, cfg.optim, cfg.phase1.learning_rate)
    scheduler = build_scheduler(optimizer, 0, cfg.phase1.steps, cfg.optim.decay_power)
    scaler = make_scaler(precision, device, cfg.init_loss_scale)
    shard = ray.data.read_parquet(str(instances)).select_columns(list(INSTANCE_COLUMNS)).iterator()
    rule = MaskingRule() if masking == "dynamic" else None
    # the loop's data path: read, collate, mask and pin on a background thread, ahead of the steps
    stream = Prefetcher(micro_batches(shard, batch, special, rule, seed=cfg.seed, seed_key=(0, 0, 0),
                                      prefetch=cfg.dataloader_prefetch, pad_to=8 if device.type == "cuda" else 1),
                        depth=max(1, cfg.dataloader_prefetch) * accumulation,
                        transform=_batch_to_torch(True, pin=device.type == "cuda"), name="data-benchmark")

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def step() -> tuple[float, float, float]:
        micro = [_to_device(next(stream)[0], device) for _ in range(accumulation)]
        module.train()
        stats = train_step(module, micro, optimizer, scheduler, scaler, precision=precision, device=device,
                           grad_clip=cfg.optim.grad_clip, params=params)
        _, _, _, _, count, toks = _all_reduce(stats.totals, device)  # the loop's one host sync per step
        return float(stats.sequences), toks, count

    with stream:  # the data thread stops with the measurement
        for _ in range(warmup):
            step()
        sync()
        start = time.perf_counter()
        seqs = toks = masked = 0.0
        for _ in range(steps):
            s, t, m = step()
            seqs, toks, masked = seqs + s, toks + t, masked + m
        sync()
        elapsed = time.perf_counter() - start
    name = device_name(device)
    tf32_on = device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32
    per_token = training_flops_per_token(model, toks / seqs, masked / toks)
    mfu = estimate_mfu(per_token, toks / elapsed, 1, name, precision)
    peak = peak_flops(name, precision, tf32=tf32_on)
    note = None
    if mfu is None:
        note = (f"no peak for device {name!r} in orchestrator/pretrain/peaks.py (exact names only): MFU unknown"
                if device.type == "cuda" else "CPU: no tensor-core peak; MFU is a GPU figure")
    return {"size": size, "precision": precision, "tf32": tf32_on, "batch": batch, "accumulation": accumulation,
            "length": length, "masking": masking, "steps": steps, "seq_per_s": round(seqs / elapsed, 2),
            "tokens_per_s": round(toks / elapsed, 1), "mfu": None if mfu is None else round(mfu, 4),
            "peak_tflops": None if peak is None else peak / 1e12, "device": name, "note": note}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto", help="auto (cuda when there is one), cuda, cuda:N or cpu")
    p.add_argument("--size", default=None, help="model size preset (default: base on GPU, tiny on CPU)")
    p.add_argument("--batch", type=int, default=None, help="sequences per micro-batch (default 256 GPU / 8 CPU)")
    p.add_argument("--accumulation", type=int, default=2, help="micro-batches per optimizer step")
    p.add_argument("--length", type=int, default=128)
    p.add_argument("--steps", type=int, default=None, help="timed steps (default 20 GPU / 3 CPU)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 5 GPU / 1 CPU)")
    p.add_argument("--precisions", default="fp16,bf16", help="comma-separated: fp32, bf16, fp16")
    p.add_argument("--masking", choices=("static", "dynamic"), default="static",
                   help="static: masks read from the instances (the default recipe); dynamic: drawn per batch")
    p.add_argument("--no-tf32", dest="tf32", action="store_false",
                   help="fp32 matmuls in full fp32 (the engine turns TF32 on for CUDA)")
    p.add_argument("--cpus", type=int, default=None,
                   help="Ray CPUs for the data reads (and torch threads on CPU); default 2 on CPU, up to 8 on GPU")
    args = p.parse_args(argv)
    from orchestrator.core.runtime import ray_session

    wanted = "cuda" if args.device == "auto" and torch.cuda.is_available() else args.device
    device = torch.device("cpu" if wanted == "auto" else wanted)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    gpu = device.type == "cuda"
    if args.cpus is None:
        from orchestrator.core.runtime import available_cpus

        args.cpus = min(8, available_cpus()) if gpu else 2
    size = args.size or ("base" if gpu else "tiny")
    batch = args.batch or (256 if gpu else 8)
    steps = args.steps or (20 if gpu else 3)
    warmup = args.warmup if args.warmup is not None else (5 if gpu else 1)
    if not gpu:
        print("no GPU: CPU run of a tiny model (checks the script works; these are not GPU numbers)")
        torch.set_num_threads(args.cpus)
    process_group(device)
    results = []
    with tempfile.TemporaryDirectory(prefix="pretrain_gpu_") as tmp, \
            ray_session(num_cpus=args.cpus, log_to_driver=False):
        rows = (warmup + steps) * args.accumulation * batch
        instances = write_instances(Path(tmp) / "instances", rows, args.length, args.masking)
        for prec in args.precisions.split(","):
            results.append(measure(size, prec, batch, args.accumulation, args.length, steps, warmup, device,
                                   instances, args.masking, args.tf32, args.cpus))
            r = results[-1]
            print(f"{r['device']}: {r['size']} len {r['length']} batch {r['batch']} x {r['accumulation']} "
                  f"{r['precision']}{' (TF32)' if r['tf32'] and r['precision'] == 'fp32' else ''}: "
                  f"{r['seq_per_s']} seq/s, MFU {r['mfu']}" + (f" ({r['note']})" if r["note"] else ""), flush=True)
    summary = {"gpu": gpu, "smoke": not gpu, "results": results}
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
