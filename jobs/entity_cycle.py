"""Seed 003's Embodiment 4: pretrain, make an entity extractor from the model, build entity-aware
instances with it, continue pretraining; N cycles, the first with random masking.

    python jobs/entity_cycle.py --preset tiny            # 2 cycles on the bundled sample, CPU, minutes
    python jobs/entity_cycle.py --preset tiny cycles=3 pretrain.stop.mlm_accuracy=0.3
    python jobs/entity_cycle.py --config configs/entity_cycle.yaml --dry-run

Each cycle's manifest (<run_dir>/cycle-<c>/manifest.json) names the extractor its instances were
built with and records that extractor's F1, the entity counts, the derived association table and
the MLM accuracy; MLflow has them as steps of one parent run (orchestrator/workflows/entity_cycle.py).
"""
from __future__ import annotations

import sys

from orchestrator.core.cli import JobSpec, run_job
from orchestrator.workflows.entity_cycle import CycleConfig, plan, run

SPEC = JobSpec(
    name="entity_cycle",
    description=(__doc__ or "").split("\n\n")[0],
    config_cls=CycleConfig,
    run=run,
    dry_run=plan,
    default_preset="tiny",
    outputs=("runs_root",),
)


def main(argv: list[str] | None = None) -> int:
    return run_job(SPEC, argv)


if __name__ == "__main__":
    sys.exit(main())
