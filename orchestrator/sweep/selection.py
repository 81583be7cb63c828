"""Selection on dev, seed aggregation and the results.json document (pure functions, no Ray).

For each (model, task): every (learning rate, batch size, re-initialised layers, epochs) setting gets its dev
mean over seeds; the best setting by the task metric's direction is selected (ties: fewer epochs, then the
smaller learning rate, then the smaller batch, then fewer layers re-initialised; a setting missing some seed's run,
or whose dev mean is not a number, only when no other setting is complete and a number); the test scores of all
seeds at that setting give mean (sd), sd the sample standard deviation (ddof=1; 0 for one seed). ``selected``
names the batch size, and the layers re-initialised, only when the trials had that axis (several values).

Cross-validated tasks (trials carry ``fold`` >= 0): selection uses the dev mean over every
(seed, fold); the reported scores are one per fold (mean over seeds), so mean (sd) is over
folds as in seed 000's Table 5. NER cells also carry ``per_tag`` precision / recall / F1 /
support at the selected setting (mean over seeds and folds; seed 001's per-tag table) and, where
the trials recorded entity counts, a ``micro avg`` row: micro precision / recall / F1 of each run
from its summed true-positive, predicted and gold entity counts, mean over the runs.

Early-stopped trials (records with ``early_stopping``) have no epoch axis: a setting is a learning
rate, each trial answering it with its best dev epoch's dev and test scores; ``selected`` holds the
learning rate only, the cell's ``early_stopping`` each run's best and last epoch (runs in (seed,
fold) order), and its curve the dev mean per epoch over the runs that trained that long (``n``).

A cell whose selected value is the first or last of a grid axis of three or more values (learning rate, batch
size, layers re-initialised, epochs) carries ``edge``, e.g. ``{"learning_rate": "largest", "epochs": "most"}``:
the best setting may lie beyond the grid, which the report says (on two values every choice is an end, so they
are not marked; nor is a tie, which the tie-break chose).
"""
from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Collection, Iterable

import numpy as np

from orchestrator.core.results import summarize
from orchestrator.finetune.metrics import METRICS, micro_prf
from orchestrator.finetune.spec import TaskSpec

EARLY_STOPPED = 0  # the epochs of an early-stopped trial's answer: chosen inside the trial, on dev
#: A setting's axes as ``select_cell`` keys them (learning rate, batch size, layers re-initialised, epochs), with
#: the words for the first and the last value of each: a cell's ``edge``.
EDGE_WORDS = (("learning_rate", "smallest", "largest"), ("batch_size", "smallest", "largest"),
              ("reinit_layers", "fewest", "most"), ("epochs", "fewest", "most"))
Setting = tuple[float, int, int, int]  # (learning rate, batch size, layers re-initialised, epochs)
EDGE_MIN_VALUES = 3  # an axis of two values has no inside: either choice is an end


def grid_edges(settings: Collection[Setting], best: Setting, axes: Iterable[str]) -> dict[str, str]:
    """``{axis: word}`` for each of ``axes`` (names in ``EDGE_WORDS``) on which ``best`` is the first or the last
    of the values ``settings`` hold, where they hold at least ``EDGE_MIN_VALUES``."""
    out = {}
    for i, (axis, first, last) in enumerate(EDGE_WORDS):
        if axis not in axes:
            continue
        values = sorted({key[i] for key in settings})
        if len(values) >= EDGE_MIN_VALUES and best[i] in (values[0], values[-1]):
            out[axis] = first if best[i] == values[0] else last
    return out


def _answers(rec: dict) -> list[tuple[int, float, float]]:
    """The (epochs, dev, test) a trial record answers: each evaluated epoch of its epoch grid, or
    for an early-stopped trial one answer, from the row of its best dev epoch (which holds its test)."""
    if "early_stopping" in rec:
        row = next(r for r in rec["epochs"] if r["epoch"] == rec["early_stopping"]["best_epoch"])
        return [(EARLY_STOPPED, row["dev"], row["test"])]
    return [(row["epoch"], row["dev"], row["test"]) for row in rec["epochs"] if "dev" in row]


