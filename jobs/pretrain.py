"""Pretrain (or continue pretraining) a BERT on Ray Train from the corpus stage's instances.

    python jobs/pretrain.py instances_dir=runs/x/data/instances tokenizer_dir=runs/x/data/vocab
    python jobs/pretrain.py --preset seed000 pretrain.num_workers=16 pretrain.use_gpu=true ...
    python jobs/pretrain.py --dry-run ...    # checks inputs and prints the batch plan, trains nothing

Re-running the same command resumes from the latest checkpoint in out_dir/checkpoints.
"""
from __future__ import annotations

import sys

from orchestrator.core.cli import JobSpec, run_job
from orchestrator.workflows.pretrain import PretrainJobConfig, plan, run

SPEC = JobSpec(
    name="pretrain",
    description=(__doc__ or "").split("\n\n")[0],
    config_cls=PretrainJobConfig,
    run=run,
    dry_run=plan,
    default_preset="tiny",
    outputs=("out_dir", "run_dir"),
)


def main(argv: list[str] | None = None) -> int:
    return run_job(SPEC, argv)


if __name__ == "__main__":
    sys.exit(main())
