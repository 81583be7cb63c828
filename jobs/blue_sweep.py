"""The main job: corpus -> AmpV vocabulary -> instances -> pretrain (Ray Train) -> BLUE sweep
(Ray Tune) -> report, every run in MLflow.

    python jobs/blue_sweep.py                      # embedded default: local Ray, SQLite MLflow, sample data
    python jobs/blue_sweep.py --preset smoke       # the smallest preset (tests, cluster smoke runs)
    python jobs/blue_sweep.py --config configs/real_data.yaml sweep.seeds=[1,2,3]
    ray submit cluster.yaml jobs/blue_sweep.py -- --config configs/cluster.yaml
    python jobs/blue_sweep.py --config experiments/oubiobert_ablation.yaml   # arms, one paired comparison
"""
from __future__ import annotations

import sys

from orchestrator.chain import ChainConfig
from orchestrator.core.cli import JobSpec, run_job
from orchestrator.experiment import plan, run

SPEC = JobSpec(
    name="blue_sweep",
    description=__doc__.split("\n\n")[0],
    config_cls=ChainConfig,
    run=run,
    dry_run=plan,
    default_preset="default",
)


def main(argv: list[str] | None = None) -> int:
    return run_job(SPEC, argv)


if __name__ == "__main__":
    sys.exit(main())
