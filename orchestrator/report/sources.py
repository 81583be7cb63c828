"""Seed 004's analysis on one sweep: does a source's similarity to the task text predict its gain?

    comparison = compare.paired_differences(results, baseline="floor")
    doc = source_correlations(comparison, scores)        # scores: {arm: {"measures", "by_task"}}
    metrics = source_metrics(doc)                        # the numbers, as MLflow metrics

Each arm of an experiment pretrains on its own sources; ``orchestrator.selection`` scores them
against every task's training text (PPL, JSD, TVC, TTR) and the sweep fine-tunes every arm with
the same seeds. A **point** is one (arm, task, seed): the arm's paired difference from the
baseline arm on that task and seed, in the metric's better direction (negated for a
lower-is-better metric), against the arm's measures on that task's text. Seed 004 correlates
exactly such points (5 sources x 12 tasks x 5 seeds = 300 in its Figure 3).

- **per task** (its Tables 3/4 layout: a row per task, a column per measure): Pearson r and
  Spearman rho over that task's (arm, seed) points;
- **Total**: the per-seed macro average over the tasks, against the measures on all tasks' text
  pooled;
- **tasks pooled** (``POOLED``): every (arm, task, seed) point, each with its task's measures;
- **matrix** (its Figure 3): Pearson and Spearman between the four measures and the gain over the
  pooled points.

A correlation is undefined (None, with ``why``) with fewer than 3 distinct (arm, task) measure
values behind it or a constant series. n counts points, but a measure takes one value per arm
(per arm and task, pooled), so the evidence rests on the arms: p treats every point as
independent and is optimistic; with three arms nothing can be concluded. The note says so.

Pure (numpy, scipy); reads documents, imports no stage. Its tables are rendered by
``orchestrator.report.pages`` (``sources_markdown``, ``sources_html``), its figures by
``orchestrator.report.figures`` (``render_figures``: ``render_scatter_png``, ``render_matrix_png``).
"""
from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchestrator.core.config import is_number
from orchestrator.core.errors import InputError
from orchestrator.core.reuse import content_key
from orchestrator.track import TrackingConfig
from orchestrator.track import schema as S

#: Seed 004's measures and which way is closer to the target (orchestrator.selection.measures.CLOSER;
#: not imported: the report reads results and never imports a stage).
SOURCE_MEASURES = {"ppl": "lower is closer", "jsd": "lower is closer", "tvc": "higher is closer",
                   "ttr": "diversity, no direction"}
POOLED = "tasks pooled"
GAIN = "gain"
#: The matrix's variables, in Figure 3's order (the measures, then the gain).
MATRIX_VARIABLES = (*SOURCE_MEASURES, GAIN)
MIN_UNITS = 3


