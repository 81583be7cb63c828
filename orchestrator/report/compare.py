"""Paired comparison of models against a baseline, from a sweep's ``results.json`` (pure: numpy, scipy).

    doc = paired_differences(results, baseline="conventional")
    doc["rows"]["simpt"]["BIOSSES"]
    # {"mean_diff": 0.012, "ci": [-0.003, 0.027], "t": 2.1, "p": 0.10, "significant": False, "n": 5, ...}
    ner = ner_before_after(results, "tiny", "tiny+filtered-bert")   # seed 001's Tables 3 and 4, per NER task
    doc = comparison_document(results, "conventional")   # both: the report's comparison.json

Every model of one sweep is fine-tuned with the same tasks, settings grid and seeds, so a model's
test score under seed s and the baseline's under seed s form a pair. Per task the differences
(model - baseline, in the metric's units) get their mean and sd, a paired t-test over seeds as
seed 004 uses (``scipy.stats.ttest_rel``, two-sided) and a percentile bootstrap interval of the
mean difference (pairs resampled with replacement). A cross-validated cell's test scores are one
per fold (each the mean over seeds), so those tasks pair by fold index.

The summary columns (Total and each group, ``orchestrator.core.results.summary_members``) are
compared the same way on per-seed macro averages: for each seed, the mean of that seed's scores
over the column's tasks. Only tasks both models have with per-seed scores count, and only seeds
every one of those tasks has for both models, so both sides always average the same tasks and
seeds. A column averaged over fewer tasks than it has is marked ``partial`` (never read as the full
column, as in ``core.results``); cross-validated tasks have no per-seed score and are left out.
"""
from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import numpy as np

from orchestrator.core.config import is_number
from orchestrator.core.errors import InputError
from orchestrator.core.results import in_blue_order, summary_members, validate_results

#: Per-tag keys of a NER cell's ``per_tag`` rows (orchestrator.finetune.metrics.ner_per_tag).
PRF = ("precision", "recall", "f1")



def p_text(p: float, alpha: float = 0.05) -> str:
    """A p-value as the tables print it: "<0.001", else 3 decimals, more where 3 would put it on the other side
    of ``alpha`` than it is (p = 0.0496 printed "0.050" beside its significance star)."""
    if p < 0.001:
        return "<0.001"
    for decimals in range(3, 7):
        text = f"{p:.{decimals}f}"
        if (float(text) < alpha) == (p < alpha):
            return text
    return text

def check_baseline(results: dict, baseline: str, source: str | Path = "results.json") -> None:
    """Raise InputError naming ``source`` unless ``baseline`` is one of the results' models."""
    models = results.get("models") or []
    if baseline not in models:
        raise InputError(source, f"baseline {baseline!r} is not a model of these results",
                         expected=f"one of {', '.join(map(repr, models))}")


