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

import logging
import sys

from dashboards.experiment_page import PAGE_PATH, build_page
from orchestrator import experiment
from orchestrator.chain import PAGE, ChainConfig, ChainResult
from orchestrator.core.cli import JobSpec, run_job
from orchestrator.experiment import plan

log = logging.getLogger("blue_sweep")


def run(cfg: ChainConfig) -> ChainResult:
    """The chain or the experiment; then an experiment's comparison page next to its report."""
    result = experiment.run(cfg)
    if cfg.arms and result.report and result.tracking_uri:
        write_page(result)
    return result


def write_page(result: ChainResult) -> None:
    """``<run_dir>/report/experiment.html`` from the experiment's MLflow runs. The page is a view: when
    it cannot be built the job still succeeds, and says why (it can be built later by hand)."""
    out = result.run_dir / PAGE_PATH
    try:
        result.report[PAGE] = build_page(result.tracking_uri, out, result.mlflow_run_id or None)
    except Exception as exc:  # MLflow raises many types; the experiment itself has finished
        log.warning("the experiment page was not written (%s: %s); build it with: python "
                    "dashboards/experiment_page.py --tracking-uri %s --out %s", type(exc).__name__, exc,
                    result.tracking_uri, out)


SPEC = JobSpec(
    name="blue_sweep",
    description=__doc__.split("\n\n")[0],
    config_cls=ChainConfig,
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