# ---------------------------------------------------------------------------------------------
# The analysis
def source_correlations(comparison: dict, scores: dict[str, dict]) -> dict:
    """The document of the analysis (module docstring), JSON-able.

    ``comparison`` is ``compare.paired_differences`` (its entries' ``diffs`` give the per-seed
    gains; an older document without them gives one point per arm, its mean). ``scores`` is
    ``{arm: {"measures": {ppl, jsd, tvc, ttr}, "by_task": {task: {...}}}}``: an experiment's
    (``orchestrator.selection.arms``) or ``read_source_scores``'s. Returns ``{"baseline",
    "measures", "scores", "gains": {column: {arm: mean gain}}, "points": [{column, arm, pair,
    gain, ppl, jsd, tvc, ttr}], "correlations": {column: {measure: {r, p, rho, rho_p, n, arms,
    units[, why]}}}, "matrix": {"variables", "pearson", "spearman", "n", "units"}, "unscored":
    [models without scores], "unmatched": [tasks without scores], "note"}``.
    """
    rows, baseline = comparison["rows"], comparison["baseline"]
    arms = [a for a in scores if a in rows and a != baseline]
    direction = {c["key"]: 1.0 if c["higher_is_better"] else -1.0 for c in comparison["columns"]}
    tasks = [c["key"] for c in comparison["columns"] if c["kind"] == "task"]
    columns = [c for c in ("total", *tasks) if c in direction]
    gains: dict[str, dict[str, float]] = {}
    points: list[dict[str, Any]] = []
    unmatched = sorted({t for a in arms for t in tasks if t not in scores[a].get("by_task", {})})
    for column in columns:
        gains[column] = {}
        for arm in arms:
            entry = rows[arm].get(column)
            measures = scores[arm]["measures"] if column == "total" else scores[arm].get("by_task", {}).get(column)
            if not entry or entry.get("mean_diff") is None or measures is None:
                continue
            sign = direction[column]
            gains[column][arm] = sign * entry["mean_diff"]
            pairs = list(zip(entry.get("paired") or [], entry.get("diffs") or []))
            for pair, diff in pairs or [("mean", entry["mean_diff"])]:
                points.append({"column": column, "arm": arm, "pair": pair, GAIN: sign * diff,
                               **{m: float(measures[m]) for m in SOURCE_MEASURES}})
    correlations = {}
    for column in (*columns, POOLED):
        pts = [p for p in points if (p["column"] != "total" if column == POOLED else p["column"] == column)]
        correlations[column] = {m: correlate(pts, m, GAIN) for m in SOURCE_MEASURES}
    pooled = [p for p in points if p["column"] != "total"]
    matrix = {"variables": list(MATRIX_VARIABLES), "n": len(pooled), "units": _units(pooled),
              "pearson": [[None] * len(MATRIX_VARIABLES) for _ in MATRIX_VARIABLES],
              "spearman": [[None] * len(MATRIX_VARIABLES) for _ in MATRIX_VARIABLES]}
    for i, a in enumerate(MATRIX_VARIABLES):
        for j, b in enumerate(MATRIX_VARIABLES):
            c = correlate(pooled, a, b)
            matrix["pearson"][i][j], matrix["spearman"][i][j] = c["r"], c["rho"]
    unscored = [m for m in rows if m not in scores]
    return {"baseline": baseline, "measures": SOURCE_MEASURES, "scores": {a: scores[a] for a in arms},
            "gains": gains, "points": points, "correlations": correlations, "matrix": matrix,
            "unscored": unscored, "unmatched": unmatched, "note": _note(len(arms), baseline)}


def correlate(points: Sequence[dict], x_key: str, y_key: str) -> dict[str, Any]:
    """Pearson r and Spearman rho of ``x_key`` against ``y_key`` over ``points``, with their
    two-sided p-values; None (and ``why``) with fewer than ``MIN_UNITS`` distinct (arm, column)
    units or a constant series. ``n``: points; ``arms``: distinct arms; ``units``: distinct
    (arm, column) pairs, the measure values the correlation rests on."""
    from scipy.stats import pearsonr, spearmanr  # heavy: scipy

    x = [float(p[x_key]) for p in points]
    y = [float(p[y_key]) for p in points]
    out: dict[str, Any] = {"r": None, "p": None, "rho": None, "rho_p": None, "n": len(points),
                           "arms": len({p["arm"] for p in points}), "units": _units(points)}
    if out["units"] < MIN_UNITS:
        several = len({p["column"] for p in points}) > 1
        out["why"] = (f"fewer than {MIN_UNITS} (arm, task) measure values" if several
                      else f"fewer than {MIN_UNITS} arms")
    elif len(set(x)) < 2 or len(set(y)) < 2:
        out["why"] = "constant series"
    else:
        r, rho = pearsonr(x, y), spearmanr(x, y)
        out.update(r=_finite(r.statistic), p=_finite(r.pvalue), rho=_finite(rho.statistic),
                   rho_p=_finite(rho.pvalue))
    return out


def _units(points: Sequence[dict]) -> int:
    return len({(p["arm"], p["column"]) for p in points})


def _finite(value: Any) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None


def _note(arms: int, baseline: str) -> str:
    return (f"Gain: each arm's paired difference from {baseline} per task and seed, in the metric's better "
            f"direction (seed 004's points: its Figure 3 pools 300 source-task-seed points). Per task: one point "
            f"per (arm, seed) with that task's own measures; Total: the per-seed macro average, with the measures "
            f"against all tasks' text pooled; {POOLED}: one point per (arm, task, seed). n counts points, but a "
            f"measure takes one value per arm (per arm and task when pooled), so the evidence rests on the {arms} "
            "arm(s): p treats every point as independent and is optimistic, and with three arms nothing can be "
            "concluded (over 3 independent values p < 0.05 needs |r| > 0.997). r (Pearson) and rho (Spearman) "
            "are raw: a useful similarity measure shows r < 0 for PPL and JSD (lower = closer) and r > 0 for "
            "TVC; seed 004 reports strengths without that sign convention (JSD 0.519, PPL 0.481, TVC 0.436, TTR "
            "none).")


