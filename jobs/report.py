"""Regenerate a sweep's BLUE report (Markdown, HTML, PNG, learning curves) from MLflow alone.

    python jobs/report.py --run-dir runs/demo            # sqlite:///runs/demo/mlflow.db -> runs/demo/report
    python jobs/report.py --tracking-uri http://head:5000 --experiment bioptorch out_dir=report
    python jobs/report.py results_json=runs/demo/sweep/results.json out_dir=/tmp/report

``--run-dir``, ``--tracking-uri``, ``--experiment`` and ``--run-id`` are shorthands for the
dotted overrides ``run_dir=``, ``tracking_uri=``, ``experiment=`` and ``run_id=``.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from orchestrator.core.cli import JobSpec, run_job
from orchestrator.core.config import field
from orchestrator.core.errors import ConfigError, InputError

SHORTHANDS = {"--run-dir": "run_dir", "--tracking-uri": "tracking_uri", "--experiment": "experiment",
              "--run-id": "run_id", "--out-dir": "out_dir"}


@dataclass(frozen=True)
class ReportConfig:
    run_dir: str = field("", help="run directory of a blue_sweep run: its mlflow.db is the default store and "
                                  "<run_dir>/report the default output")
    tracking_uri: str = field("", help="MLflow tracking URI; empty = sqlite:///<run_dir>/mlflow.db")
    experiment: str = field("bioptorch", help="MLflow experiment holding the sweep")
    run_id: str = field("", help="the sweep's parent run id; empty = newest run tagged orchestrator.kind=sweep")
    results_json: str = field("", help="read this results.json file instead of MLflow")
    out_dir: str = field("", help="where the report goes; empty = <run_dir>/report")
    title: str = field("", help="report title; empty = derived from the MLflow run")

    def __post_init__(self) -> None:
        if not (self.run_dir or self.tracking_uri or self.results_json):
            raise ConfigError("give run_dir (--run-dir), tracking_uri (--tracking-uri) or results_json")
        if not (self.out_dir or self.run_dir):
            raise ConfigError("out_dir is required when run_dir is not given")

    def resolved_uri(self) -> str:
        from orchestrator.report.mlflow_results import default_tracking_uri

        return self.tracking_uri or default_tracking_uri(self.run_dir)

    def resolved_out(self) -> Path:
        return Path(self.out_dir) if self.out_dir else Path(self.run_dir) / "report"


def run(cfg: ReportConfig) -> dict[str, Path]:
    """Write the report and print where it is."""
    if cfg.results_json:
        from orchestrator.report.blue_table import write_report

        path = Path(cfg.results_json)
        if not path.is_file():
            raise InputError(path, "file not found", expected="a sweep results.json")
        try:
            results = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise InputError(path, f"invalid JSON: {exc.msg}", line=exc.lineno) from None
        paths = write_report(results, cfg.resolved_out(), title=cfg.title or "BLUE results", source=path)
    else:
        from orchestrator.report.mlflow_results import regenerate_report

        paths = regenerate_report(cfg.resolved_out(), cfg.resolved_uri(), cfg.experiment, cfg.run_id or None,
                                  title=cfg.title or None)
    for kind, p in paths.items():
        print(f"{kind:8s} {p}")
    return paths


def plan(cfg: ReportConfig) -> str:
    """Say what would be read and written; check that the store or file is there."""
    if cfg.results_json:
        if not Path(cfg.results_json).is_file():
            raise InputError(cfg.results_json, "file not found", expected="a sweep results.json")
        source = f"results file {cfg.results_json}"
    else:
        uri = cfg.resolved_uri()
        if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).is_file():
            raise InputError(uri[len("sqlite:///"):], "MLflow store not found", expected="the run's mlflow.db")
        run = cfg.run_id or "newest tagged orchestrator.kind=sweep"
        source = f"MLflow {uri}, experiment {cfg.experiment!r}, run {run}"
    return f"report: read {source}\n        write {cfg.resolved_out()}/ (blue_table.md, .html, .png, curves.png)"


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


SPEC = JobSpec(name="report", description=__doc__.split("\n\n")[0] + " (" + ", ".join(SHORTHANDS) + " accepted)",
               config_cls=ReportConfig, run=run, dry_run=plan)


def main(argv: list[str] | None = None) -> int:
    return run_job(SPEC, expand_shorthands(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