def _batch(rec: dict) -> int | None:
    """A trial record's batch size (records written before the batch-size axis may lack it)."""
    return rec["trial"].get("batch_size")


def _reinit(rec: dict) -> int:
    """A trial record's layers re-initialised (records written before the option lack it: none)."""
    return rec["trial"].get("reinit_layers", 0)


def _at(rec: dict, lr: float, batch: int | None, reinit: int | None = None) -> bool:
    """The record was trained at this learning rate (and batch size, layers re-initialised, unless None: any)."""
    return (rec["trial"]["learning_rate"] == lr and (batch is None or _batch(rec) == batch)
            and (reinit is None or _reinit(rec) == reinit))


def edge_warning(results: dict) -> str:
    """One line naming the cells of a results document whose selection is at an end of its grid ("" if none)."""
    edges = [(m, t, c["edge"]) for m, cells in results["cells"].items() for t, c in cells.items() if c.get("edge")]
    if not edges:
        return ""
    total = sum(len(cells) for cells in results["cells"].values())
    shown = "; ".join(f"{m}/{t}: {', '.join(f'{w} {a}' for a, w in e.items())}" for m, t, e in edges[:3])
    more = f"; {len(edges) - 3} more" if len(edges) > 3 else ""
    return (f"{len(edges)} of {total} selection(s) at an end of the grid ({shown}{more}): a better setting may lie "
            "beyond it; widen that axis to tell (the report's \"Settings selected on dev\" names each)")


def selected_runs(records: Iterable[dict], selected: dict) -> list[tuple[dict, int, float, float]]:
    """The runs behind a cell's ``selected`` setting: (record, epoch, dev, test) per (seed, fold) at
    that learning rate, batch size, layers re-initialised and epoch count (early-stopped: each record at its own
    best dev epoch)."""
    out = []
    for rec in records:
        if not _at(rec, selected["learning_rate"], selected.get("batch_size"), selected.get("reinit_layers")):
            continue
        if "early_stopping" in rec:
            epoch = rec["early_stopping"]["best_epoch"]
        elif selected.get("epochs") in {row["epoch"] for row in rec["epochs"] if "dev" in row}:
            epoch = selected["epochs"]
        else:
            continue
        row = next(r for r in rec["epochs"] if r["epoch"] == epoch)
        out.append((rec, epoch, row["dev"], row["test"]))
    return out


def selected_answers(results: dict, records: Iterable[dict]) -> dict[str, dict]:
    """Per trial id of the runs behind each cell's selected setting, the epoch, dev and test score the selection
    used (``selected_runs``): what its MLflow trial run shows beside its last epoch's scores (probe M9)."""
    by_cell: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for rec in records:
        by_cell[(rec["trial"]["model_name"], rec["task"])].append(rec)
    out = {}
    for (model, task), recs in by_cell.items():
        if cell := results["cells"].get(model, {}).get(task):
            out.update({rec["trial_id"]: {"epoch": epoch, "dev": dev, "test": test}
                        for rec, epoch, dev, test in selected_runs(recs, cell["selected"])})
    return out