def source_metrics(doc: dict) -> dict[str, float]:
    """The analysis as MLflow metrics (``orchestrator.track.schema.source_gain_metric``): r, rho and
    n per column and measure, the matrix's Pearson and Spearman above its diagonal. Undefined values
    are left out."""
    out: dict[str, float] = {}
    for column, per in doc["correlations"].items():
        for measure, c in per.items():
            for stat in ("r", "rho", "n"):
                if c.get(stat) is not None:
                    out[S.source_gain_metric(column, measure, stat)] = float(c[stat])
    names = doc["matrix"]["variables"]
    for kind, stat in (("pearson", "r"), ("spearman", "rho")):
        for i, a in enumerate(names):
            for j in range(i + 1, len(names)):
                value = doc["matrix"][kind][i][j]
                if value is not None:
                    out[S.source_gain_metric("matrix", f"{a}-{names[j]}", stat)] = float(value)
    return out


def log_source_gains(tracking: TrackingConfig | None, run_dir: str | Path, doc: dict,
                     files: Sequence[Path] = ()) -> str | None:
    """The analysis as its own finished MLflow run (kind ``source_gains``, a child of the active run:
    an experiment's): ``source_metrics`` as metrics, ``files`` (the figures, comparison.json) as
    artifacts, the baseline and the arms as params. Tagged with the content key of the numbers, so
    logging the same analysis again adds nothing. Returns the run id (None: tracking off or failed)."""
    from orchestrator.track.runs import log_stage_result  # heavy: mlflow

    params = {"baseline": doc["baseline"], "arms": ",".join(doc["scores"]), "points": len(doc["points"])}
    key = content_key("source_gains", doc["correlations"], doc["matrix"])
    return log_stage_result(tracking, Path(run_dir), stage=S.KIND_SOURCE_GAINS, params=params,
                            metrics=source_metrics(doc), tags={S.OUTPUT_KEY: key}, artifacts=list(files))


# ---------------------------------------------------------------------------------------------
# Reading scores written elsewhere
def read_source_scores(path: str | Path) -> dict[str, dict]:
    """``{source: {"measures", "by_task"}}`` from what writes scores: a ``jobs/score_sources.py``
    output directory (or its ``scores.json``; ``scores_by_task.json`` beside it gives the per-task
    measures), a report's ``comparison.json`` (an experiment's scores, under ``sources``), or a
    JSON file already of that shape. InputError naming the file otherwise."""
    path = Path(path)
    if path.is_dir():
        path = path / "scores.json"
    if not path.is_file():
        raise InputError(path, "file not found", expected="a score_sources output directory, its scores.json, "
                                                          "or a report's comparison.json")
    doc = _read_json(path)
    if isinstance(doc, dict) and isinstance(doc.get("sources"), dict) and "rows" in doc:  # comparison.json
        doc = doc["sources"].get("scores")
    elif isinstance(doc, dict) and doc and all(isinstance(v, dict) and "measures" not in v for v in doc.values()):
        by_task_file = path.parent / "scores_by_task.json"  # score_sources: {source: {ppl, jsd, tvc, ttr}}
        by_task = _read_json(by_task_file) if by_task_file.is_file() else {}
        doc = {name: {"measures": measures, "by_task": {t: per[name] for t, per in by_task.items() if name in per}}
               for name, measures in doc.items()}
    if not isinstance(doc, dict) or not doc:
        raise InputError(path, "holds no source scores", expected='{source: {"measures": {ppl, jsd, tvc, ttr}, '
                                                                  '"by_task": {...}}}')
    for name, entry in doc.items():
        measures = entry.get("measures") if isinstance(entry, dict) else None
        missing = [m for m in SOURCE_MEASURES if not is_number((measures or {}).get(m), finite=False)]
        if missing:
            raise InputError(path, f"source {name!r} has no {missing[0]} score",
                             expected=f"the measures {', '.join(SOURCE_MEASURES)} per source")
    return doc


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise InputError(path, f"invalid JSON: {exc.msg}", line=exc.lineno) from None
    except UnicodeDecodeError as exc:
        raise InputError(path, f"not UTF-8 text (byte {exc.start})", expected="JSON") from None