def paired_differences(results: dict, baseline: str, models: list[str] | None = None, *, n_boot: int = 10000,
                       seed: int = 0, alpha: float = 0.05, source: str | Path = "results.json") -> dict:
    """Every model against ``baseline``, per task and per summary column; a JSON-able document.

    ``{"baseline", "alpha", "ci_level", "n_boot", "seed", "columns": [{key, label, kind, metric,
    higher_is_better}], "rows": {model: {column key: entry}}}``. An entry: ``pairs_by`` ("seed" or
    "fold"), ``paired`` (the seeds or fold indices used), ``n``, ``baseline_mean`` and ``model_mean``
    over the pairs, ``mean_diff`` (model - baseline), ``diffs`` (each pair's difference, in the order
    of ``paired``), ``sd_diff``, ``t``, ``p``, ``ci`` ([lo, hi],
    the (1 - alpha) percentile bootstrap interval of the mean difference), ``significant``
    (p < alpha), ``better`` (the model's mean is better in the metric's direction; None on a tie),
    ``dropped`` (seeds only one side has) and ``note`` (why a statistic is missing). A task only
    one of the two models has gets no entry. Summary entries add ``tasks``, ``missing`` and
    ``partial``.

    Each entry's bootstrap draws from its own generator seeded by ``seed`` and the (model, column)
    names, so an interval does not change when other models or tasks are added.
    """
    validate_results(results, source)
    check_baseline(results, baseline, source)
    wanted = [m for m in (results["models"] if models is None else models) if m != baseline]
    for model in wanted:
        check_baseline(results, model, source)
    tasks = in_blue_order(results["tasks"])  # the columns in the table's order
    direction = {t["name"]: t.get("higher_is_better", True) for t in tasks}
    members = {key: names for key, names in summary_members(tasks).items() if names}
    columns = [{"key": key, "label": key.capitalize(), "kind": "summary", "metric": "macro average",
                "higher_is_better": True} for key in members]
    columns += [{"key": t["name"], "label": t["name"], "kind": "task", "metric": t.get("metric", ""),
                 "higher_is_better": direction[t["name"]]} for t in tasks]
    base_row = results["cells"].get(baseline, {})
    rows: dict[str, dict[str, dict]] = {}
    for model in wanted:
        row = results["cells"].get(model, {})
        out: dict[str, dict] = {}
        for key, names in members.items():
            out[key] = _summary_entry(base_row, row, names, _rng(seed, model, key), n_boot=n_boot, alpha=alpha)
        for task in tasks:
            name = task["name"]
            if base_row.get(name) and row.get(name):
                out[name] = _task_entry(base_row[name], row[name], direction[name], _rng(seed, model, name),
                                        n_boot=n_boot, alpha=alpha)
        rows[model] = out
    return {"baseline": baseline, "alpha": alpha, "ci_level": 1 - alpha, "n_boot": n_boot, "seed": seed,
            "test": "paired t-test over seeds (scipy.stats.ttest_rel, two-sided)",
            "interval": "percentile bootstrap of the mean difference, pairs resampled with replacement",
            "columns": columns, "rows": rows}


def comparison_document(results: dict, baseline: str, *, n_boot: int = 10000, seed: int = 0, alpha: float = 0.05,
                        source: str | Path = "results.json") -> dict:
    """The report's ``comparison.json``: ``paired_differences`` of every model against ``baseline``,
    plus ``"ner": {model: ner_before_after(...)}`` for the models that share NER tasks with it."""
    doc = paired_differences(results, baseline, n_boot=n_boot, seed=seed, alpha=alpha, source=source)
    ner = {model: ner_before_after(results, baseline, model) for model in doc["rows"]}
    doc["ner"] = {model: tables for model, tables in ner.items() if tables}
    return doc


def ner_before_after(results: dict, baseline: str, model: str) -> dict[str, dict]:
    """Seed 001's Tables 3 and 4 for every NER task both models have: per tag and overall precision,
    recall, F1 and support of ``baseline`` ("before") and ``model`` ("after").

    ``{task: {"baseline", "model", "metric", "tags": {tag: {"before": {precision, recall, f1,
    support} | None, "after": ...}}, "overall": {"before": .., "after": ..}, "overall_method":
    {measure: how it was obtained}}}``. A task is NER here when both cells carry ``per_tag``.

    What "overall" is: trials recorded since issue 33 keep each type's predicted and true-positive
    entity counts, and the sweep's ``per_tag`` then holds a ``micro avg`` row (micro precision /
    recall / F1 from those counts, mean over seeds), used as is. For older results, overall recall is the
    support-weighted mean of per-tag recall, which equals micro recall (averaged over seeds) for a
    task without folds and approximates it with folds; overall precision is the support-weighted
    mean of per-tag precision, which is *not* micro precision (that needs the predicted-entity
    counts, which are not recorded); overall F1 is the cell's own score when the task's metric is
    the entity-level micro F1 (``ner_f1``, mean over seeds), else the support-weighted per-tag F1.
    ``overall_method`` says which was used, per measure.
    """
    validate_results(results)
    check_baseline(results, baseline)
    check_baseline(results, model)
    out: dict[str, dict] = {}
    for task in in_blue_order(results["tasks"]):
        name = task["name"]
        before = (results["cells"].get(baseline) or {}).get(name) or {}
        after = (results["cells"].get(model) or {}).get(name) or {}
        if not (before.get("per_tag") and after.get("per_tag")):
            continue
        tags = sorted({t for cell in (before, after) for t in cell["per_tag"] if not t.endswith(" avg")})
        overall_before, method = _ner_overall(before, task.get("metric", ""))
        overall_after, _ = _ner_overall(after, task.get("metric", ""))
        out[name] = {"baseline": baseline, "model": model, "metric": task.get("metric", ""),
                     "tags": {t: {"before": _prf(before["per_tag"].get(t)), "after": _prf(after["per_tag"].get(t))}
                              for t in tags},
                     "overall": {"before": overall_before, "after": overall_after}, "overall_method": method}
    return out