def select_cell(records: Iterable[dict], higher_is_better: bool) -> dict:
    """One results.json cell from the trial records of one (model, task)."""
    records = list(records)
    if len({"early_stopping" in rec for rec in records}) > 1:
        raise ValueError("these trial records mix early-stopped trials and trials of an epoch grid")
    batch_axis = len({_batch(rec) for rec in records}) > 1
    reinit_axis = len({_reinit(rec) for rec in records}) > 1
    by_setting: dict[Setting, dict[tuple[int, int], tuple[float, float]]] = defaultdict(dict)
    for rec in records:
        lr, seed, fold = rec["trial"]["learning_rate"], rec["trial"]["seed"], rec["trial"].get("fold", -1)
        batch = _batch(rec) if batch_axis else 0
        reinit = _reinit(rec) if reinit_axis else 0
        for epochs, dev, test in _answers(rec):
            by_setting[(lr, batch, reinit, epochs)][(seed, fold)] = (dev, test)
    if not by_setting:
        raise ValueError("no evaluated epochs in these trial records")
    sign = 1.0 if higher_is_better else -1.0

    most = max(len(runs) for runs in by_setting.values())

    def rank(key: Setting) -> tuple[bool, bool, float, int, float, int, int]:
        """Settings with every (seed, fold) first, then those whose dev mean is a number, then by it."""
        lr, batch, reinit, epochs = key
        dev_mean = float(np.mean([d for d, _ in by_setting[key].values()]))
        nan = math.isnan(dev_mean)
        return (len(by_setting[key]) < most, nan, 0.0 if nan else -sign * dev_mean, epochs, lr, batch, reinit)

    best = min(by_setting, key=rank)
    best_lr, best_batch, best_reinit, best_epochs = best
    complete = [float(np.mean([d for d, _ in runs.values()])) for runs in by_setting.values() if len(runs) == most]
    # every setting scored the same on dev (a constant dev gold, a model that predicts one value): the
    # selection is the tie-break's (fewest epochs, then the smallest learning rate), which the report says
    tied = len(complete) > 1 and (all(map(math.isnan, complete)) or max(complete) - min(complete) <= 1e-12)
    runs = by_setting[best]
    at_best = (best_lr, best_batch if batch_axis else None, best_reinit if reinit_axis else None)
    seeds = sorted({s for s, _ in runs})
    folds = sorted({f for _, f in runs if f >= 0})
    devs = [float(d) for d, _ in runs.values()]
    if folds:  # one score per fold: the mean over seeds of that fold's test score
        tests = [float(np.mean([runs[(s, f)][1] for s in seeds if (s, f) in runs])) for f in folds]
    else:
        tests = [float(runs[(s, -1)][1]) for s in seeds]
    stopped = [rec for rec in records if "early_stopping" in rec and _at(rec, *at_best)]
    if stopped:
        curve = _dev_curve(stopped)
    else:
        curve = [{"epoch": key[-1], "dev": float(np.mean([d for d, _ in by_setting[key].values()])),
                  "test": float(np.mean([t for _, t in by_setting[key].values()]))}
                 for key in sorted(by_setting) if key[:-1] == best[:-1]]
    selected = {"learning_rate": best_lr} if stopped else {"learning_rate": best_lr, "epochs": best_epochs}
    if batch_axis:
        selected["batch_size"] = best_batch
    if reinit_axis:
        selected["reinit_layers"] = best_reinit
    cell = {"mean": float(np.mean(tests)), "sd": float(np.std(tests, ddof=1)) if len(tests) > 1 else 0.0,
            "n": len(tests), "selected": selected,
            "dev_mean": float(np.mean(devs)), "test_scores": tests, "seeds": seeds, "curve": curve}
    if folds:
        cell["folds"] = len(folds)
    if tied:
        cell["dev_tied"] = True
    else:
        complete_keys = [key for key, runs in by_setting.items() if len(runs) == most]
        edge = grid_edges(complete_keys, best, selected)
        if edge:
            cell["edge"] = edge  # the best setting may lie beyond the grid, which the report says
    cap = max((rec["trial"].get("max_eval_examples") or 0 for rec in records), default=0)
    if cap and any(_sampled(rec.get("counts") or {}, cap) for rec in records):
        cell["test_sample"] = cap  # a seeded sample of the test split (sweep.max_eval_examples), which the report says
    cut = _cut_counts(records)
    if cut:
        cell["cut"] = cut  # inputs cut at max_seq_length, per split, which the report says
    if stopped:
        stops = [r["early_stopping"] for r in sorted(stopped, key=lambda r: (r["trial"]["seed"],
                                                                              r["trial"].get("fold", -1)))]
        cell["early_stopping"] = {"best_epochs": [x["best_epoch"] for x in stops],
                                  "stopped_epochs": [x["stopped_epoch"] for x in stops]}
    per_tag = _per_tag_at([rec for rec in records if _at(rec, *at_best)], best_lr, best_epochs)
    if per_tag:
        cell["per_tag"] = per_tag
    return cell


