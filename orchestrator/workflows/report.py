"""``jobs/report.py``: a sweep's BLUE report (Markdown, HTML, PNG, learning curves) rebuilt from MLflow
alone, or from a ``results.json`` file.

    run(ReportConfig(run_dir="runs/demo"))                  # sqlite:///runs/demo/mlflow.db -> runs/demo/report
    run(ReportConfig(results_json="results.json", out_dir="/tmp/report", baseline="conventional"))

The tables, figures and comparisons are ``orchestrator.report``'s (the sweep writes the same report
when it finishes); this module is the job: where the results come from, where the report goes, and
seed 004's source scores against the gains, logged to MLflow when there is a store.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from orchestrator.core.config import field
from orchestrator.core.errors import ConfigError, InputError
from orchestrator.core.manifest import check_replaceable
from orchestrator.core.results import validate_results
from orchestrator.track import TrackingConfig, local_uri
from orchestrator.track.caller import mlflow_state_kept, user_tracking_uri


@dataclass(frozen=True)
class ReportConfig:
    run_dir: str = field("", help="run directory of a blue_sweep run: its mlflow.db is the default store and "
                                  "<run_dir>/report the default output")
    tracking_uri: str = field("", help="MLflow tracking URI; empty = $MLFLOW_TRACKING_URI if set (as the job that "
                                       "logged the run read it), else sqlite:///<run_dir>/mlflow.db")
    experiment: str = field("bioptorch", help="MLflow experiment holding the sweep")
    run_id: str = field("", help="the sweep's parent run id; empty = newest run tagged orchestrator.kind=sweep")
    results_json: str = field("", help="read this results.json file instead of MLflow")
    out_dir: str = field("", help="where the report goes; empty = <run_dir>/report")
    title: str = field("", help="report title; empty = derived from the MLflow run")
    baseline: str = field("", help="a model of the results: add the paired differences of every other model "
                                   "against it (per task, with a t-test over seeds and a bootstrap interval) and "
                                   "comparison.json; empty = the table only")
    source_scores: str = field("", help="seed 004: each model's source scores (a jobs/score_sources.py output "
                                        "directory, whose source names are the models' names and whose target task "
                                        "names are the results' task names; or an experiment report's "
                                        "comparison.json): correlate each measure with the gain over the baseline "
                                        "per task and seed (Pearson, Spearman), the matrix of the measures, a "
                                        "scatter plot; logged to MLflow when run_dir or tracking_uri is given. "
                                        "Needs baseline")

    def __post_init__(self) -> None:
        if self.source_scores and not self.baseline:
            raise ConfigError("source_scores correlates the gains over a baseline: give baseline (--baseline)")

    def check_named(self) -> None:
        """Where the results come from and where the report goes: checked by a run and a dry run, not when the
        config is made, so ``--print-config`` shows the config with neither given (it exited 2: docs probe D7)."""
        if not (self.run_dir or self.tracking_uri or self.results_json or user_tracking_uri()):
            raise ConfigError("give run_dir (--run-dir), tracking_uri (--tracking-uri) or results_json")
        if not (self.out_dir or self.run_dir):
            raise ConfigError("out_dir is required when run_dir is not given")

    def resolved_uri(self) -> str:
        """The store the job logged to, as it chose it: ``tracking_uri``, else $MLFLOW_TRACKING_URI, else the run
        directory's SQLite file (the variable was ignored: a probe, session 49, got the run directory's older
        sweep, with the opposite conclusion, where the job had logged to the server the variable named)."""
        return TrackingConfig(tracking_uri=self.tracking_uri).resolve_uri(self.run_dir) if self.run_dir \
            else self.tracking_uri or user_tracking_uri()

    def resolved_out(self) -> Path:
        return Path(self.out_dir) if self.out_dir else Path(self.run_dir) / "report"

    def sweep_of(self) -> str | None:
        """The run directory whose sweep to report, where the store is not its own (``tracking_uri`` and
        ``run_dir`` both given: a store several runs share; a probe, session 46, got another job's newest
        sweep); None: the newest sweep of the store (a run directory's own store holds its sweeps only)."""
        return self.run_dir if self.run_dir and self.resolved_uri() != local_uri(self.run_dir) else None


def read_results(path: str | Path) -> dict:
    """A results.json file, parsed and checked against the schema (InputError naming file and place)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(path, "file not found", expected="a sweep results.json")
    try:
        results = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise InputError(path, f"invalid JSON: {exc.msg}", line=exc.lineno) from None
    except UnicodeDecodeError as exc:
        raise InputError(path, f"not UTF-8 text (byte {exc.start})", expected="a sweep results.json") from None
    validate_results(results, path)
    return results


@mlflow_state_kept()  # a library call leaves the caller's MLflow session as it was
def run(cfg: ReportConfig) -> dict[str, Path]:
    """Write the report and print where it is."""
    cfg.check_named()
    from orchestrator.report.sources import read_source_scores  # heavy: numpy

    scores = read_source_scores(cfg.source_scores) if cfg.source_scores else None
    if cfg.results_json:
        from orchestrator.report.blue_table import write_report  # heavy: numpy

        results = read_results(cfg.results_json)
        paths = write_report(results, cfg.resolved_out(), title=cfg.title or "BLUE results", source=cfg.results_json,
                             baseline=cfg.baseline or None, source_scores=scores)
    else:
        from orchestrator.report.mlflow_results import regenerate_report  # heavy: numpy

        paths = regenerate_report(cfg.resolved_out(), cfg.resolved_uri(), cfg.experiment, cfg.run_id or None,
                                  title=cfg.title or None, baseline=cfg.baseline or None, source_scores=scores,
                                  run_dir=cfg.sweep_of())
    if "sources_scatter" in paths and (cfg.run_dir or cfg.tracking_uri):
        from orchestrator.report.sources import log_source_gains  # heavy: numpy

        doc = json.loads(paths["comparison"].read_text(encoding="utf-8"))["sources"]
        run_id = log_source_gains(TrackingConfig(tracking_uri=cfg.resolved_uri(), experiment=cfg.experiment),
                                  cfg.run_dir or cfg.resolved_out(), doc,
                                  [paths[k] for k in ("sources_scatter", "sources_matrix", "comparison")])
        if run_id:
            print(f"MLflow   source_gains run {run_id} at {cfg.resolved_uri()}")
    for kind, p in paths.items():
        print(f"{kind:8s} {p}")
    return paths


def plan(cfg: ReportConfig) -> str:
    """Read and check what the report would be built from (the file, or the sweep in MLflow), and say
    where it would go; writes nothing."""
    cfg.check_named()
    if cfg.results_json:
        results = read_results(cfg.results_json)
        source = f"results file {cfg.results_json}"
    else:
        from orchestrator.report.mlflow_results import load_results  # heavy: numpy
        from orchestrator.track.local_store import readable_store

        uri = cfg.resolved_uri()
        with readable_store(uri) as readable:  # a moved run directory: its artifacts where they are now, as the run
            found = load_results(readable, cfg.experiment, cfg.run_id or None, cfg.sweep_of())  # SQLite: read-only
        results = found.results
        source = f"MLflow {uri}, experiment {cfg.experiment!r}, run {found.run_id} (from its {found.source})"
    files = "blue_table.md, .html, .png, curves.png"
    if cfg.baseline:
        from orchestrator.report.compare import check_baseline  # heavy: numpy

        check_baseline(results, cfg.baseline, cfg.results_json or source)
        if len(results["models"]) > 1:
            files += f", comparison.json: paired differences vs {cfg.baseline}"
    if cfg.source_scores:
        from orchestrator.report.sources import read_source_scores  # heavy: numpy

        scores = read_source_scores(cfg.source_scores)
        known = [name for name in scores if name in results["models"] and name != cfg.baseline]
        if not known:
            raise InputError(cfg.source_scores, f"none of its sources ({', '.join(scores)}) is a model of the results "
                                                f"other than the baseline",
                             expected=f"sources named as the models: {', '.join(results['models'])}")
        files += (f", seed 004: {len(known)} scored model(s) ({', '.join(known)}) vs {cfg.baseline}, "
                  "sources_scatter.png, sources_matrix.png")
    check_replaceable(cfg.resolved_out(), "report")
    return (f"report: read {source}: {len(results['models'])} model(s) x {len(results['tasks'])} task(s)\n"
            f"        write {cfg.resolved_out()}/ ({files})")
