"""The BLUE table's numbers (seed 000's Tables 6, 7, A3): columns, cells, ranks; pure, no I/O.

    table = build_table(results)            # results: sweep/results.json (docs/ARCHITECTURE.md)
    table.cell("ours", "total")             # Cell(mean=0.811, sd=0.004, n=None, rank=1, ...)
    table.text(0.8114)                      # "81.1"

One row per model; columns Total, then one per group (Clinical, Biomedical, ...), then one per
task: BLUE's in BLUE's order, then the others in the document's (``core.results.in_blue_order``).
Cells read "mean (sd)" in points (scores x 100, one decimal, as in the seed); per column the
best mean ranks 1 (bold) and the second best 2 (underlined), ranked on the unrounded means so that
"83.9" can be bold above an underlined "83.9", exactly as Table 7 shows. A task whose metric has
``higher_is_better: false`` ranks the lowest value best. A summary over fewer tasks than its
column's is ``partial``: shown with a dagger, never ranked. The renderers
(``orchestrator.report.pages`` for Markdown and HTML, ``orchestrator.report.figures`` for PNG)
only format this model.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.core.config import is_number
from orchestrator.core.results import PARTIAL, in_blue_order, summary_members, validate_results

#: The mark of a partial cell (a summary over fewer tasks than its column's), in every rendering.
DAGGER = "\u2020"


@dataclass(frozen=True)
class Column:
    """One table column: a BLUE task, or one of the summary scores (total / clinical / biomedical)."""

    key: str
    label: str
    higher_is_better: bool
    kind: str  # "summary" | "task"
    metric: str = ""
    group: str = ""


@dataclass(frozen=True)
class Cell:
    """A rendered cell: ``rank`` is 1 (bold) or 2 (underlined) within its column, else None."""

    mean: float | None
    sd: float | None
    n: int | None
    rank: int | None
    selected: tuple[tuple[str, Any], ...] = ()
    dev_mean: float | None = None
    partial: bool = False  # a summary over fewer tasks than its column's: shown with a dagger, never ranked
    dev_tied: bool = False  # every setting scored the same on dev: the selection is the tie-break's
    test_sample: int | None = None  # the test scores are on a seeded sample of this many examples
    cut: tuple[tuple[str, int, int], ...] = ()  # (split, inputs cut at max_seq_length, of how many) where any was
    edge: tuple[tuple[str, str], ...] = ()  # (setting, "largest" ...): the selection is at an end of its grid


@dataclass(frozen=True)
class BlueTable:
    models: tuple[str, ...]
    columns: tuple[Column, ...]
    cells: dict[tuple[str, str], Cell]
    scale: float
    digits: int

    def cell(self, model: str, column: str) -> Cell:
        return self.cells[(model, column)]

    def text(self, value: float | None) -> str:
        """A score in display units ("81.1"), or an en dash when there is none."""
        if value is None:
            return "\u2013"
        return f"{value * self.scale:.{self.digits}f}"



# Pure: validate, rank, build
def rank_top2(values: list[float | None], higher_is_better: bool = True) -> list[int | None]:
    """Rank 1 for the best value, 2 for the second best distinct value, None otherwise.

    Ties share a rank (both bold). Missing values (None / NaN) are never ranked.
    """
    present = sorted({v for v in values if is_number(v)}, reverse=higher_is_better)
    top = {value: rank for rank, value in enumerate(present[:2], start=1)}
    return [top.get(v) if is_number(v) else None for v in values]


def seed_sd(results: dict, model: str, task_names: list[str]) -> float | None:
    """Sample sd over seeds of the per-seed average of ``task_names`` (None if not computable).

    A summary score's sd in Table 7 is the spread of the score over the five seeds. It can be
    recomputed from the per-task ``test_scores``, paired by the cells' ``seeds`` when given
    (else by position), when every task has a score for the same two or more seeds. A
    cross-validated cell's scores are one per fold, not per seed: with one among ``task_names``
    there is no per-seed average, so no sd (as the paired differences leave such a task out).
    """
    rows = results["cells"].get(model, {})
    per_task: list[dict[Any, float]] = []
    for name in task_names:
        cell = rows.get(name) or {}
        if cell.get("folds"):
            return None
        scores = cell.get("test_scores") or []
        seeds = cell.get("seeds") or list(range(len(scores)))
        if not scores or len(seeds) != len(scores) or not all(is_number(v) for v in scores):
            return None
        per_task.append(dict(zip(seeds, scores)))
    if not per_task or any(set(p) != set(per_task[0]) for p in per_task) or len(per_task[0]) < 2:
        return None
    per_seed = [statistics.fmean(p[seed] for p in per_task) for seed in per_task[0]]
    return statistics.stdev(per_seed)


def build_table(results: dict, scale: float = 100.0, digits: int = 1,
                source: str | Path = "results.json") -> BlueTable:
    """The ranked table for ``results`` (validated first)."""
    validate_results(results, source)
    tasks = in_blue_order(results["tasks"])
    models = tuple(results["models"])
    summary = results.get("summary") or {}
    members = summary_members(tasks)

    columns: list[Column] = []
    raw: dict[tuple[str, str], tuple[float | None, float | None, int | None]] = {}
    chosen: dict[tuple[str, str], tuple[tuple[tuple[str, Any], ...], float | None]] = {}
    partial: set[tuple[str, str]] = set()
    for key, names in members.items():
        if not names:
            continue
        columns.append(Column(key=key, label=key.capitalize(), higher_is_better=True, kind="summary"))
        for model in models:
            row = summary.get(model) or {}
            value = row.get(key)
            if isinstance(value, dict):
                mean, sd = value.get("mean"), value.get("sd")
            else:
                mean, sd = value, seed_sd(results, model, names)
            raw[(model, key)] = (_clean(mean), _clean(sd), None)
            if key in row.get(PARTIAL, []):
                partial.add((model, key))
    for task in tasks:
        name = task["name"]
        columns.append(Column(key=name, label=name, higher_is_better=task.get("higher_is_better", True),
                              kind="task", metric=task.get("metric", ""), group=task["group"]))
        for model in models:
            cell = results["cells"].get(model, {}).get(name) or {}
            # one seed has no spread: its cell shows the mean alone, as a summary score does (it showed "(0.0)")
            sd = None if cell.get("n") == 1 else _clean(cell.get("sd"))
            raw[(model, name)] = (_clean(cell.get("mean")), sd, cell.get("n"))
            chosen[(model, name)] = (_in_order(cell.get("selected") or {}), _clean(cell.get("dev_mean")),
                                     bool(cell.get("dev_tied")), cell.get("test_sample"), _cut(cell.get("cut")),
                                     _in_order(cell.get("edge") or {}))

    cells: dict[tuple[str, str], Cell] = {}
    for col in columns:
        ranked = [None if (m, col.key) in partial else raw[(m, col.key)][0] for m in models]
        ranks = rank_top2(ranked, col.higher_is_better)
        for model, rank in zip(models, ranks):
            mean, sd, n = raw[(model, col.key)]
            selected, dev_mean, tied, sample, cut, edge = chosen.get((model, col.key), ((), None, False, None, (), ()))
            cells[(model, col.key)] = Cell(mean=mean, sd=sd, n=n, rank=rank, selected=selected, dev_mean=dev_mean,
                                           partial=(model, col.key) in partial, dev_tied=tied, test_sample=sample,
                                           cut=cut, edge=edge)
    return BlueTable(models=models, columns=tuple(columns), cells=cells, scale=scale, digits=digits)


SELECTED_ORDER = ("learning_rate", "epochs", "batch_size")  # as the sweep's selection makes a cell's keys


def _in_order(selected: dict) -> tuple[tuple[str, Any], ...]:
    """A selected setting's keys in the sweep's order: results.json keeps them sorted by name, MLflow in its
    store's order, and the job renders its own document (a rebuilt report read ``epochs=20, learning_rate=...``
    where the job's said ``learning_rate=..., epochs=20``)."""
    rank = {key: i for i, key in enumerate(SELECTED_ORDER)}
    return tuple(sorted(selected.items(), key=lambda kv: (rank.get(kv[0], len(rank)), kv[0])))


def _cut(cut: dict | None) -> tuple[tuple[str, int, int], ...]:
    """A cell's ``cut`` (inputs cut at max_seq_length per split) in split order, the splits with none left out."""
    order = {split: i for i, split in enumerate(("train", "dev", "test"))}
    rows = [(split, int(c["cut"]), int(c["of"])) for split, c in (cut or {}).items() if c.get("cut")]
    return tuple(sorted(rows, key=lambda row: (order.get(row[0], len(order)), row[0])))


def _clean(value: Any) -> float | None:
    return float(value) if is_number(value) else None