def _sampled(counts: dict, cap: int) -> bool:
    """The test split was sampled to ``cap``: it was longer when read (``test_read``); a record kept before the
    size read was, when it holds ``cap`` examples or more (a split of exactly ``cap`` said so too)."""
    if "test_read" in counts:
        return counts["test_read"] > counts.get("test_size", 0)
    return counts.get("test_size", 0) >= cap


def _cut_counts(records: list[dict]) -> dict[str, dict[str, int]]:
    """Per split, the inputs cut at max_seq_length (``counts.<split>_cut``) of the split's examples, where any
    was: one record per fold (every seed and setting reads the same split), the folds' counts summed. Records
    kept before cuts were counted give none."""
    by_fold: dict[int, dict] = {}
    for rec in records:
        by_fold.setdefault(rec["trial"].get("fold", -1), rec.get("counts") or {})
    out: dict[str, dict[str, int]] = {}
    for counts in by_fold.values():
        for key, n in counts.items():
            split = key[:-len("_cut")]
            if key.endswith("_cut") and f"{split}_size" in counts:
                row = out.setdefault(split, {"cut": 0, "of": 0})
                row["cut"] += int(n)
                row["of"] += int(counts[f"{split}_size"])
    return {split: row for split, row in out.items() if row["cut"]}


def _dev_curve(records: list[dict]) -> list[dict]:
    """Early-stopped trials: the dev mean per epoch over the ``n`` trials that trained that long."""
    by_epoch: dict[int, list[float]] = defaultdict(list)
    for rec in records:
        for row in rec["epochs"]:
            by_epoch[row["epoch"]].append(row["dev"])
    return [{"epoch": ep, "dev": float(np.mean(devs)), "n": len(devs)} for ep, devs in sorted(by_epoch.items())]


def _per_tag_at(records: list[dict], lr: float, epoch: int) -> dict[str, dict[str, float]]:
    """Per-tag precision / recall / F1 at one setting, averaged over the records that have it
    (an early-stopped record: at its best dev epoch); support is a count of gold entities, the
    same for every seed, so it is summed over folds."""
    reports = []
    for rec in records:
        at = str(rec["early_stopping"]["best_epoch"] if "early_stopping" in rec else epoch)
        if rec["trial"]["learning_rate"] == lr and at in rec.get("per_tag", {}):
            reports.append((rec["trial"].get("fold", -1), rec["per_tag"][at]))
    tags = sorted({tag for _, rep in reports for tag in rep})
    out = {}
    for tag in tags:
        rows = [(fold, rep[tag]) for fold, rep in reports if tag in rep]
        support_by_fold = {fold: row["support"] for fold, row in rows}
        out[tag] = {k: float(np.mean([row[k] for _, row in rows])) for k in ("precision", "recall", "f1")}
        out[tag]["support"] = int(sum(support_by_fold.values()))
    counted = [rep for _, rep in reports if all("predicted" in row for row in rep.values())]
    if reports and len(counted) == len(reports):  # records since issue 33 carry entity counts: micro P/R/F1
        micro = [micro_prf({"tp": r["tp"], "predicted": r["predicted"], "gold": r["support"]} for r in rep.values())
                 for rep in counted]
        out["micro avg"] = {k: float(np.mean([m[k] for m in micro])) for k in ("precision", "recall", "f1")}
        out["micro avg"]["support"] = sum(row["support"] for tag, row in out.items() if tag != "micro avg")
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
