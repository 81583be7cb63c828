"""Filtered-BERT augmentation of an NER task's training split (seed 001) on a Ray Data actor pool.

    python jobs/augment.py model_dir=runs/pretrain/pretrain/final      # tiny preset: the shipped sample
    python jobs/augment.py --config my_augment.yaml augment.words_per_sentence=3 ray.actors=4
    python jobs/augment.py --dry-run                                   # check inputs, print the plan
"""
from __future__ import annotations

import sys

from orchestrator.core.cli import JobSpec, run_job
from orchestrator.workflows.augment import AugmentJobConfig, plan, run

SPEC = JobSpec(
    name="augment",
    description=(__doc__ or "").split("\n\n")[0],
    config_cls=AugmentJobConfig,
    run=run,
    dry_run=plan,
    default_preset="tiny",
    outputs=("out_dir", "similarity.cache_dir"),
)


def main(argv: list[str] | None = None) -> int:
    return run_job(SPEC, argv)


if __name__ == "__main__":
    sys.exit(main())