def _task_entry(base: dict, cell: dict, higher_is_better: bool, rng: np.random.Generator, *, n_boot: int,
                alpha: float) -> dict:
    """One task: pair by seed (by fold index for cross-validated cells), then the paired statistics."""
    if base.get("folds") or cell.get("folds"):
        return _fold_entry(base, cell, higher_is_better, rng, n_boot=n_boot, alpha=alpha)
    b, m = _per_seed(base), _per_seed(cell)
    if b is None or m is None:
        entry = _stats([], [], higher_is_better, rng, n_boot=n_boot, alpha=alpha)
        entry.update(pairs_by="seed", paired=[], dropped={"baseline": [], "model": []},
                     note="no per-seed test scores in a cell (results rebuilt from the MLflow metrics of a sweep "
                          "an older version of this tool logged keep only the mean)")
        return entry
    labels = [s for s in b if s in m]
    entry = _stats([b[s] for s in labels], [m[s] for s in labels], higher_is_better, rng, n_boot=n_boot, alpha=alpha)
    entry.update(pairs_by="seed", paired=labels,
                 dropped={"baseline": [s for s in b if s not in m], "model": [s for s in m if s not in b]})
    return entry


def _fold_entry(base: dict, cell: dict, higher_is_better: bool, rng: np.random.Generator, *, n_boot: int,
                alpha: float) -> dict:
    """A cross-validated task: test scores are per fold (mean over seeds), paired by fold index."""
    b, m = _scores(base), _scores(cell)
    note = None
    if not (base.get("folds") and cell.get("folds")):
        b, m, note = [], [], "one cell is cross-validated and the other is not: nothing to pair"
    elif base["folds"] != cell["folds"] or len(b) != len(m):
        b, m, note = [], [], f"different fold counts ({base['folds']} vs {cell['folds']}): nothing to pair"
    entry = _stats(b, m, higher_is_better, rng, n_boot=n_boot, alpha=alpha)
    seeds_b, seeds_m = base.get("seeds") or [], cell.get("seeds") or []
    if note is None and sorted(seeds_b) != sorted(seeds_m):
        note = f"fold scores average different seeds ({seeds_b} vs {seeds_m})"
    entry.update(pairs_by="fold", paired=list(range(len(b))), dropped={"baseline": [], "model": []})
    if note:
        entry["note"] = entry["note"] + "; " + note if entry["note"] else note
    return entry


def _summary_entry(base_row: dict, row: dict, names: list[str], rng: np.random.Generator, *, n_boot: int,
                   alpha: float) -> dict:
    """A summary column on per-seed macro averages over the tasks both models have, per seed."""
    used, missing, per_task = [], [], []
    for name in names:
        b = _per_seed(base_row.get(name) or {}) if not (base_row.get(name) or {}).get("folds") else None
        m = _per_seed(row.get(name) or {}) if not (row.get(name) or {}).get("folds") else None
        if b is None or m is None:
            missing.append(name)
            continue
        used.append(name)
        per_task.append((b, m))
    seeds = [s for s in per_task[0][0] if all(s in b and s in m for b, m in per_task)] if per_task else []
    base_avg = [float(np.mean([b[s] for b, _ in per_task])) for s in seeds]
    model_avg = [float(np.mean([m[s] for _, m in per_task])) for s in seeds]
    entry = _stats(base_avg, model_avg, True, rng, n_boot=n_boot, alpha=alpha)
    seen_b = [s for s in dict.fromkeys(s for b, _ in per_task for s in b) if s not in seeds]
    seen_m = [s for s in dict.fromkeys(s for _, m in per_task for s in m) if s not in seeds]
    entry.update(pairs_by="seed", paired=seeds, dropped={"baseline": seen_b, "model": seen_m}, tasks=used,
                 missing=missing, partial=bool(used) and len(used) < len(names))
    if not used:
        entry["note"] = ("no task of this column has per-seed scores for both models (cross-validated tasks and "
                         "cells without test_scores do not count)")
    return entry


