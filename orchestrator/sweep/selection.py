"""Selection on dev, seed aggregation and the results.json document (pure functions, no Ray).

For each (model, task): every (learning rate, epochs) setting gets its dev mean over seeds;
the best setting by the task metric's direction is selected (ties: fewer epochs, then the
smaller learning rate); the test scores of all seeds at that setting give mean (sd), sd the
sample standard deviation (ddof=1; 0 for one seed).

Cross-validated tasks (trials carry ``fold`` >= 0): selection uses the dev mean over every
(seed, fold); the reported scores are one per fold (mean over seeds), so mean (sd) is over
folds as in seed 000's Table 5. NER cells also carry ``per_tag`` precision / recall / F1 /
support at the selected setting (mean over seeds and folds; seed 001's per-tag table).
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import numpy as np

from orchestrator.core.results import summarize
from orchestrator.finetune.metrics import METRICS
from orchestrator.finetune.spec import TaskSpec


def select_cell(records: Iterable[dict], higher_is_better: bool) -> dict:
    """One results.json cell from the trial records of one (model, task)."""
    records = list(records)
    by_setting: dict[tuple[float, int], dict[tuple[int, int], tuple[float, float]]] = defaultdict(dict)
    for rec in records:
        lr, seed, fold = rec["trial"]["learning_rate"], rec["trial"]["seed"], rec["trial"].get("fold", -1)
        for row in rec["epochs"]:
            if "dev" in row:
                by_setting[(lr, row["epoch"])][(seed, fold)] = (row["dev"], row["test"])
    if not by_setting:
        raise ValueError("no evaluated epochs in these trial records")
    sign = 1.0 if higher_is_better else -1.0

    def rank(key: tuple[float, int]) -> tuple[float, int, float]:
        lr, epochs = key
        dev_mean = float(np.mean([d for d, _ in by_setting[key].values()]))
        return (-sign * dev_mean, epochs, lr)

    best = min(by_setting, key=rank)
    runs = by_setting[best]
    seeds = sorted({s for s, _ in runs})
    folds = sorted({f for _, f in runs if f >= 0})
    devs = [float(d) for d, _ in runs.values()]
    if folds:  # one score per fold: the mean over seeds of that fold's test score
        tests = [float(np.mean([runs[(s, f)][1] for s in seeds if (s, f) in runs])) for f in folds]
    else:
        tests = [float(runs[(s, -1)][1]) for s in seeds]
    curve = [{"epoch": ep, "dev": float(np.mean([d for d, _ in by_setting[(lr, ep)].values()])),
              "test": float(np.mean([t for _, t in by_setting[(lr, ep)].values()]))}
             for (lr, ep) in sorted(by_setting) if lr == best[0]]
    cell = {"mean": float(np.mean(tests)), "sd": float(np.std(tests, ddof=1)) if len(tests) > 1 else 0.0,
            "n": len(tests), "selected": {"learning_rate": best[0], "epochs": best[1]},
            "dev_mean": float(np.mean(devs)), "test_scores": tests, "seeds": seeds, "curve": curve}
    if folds:
        cell["folds"] = len(folds)
    per_tag = _per_tag_at(records, *best)
    if per_tag:
        cell["per_tag"] = per_tag
    return cell


def _per_tag_at(records: list[dict], lr: float, epoch: int) -> dict[str, dict[str, float]]:
    """Per-tag precision / recall / F1 at one setting, averaged over the records that have it;
    support is a count of gold entities, the same for every seed, so it is summed over folds."""
    reports = [(rec["trial"].get("fold", -1), rec["per_tag"][str(epoch)]) for rec in records
               if rec["trial"]["learning_rate"] == lr and str(epoch) in rec.get("per_tag", {})]
    tags = sorted({tag for _, rep in reports for tag in rep})
    out = {}
    for tag in tags:
        rows = [(fold, rep[tag]) for fold, rep in reports if tag in rep]
        support_by_fold = {fold: row["support"] for fold, row in rows}
        out[tag] = {k: float(np.mean([row[k] for _, row in rows])) for k in ("precision", "recall", "f1")}
        out[tag]["support"] = int(sum(support_by_fold.values()))
    return out


def build_results(specs: dict[str, TaskSpec], models: list[str], records: list[dict]) -> dict:
    """The results.json document of docs/ARCHITECTURE.md from all trial records."""
    grouped: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for rec in records:
        grouped[(rec["trial"]["model_name"], rec["task"])].append(rec)
    tasks = [{"name": s.name, "metric": s.metric, "higher_is_better": METRICS.get(s.metric).higher_is_better,
              "group": s.group} for s in specs.values()]
    cells: dict[str, dict[str, dict]] = {}
    for model in models:
        cells[model] = {}
        for spec in specs.values():
            recs = grouped.get((model, spec.name))
            if recs:
                cells[model][spec.name] = select_cell(recs, METRICS.get(spec.metric).higher_is_better)
    return {"tasks": tasks, "models": list(models), "cells": cells, "summary": summarize(tasks, cells)}
