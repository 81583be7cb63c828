"""Per-device throughput of the pretraining step: BERT-base at length 128, fp16 and bf16, seq/s and MFU.

    python benchmarks/pretrain_gpu.py                 # on a GPU: BERT-base, fp16 + bf16
    python benchmarks/pretrain_gpu.py --size tiny     # what CPU runs use (a smoke test, not a measurement)

Measures exactly the engine's optimizer step (``orchestrator.pretrain.loop.train_step``: encoder,
MLM head on masked positions only, NSP head, LAMB, loss scaling) on random tokens with 15 % of
positions masked, after warm-up steps, synchronising the device around the timed region. Without
a GPU it runs a tiny model for a few steps and says so, so that the script cannot rot.
Last line printed: JSON.
"""
from __future__ import annotations

import argparse
import json
import time

import torch


def synthetic_batch(batch: int, length: int, vocab: int, device: torch.device, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (batch, length), generator=g)
    labels = torch.full_like(ids, -100)
    chosen = torch.rand(batch, length, generator=g) < 0.15
    labels[chosen] = ids[chosen]
    ids[chosen] = 4
    return {"input_ids": ids.to(device), "token_type_ids": torch.zeros_like(ids).to(device),
            "attention_mask": torch.ones_like(ids).to(device), "labels": labels.to(device),
            "next_sentence_label": torch.randint(0, 2, (batch,), generator=g).to(device)}


def measure(size: str, precision: str, batch: int, length: int, steps: int, warmup: int,
            device: torch.device) -> dict:
    from orchestrator.modeling.precision import make_scaler
    from orchestrator.pretrain.config import ModelConfig, OptimConfig
    from orchestrator.pretrain.loop import estimate_mfu, train_step, training_flops_per_token
    from orchestrator.pretrain.model import PretrainingModule, build_model
    from orchestrator.pretrain.optim import build_optimizer, build_scheduler

    vocab = 30522
    model = build_model(ModelConfig(size=size), vocab, 0).to(device)
    module = PretrainingModule(model).train()
    optimizer = build_optimizer(model, OptimConfig(name="lamb"), 1e-4)
    scheduler = build_scheduler(optimizer, 0, steps + warmup + 1, 1.0)
    scaler = make_scaler(precision, device, 2.0 ** 16)
    params = [p for p in model.parameters() if p.requires_grad]
    batches = [synthetic_batch(batch, length, vocab, device, s) for s in range(4)]

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    for s in range(warmup):
        train_step(module, [batches[s % 4]], optimizer, scheduler, scaler, precision=precision, device=device,
                   grad_clip=1.0, params=params)
    sync()
    start = time.perf_counter()
    for s in range(steps):
        train_step(module, [batches[s % 4]], optimizer, scheduler, scaler, precision=precision, device=device,
                   grad_clip=1.0, params=params)
    sync()
    elapsed = time.perf_counter() - start
    seq_per_s = batch * steps / elapsed
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    masked = float((batches[0]["labels"] != -100).float().mean())
    mfu = estimate_mfu(training_flops_per_token(model, length, masked), seq_per_s * length, 1, name, precision)
    return {"size": size, "precision": precision, "batch": batch, "length": length, "steps": steps,
            "seq_per_s": round(seq_per_s, 2), "mfu": None if mfu is None else round(mfu, 4), "device": name}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default=None, help="model size preset (default: base on GPU, tiny on CPU)")
    p.add_argument("--batch", type=int, default=None, help="sequences per step (default 256 GPU / 8 CPU)")
    p.add_argument("--length", type=int, default=128)
    p.add_argument("--steps", type=int, default=None, help="timed steps (default 30 GPU / 3 CPU)")
    p.add_argument("--precisions", default="fp16,bf16")
    args = p.parse_args(argv)
    gpu = torch.cuda.is_available()
    device = torch.device("cuda" if gpu else "cpu")
    if gpu:
        torch.backends.cuda.matmul.allow_tf32 = True
    size = args.size or ("base" if gpu else "tiny")
    batch = args.batch or (256 if gpu else 8)
    steps = args.steps or (30 if gpu else 3)
    if not gpu:
        print("no GPU: CPU smoke run of a tiny model (checks the script works; these are not GPU numbers)")
    results = [measure(size, prec, batch, args.length, steps, 5 if gpu else 1, device)
               for prec in args.precisions.split(",")]
    for r in results:
        print(f"{r['device']}: {r['size']} len {r['length']} batch {r['batch']} {r['precision']}: "
              f"{r['seq_per_s']} seq/s, MFU {r['mfu']}")
    summary = {"gpu": gpu, "smoke": not gpu, "results": results}
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