def _stats(base: list[float], model: list[float], higher_is_better: bool, rng: np.random.Generator, *,
           n_boot: int, alpha: float) -> dict[str, Any]:
    """Paired statistics of model - baseline over aligned score lists."""
    n = len(base)
    entry: dict[str, Any] = {"higher_is_better": higher_is_better, "n": n, "baseline_mean": None,
                             "model_mean": None, "mean_diff": None, "sd_diff": None, "t": None, "p": None,
                             "ci": None, "significant": False, "better": None, "note": None, "diffs": []}
    if n == 0:
        entry["note"] = "no pairs: the two models share no seed (or fold) with a score"
        return entry
    b, m = np.asarray(base, dtype=float), np.asarray(model, dtype=float)
    d = m - b
    mean = float(d.mean())
    entry.update(baseline_mean=float(b.mean()), model_mean=float(m.mean()), mean_diff=mean, diffs=d.tolist(),
                 better=None if mean == 0 else (mean > 0) == higher_is_better)
    if n < 2:
        entry["note"] = "one pair: no sd, test or interval from a single seed"
        return entry
    entry["sd_diff"] = float(d.std(ddof=1))
    means = d[rng.integers(0, n, size=(n_boot, n))].mean(axis=1)
    lo, hi = np.percentile(means, [100 * alpha / 2, 100 * (1 - alpha / 2)])
    entry["ci"] = [float(lo), float(hi)]
    if np.allclose(d, d[0], rtol=0.0, atol=1e-12):
        entry["note"] = f"all {n} differences are equal ({d[0]:+.6g}): sd 0, the t statistic is undefined"
        return entry
    from scipy.stats import ttest_rel  # heavy: scipy

    res = ttest_rel(m, b)
    entry.update(t=float(res.statistic), p=float(res.pvalue), significant=bool(res.pvalue < alpha))
    return entry


def _rng(seed: int, model: str, column: str) -> np.random.Generator:
    """A generator per (model, column), reproducible across processes (crc32, not Python's salted hash)."""
    return np.random.default_rng([seed, zlib.crc32(f"{model}\0{column}".encode())])


def _scores(cell: dict) -> list[float]:
    scores = cell.get("test_scores") or []
    return [float(v) for v in scores] if all(is_number(v) for v in scores) else []


def _per_seed(cell: dict) -> dict[Any, float] | None:
    """{seed: test score} of a cell (by position when it lists no seeds); None without usable scores."""
    scores = _scores(cell)
    seeds = cell.get("seeds") or list(range(len(scores)))
    if not scores or len(seeds) != len(scores):
        return None
    return dict(zip(seeds, scores))


def _prf(row: dict | None) -> dict[str, float] | None:
    if not row:
        return None
    return {**{k: float(row[k]) for k in PRF if is_number(row.get(k))}, "support": int(row.get("support") or 0)}


def _ner_overall(cell: dict, metric: str) -> tuple[dict[str, float | None], dict[str, str]]:
    """Overall precision / recall / F1 / support of one NER cell, and how each was obtained."""
    per_tag = cell["per_tag"]
    if per_tag.get("micro avg"):
        row = _prf(per_tag["micro avg"])
        return ({k: row.get(k) for k in (*PRF, "support")},
                {**{k: "micro average from the recorded entity counts (true positives, predicted, gold), mean "
                       "over seeds" for k in PRF}, "support": "gold entities"})
    rows = [r for t, r in per_tag.items() if not t.endswith(" avg")]
    support = sum(int(r.get("support") or 0) for r in rows)

    def weighted(key: str) -> float | None:
        if support == 0:
            return None
        return float(sum(float(r.get(key, 0.0)) * int(r.get("support") or 0) for r in rows) / support)

    folds = " (with folds: an approximation)" if cell.get("folds") else ""
    method = {"precision": "support-weighted mean of per-tag precision (not micro precision: predicted-entity "
                           "counts are not recorded)",
              "recall": f"support-weighted mean of per-tag recall (= micro recall, mean over seeds){folds}",
              "support": "sum of per-tag support"}
    if metric == "ner_f1" and is_number(cell.get("mean")):
        f1 = float(cell["mean"])
        method["f1"] = "the task score: entity-level micro F1, mean over seeds"
    else:
        f1 = weighted("f1")
        method["f1"] = "support-weighted mean of per-tag F1"
    return {"precision": weighted("precision"), "recall": weighted("recall"), "f1": f1, "support": support}, method

