"""How much the similarity filter rejects, per setting: masked words replaced, proposals rejected,
and replacements that are function words, on BC5CDR-disease training sentences (one process, no Ray).

    python benchmarks/augment_filter_settings.py --mlm-dir <MLM> --vectors a.bin b.bin

Needs ../shared/data. Settings: seed 001's cos > 0 with 10 candidates, then stricter floors.
Prints one JSON line per (vectors, setting), with up to 12 accepted content-word examples.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from orchestrator.augment.config import AugmentConfig
from orchestrator.augment.filtered import FilteredAugmenter, MaskedWordPredictor, plan_rows
from orchestrator.augment.pipeline import from_format, training_sentences
from orchestrator.augment.similarity import WordVectors
from orchestrator.finetune.spec import load_task

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
FUNCTION_WORDS = frozenset("the of in a and an per were was to or is for with by at on".split())
SETTINGS = ((0.0, 10), (0.2, 10), (0.3, 30))  # (min_similarity, candidates)


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mlm-dir", type=Path, required=True)
    p.add_argument("--vectors", type=Path, nargs="+", required=True, help="fastText .bin files to compare")
    p.add_argument("--sentences", type=int, default=40, help="first sentences of the 100-sentence subset")
    args = p.parse_args(argv)
    spec = dataclasses.replace(from_format(load_task("bc5cdr_disease"), "iob"), dir="")
    examples = training_sentences(spec, SHARED / "ner" / "BC5CDR-disease-IOB", 100)[:args.sentences]
    predictor = MaskedWordPredictor(args.mlm_dir)
    out = []
    for path in args.vectors:
        similarity = WordVectors(path).similarity
        for low, candidates in SETTINGS:
            cfg = AugmentConfig(min_similarity=low, candidates=candidates, seed=1)
            rows = plan_rows([(ex.text_a, ex.label) for ex in examples], cfg)
            results = FilteredAugmenter(cfg, predictor, similarity).augment(rows)
            replaced = [r for res in results for r in res["replaced"]]
            content = [r for r in replaced if r["replacement"].lower() not in FUNCTION_WORDS]
            row = {"vectors": str(path), "min_similarity": low, "candidates": candidates,
                   "masked_words": sum(len(r["positions"]) for r in rows), "replaced_words": len(replaced),
                   "rejected_by_filter": sum(1 for res in results for r in res["rejected"]
                                             if r["similarity"] != 1.0),  # 1.0: the original word itself
                   "function_word_replacements": len(replaced) - len(content),
                   "examples": [f"{r['original']} -> {r['replacement']} ({r['similarity']:+.2f})"
                                for r in content[:12]]}
            print(json.dumps(row), flush=True)
            out.append(row)
    return out


if __name__ == "__main__":
    main()
