"""Training steps per second: this engine (Ray Train) vs Hugging Face ``Trainer``, same run.

    python benchmarks/pretrain_vs_hf.py                    # builds instances from ../shared/data
    python benchmarks/pretrain_vs_hf.py --instances DIR --tokenizer DIR --size mini --steps 30

Both sides train the same BertForPreTraining (same size preset, vocabulary, seed) on the same
instances with the same masking code, batch, AdamW, LR and CPU count (one process with
``--cpus`` torch threads: one Ray Train worker vs the Trainer's process). Steady-state steps/s
is the median over steps after ``--skip`` warm-up steps. The two sides run in turn, ``--repeats``
times (engine, HF, engine, HF, ...), so a load that comes and goes on the machine falls on both; each
pair gives a ratio, and ``speedup`` is the median of those paired ratios (``pairs`` lists them all).
Last line printed: JSON with ``speedup``.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _fixtures():
    """The tests' builder of real instances from ../shared/data (loaded by path: tests is not a package)."""
    spec = importlib.util.spec_from_file_location("pretrain_fixtures", ROOT / "tests" / "test_pretrain_fixtures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_engine(instances: Path, tokenizer: Path, length: int, args, out: Path) -> float:
    from orchestrator.core.config import from_dict
    from orchestrator.pretrain.config import PretrainConfig
    from orchestrator.pretrain.trainer import pretrain

    cfg = from_dict(PretrainConfig, {
        "model": {"size": args.size, "dropout": 0.1},
        "phase1": {"max_seq_length": length, "steps": args.steps, "global_batch_size": args.batch,
                   "device_batch_size": args.batch, "learning_rate": 1e-4, "warmup_proportion": 0.0},
        "optim": {"name": "adamw", "grad_clip": 1.0}, "num_workers": 1, "cpus_per_worker": args.cpus,
        "keep_checkpoints": 1, "max_failures": 0, "speed": {"unpad": args.unpad == "on"}})
    result = pretrain(cfg, {length: instances}, tokenizer, out)
    rates = [h["seq_per_s"] / args.batch for h in result.history[args.skip:]]
    return statistics.median(rates)


def run_hf(instances: Path, tokenizer: Path, args, out: Path) -> float:
    import numpy as np
    import pyarrow.parquet as pq
    import torch
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from orchestrator.core.artifacts import read_instance_info
    from orchestrator.core.runtime import seed_everything
    from orchestrator.pretrain.config import ModelConfig
    from orchestrator.pretrain.data import collate, masking_rule
    from orchestrator.pretrain.model import build_model
    from orchestrator.pretrain.trainer import special_ids

    torch.set_num_threads(args.cpus)
    seed_everything(0)
    special = special_ids(tokenizer)
    table = pq.read_table(sorted(instances.glob("*.parquet"))).to_pylist()
    rule = masking_rule(read_instance_info(instances)) if read_instance_info(instances).masking == "dynamic" else None
    gen = np.random.default_rng(0)

    def collator(rows):
        cols = {k: [r[k] for r in rows] for k in ("input_ids", "token_type_ids", "masked_lm_positions",
                                                  "masked_lm_ids", "next_sentence_label")}
        batch = collate(cols, special, rule=rule, gen=gen)
        return {k: torch.from_numpy(v) for k, v in batch.items()}

    class Times(TrainerCallback):
        def __init__(self):
            self.stamps = []

        def on_step_end(self, *a, **k):
            self.stamps.append(time.perf_counter())

    model = build_model(ModelConfig(size=args.size, dropout=0.1), special.vocab_size, special.pad)
    times = Times()
    targs = TrainingArguments(output_dir=str(out), per_device_train_batch_size=args.batch, max_steps=args.steps,
                              learning_rate=1e-4, warmup_steps=0, max_grad_norm=1.0, optim="adamw_torch",
                              save_strategy="no", report_to=[], logging_strategy="no", use_cpu=True,
                              dataloader_num_workers=0, remove_unused_columns=False, disable_tqdm=True, seed=0)
    Trainer(model=model, args=targs, train_dataset=table, data_collator=collator, callbacks=[times]).train()
    gaps = [b - a for a, b in zip(times.stamps, times.stamps[1:])][args.skip - 1:]
    return 1.0 / statistics.median(gaps)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--instances", type=Path, help="an instances directory (default: built from ../shared/data)")
    p.add_argument("--tokenizer", type=Path, help="its tokenizer directory")
    p.add_argument("--size", default="mini")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--length", type=int, default=128)
    p.add_argument("--steps", type=int, default=25)
    p.add_argument("--skip", type=int, default=5, help="warm-up steps left out of the median")
    p.add_argument("--cpus", type=int, default=2)
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--repeats", type=int, default=3, help="engine/HF pairs, run in turn; speedup = median ratio")
    p.add_argument("--unpad", choices=("on", "off"), default="on",
                   help="the engine's pretrain.speed.unpad (its default: on); off measures the engine without it")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error("--repeats must be >= 1")

    from orchestrator.core.artifacts import read_instance_info
    from orchestrator.core.runtime import ray_session

    with tempfile.TemporaryDirectory(prefix="pretrain_vs_hf-") as tmp:
        tmp = Path(tmp)
        if args.instances is None:
            fx = _fixtures()
            docs = fx.documents(400, 400)
            args.tokenizer = fx.build_tokenizer(docs, tmp / "vocab", vocab_size=args.vocab_size)
            args.instances = fx.build_instances(docs, args.tokenizer, tmp / "len", args.length)
        length = read_instance_info(args.instances).max_seq_length
        pairs, ratios = [], []
        for i in range(args.repeats):
            with ray_session(num_cpus=args.cpus + 1):  # one worker of --cpus threads plus a CPU for Ray Data
                ours = run_engine(args.instances, args.tokenizer, length, args, tmp / f"ours{i}")
            hf = run_hf(args.instances, args.tokenizer, args, tmp / f"hf{i}")
            ratios.append(ours / hf)
            pairs.append({"engine_steps_per_s": round(ours, 3), "hf_steps_per_s": round(hf, 3),
                          "ratio": round(ours / hf, 3)})
            print(f"pair {i + 1}/{args.repeats}: engine {ours:.3f} steps/s vs HF Trainer {hf:.3f} steps/s, "
                  f"ratio {ours / hf:.3f}", flush=True)
    speedup = statistics.median(ratios)
    summary = {"speedup": round(speedup, 3), "pairs": pairs,
               "engine_steps_per_s": round(statistics.median(pair["engine_steps_per_s"] for pair in pairs), 3),
               "hf_steps_per_s": round(statistics.median(pair["hf_steps_per_s"] for pair in pairs), 3),
               "size": args.size, "batch": args.batch, "length": length, "cpus": args.cpus, "steps": args.steps,
               "repeats": args.repeats}
    print(f"speedup {speedup:.3f} (median of {args.repeats} paired ratios; {args.size}, batch {args.batch}, "
          f"len {length}, {args.cpus} CPUs)")
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
