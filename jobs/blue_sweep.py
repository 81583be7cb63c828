"""The main job: corpus -> AmpV vocabulary -> instances -> pretrain (Ray Train) -> BLUE sweep
(Ray Tune) -> report, every run in MLflow.

    python jobs/blue_sweep.py                      # embedded default: local Ray, SQLite MLflow, sample data
    python jobs/blue_sweep.py --preset smoke       # the smallest preset (tests, cluster smoke runs)
    python jobs/blue_sweep.py --config configs/real_data.yaml sweep.seeds=[1,2,3]
    ray submit cluster.yaml jobs/blue_sweep.py -- --config configs/cluster.yaml
    python jobs/blue_sweep.py --config experiments/oubiobert_ablation.yaml   # arms, one paired comparison

An experiment (a config with arms) that wrote its report and logged to MLflow also gets its
comparison page, read back from MLflow: <run_dir>/report/experiment.html (dashboards/experiment_page.py).
"""
from __future__ import annotations

import sys

from orchestrator.core.cli import JobSpec, run_job
from orchestrator.workflows.blue_sweep import plan, run
from orchestrator.workflows.config import ExperimentConfig

SPEC = JobSpec(
    name="blue_sweep",
    description=(__doc__ or "").split("\n\n")[0],
    config_cls=ExperimentConfig,
    run=run,
    dry_run=plan,
    default_preset="default",
    preset_only=("arms", "baseline"),
    outputs=("runs_root",),
)


def main(argv: list[str] | None = None) -> int:
    return run_job(SPEC, argv)


if __name__ == "__main__":
    sys.exit(main())
