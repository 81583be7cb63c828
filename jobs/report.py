"""Regenerate a sweep's BLUE report (Markdown, HTML, PNG, learning curves) from MLflow alone.

    python jobs/report.py --run-dir runs/demo            # sqlite:///runs/demo/mlflow.db -> runs/demo/report
    python jobs/report.py --tracking-uri http://head:5000 --experiment bioptorch out_dir=report
    python jobs/report.py results_json=runs/demo/sweep/results.json out_dir=/tmp/report
    python jobs/report.py --run-dir runs/demo baseline=conventional   # + paired differences vs that model
    python jobs/report.py results_json=runs/sources/sweep/results.json baseline=floor \
        source_scores=runs/selection out_dir=/tmp/report     # + seed 004: measures vs gains (score_sources output)

``--run-dir``, ``--tracking-uri``, ``--experiment``, ``--run-id``, ``--out-dir`` and ``--baseline``
are shorthands for the dotted overrides ``run_dir=``, ``tracking_uri=``, ``experiment=``,
``run_id=``, ``out_dir=`` and ``baseline=``.
"""
from __future__ import annotations

import sys

from orchestrator.core.cli import JobSpec, run_job
from orchestrator.workflows.report import ReportConfig, plan, run

SHORTHANDS = {"--run-dir": "run_dir", "--tracking-uri": "tracking_uri", "--experiment": "experiment",
              "--run-id": "run_id", "--out-dir": "out_dir", "--baseline": "baseline"}


def expand_shorthands(argv: list[str]) -> list[str]:
    """``--run-dir X`` / ``--run-dir=X`` -> ``run_dir=X`` (likewise for the other shorthands)."""
    out, i = [], 0
    while i < len(argv):
        arg = argv[i]
        key, eq, value = arg.partition("=")
        if key in SHORTHANDS:
            if not eq:
                if i + 1 >= len(argv):
                    raise SystemExit(f"{arg} needs a value")
                value, i = argv[i + 1], i + 1
            out.append(f"{SHORTHANDS[key]}={value}")
        else:
            out.append(arg)
        i += 1
    return out


SPEC = JobSpec(name="report",
               description=(__doc__ or "").split("\n\n")[0] + " (" + ", ".join(SHORTHANDS) + " accepted)",
               config_cls=ReportConfig, run=run, dry_run=plan, outputs=("out_dir",))


def main(argv: list[str] | None = None) -> int:
    return run_job(SPEC, expand_shorthands(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
