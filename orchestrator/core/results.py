"""The results document of a sweep (``sweep/results.json``): its schema check and its one summary.

The sweep writes it, the report and the MLflow reader read it; both sides import this module.

    {"tasks": [{"name": "BIOSSES", "metric": "pearson", "higher_is_better": true, "group": "biomedical"}, ...],
     "models": ["tiny-ampv", ...],
     "cells": {"<model>": {"<task>": {"mean": 0.81, "sd": 0.02, "n": 5, ...}}},
     "summary": {"<model>": {"total": .., "clinical": .., "biomedical": .., "partial": ["total", ...]}}}

``summarize`` is the only definition of the summary scores: Total is the macro average over the
document's tasks, each group's score the macro average over that group's tasks (seed 000: clinical
and biomedical). A model without a cell for every task of a column (an augmented row has NER cells
only) still gets the average over the tasks it has, and that column is listed in its ``partial``:
a partial score is shown but never ranked against full ones.
"""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from orchestrator.core.config import is_number
from orchestrator.core.errors import InputError

#: Seed 000's score groups, shown in this order before any other declared group.
SEED_GROUPS = ("clinical", "biomedical")
PARTIAL = "partial"


def groups_of(tasks: list[dict]) -> list[str]:
    """The groups the tasks declare: clinical and biomedical first (seed 000's order), then the rest
    in order of appearance."""
    seen = [t["group"] for t in tasks]
    return [g for g in SEED_GROUPS if g in seen] + [g for g in dict.fromkeys(seen) if g not in SEED_GROUPS]


def summary_members(tasks: list[dict]) -> dict[str, list[str]]:
    """Summary column -> the task names it averages: total over all, one column per group."""
    return {"total": [t["name"] for t in tasks],
            **{g: [t["name"] for t in tasks if t["group"] == g] for g in groups_of(tasks)}}


def summarize(tasks: list[dict], cells: dict[str, dict[str, dict]]) -> dict[str, dict[str, Any]]:
    """{model: {"total": x, <group>: y, ..., "partial": [columns averaged over fewer tasks than the column's]}}."""
    members = summary_members(tasks)
    out: dict[str, dict[str, Any]] = {}
    for model, row in cells.items():
        scores: dict[str, Any] = {}
        partial = []
        for key, names in members.items():
            values = [row[n]["mean"] for n in names if is_number((row.get(n) or {}).get("mean"))]
            scores[key] = statistics.fmean(values) if values else None
            if values and len(values) < len(names):
                partial.append(key)
        scores[PARTIAL] = partial
        out[model] = scores
    return out


def validate_results(results: Any, source: str | Path = "results.json") -> None:
    """Raise InputError naming ``source`` and the first place the document breaks the schema."""

    def bad(message: str, expected: str) -> InputError:
        return InputError(source, message, expected=expected)

    if not isinstance(results, dict):
        raise bad(f"top level is {type(results).__name__}", "a JSON object with tasks, models, cells, summary")
    for key in ("tasks", "models", "cells"):
        if key not in results:
            raise bad(f"missing key {key!r}", "keys tasks, models, cells (and summary)")
    tasks = results["tasks"]
    if not isinstance(tasks, list) or not tasks:
        raise bad("'tasks' is empty or not a list", "a non-empty list of task objects")
    names = []
    for i, task in enumerate(tasks):
        if not isinstance(task, dict) or not isinstance(task.get("name"), str):
            raise bad(f"tasks[{i}] has no name", '{"name": str, "metric": str, "higher_is_better": bool, "group": str}')
        if not isinstance(task.get("higher_is_better", True), bool):
            raise bad(f"tasks[{i}].higher_is_better is {task['higher_is_better']!r}", "true or false")
        if not isinstance(task.get("group"), str) or not task["group"] or task["group"] in ("total", PARTIAL):
            raise bad(f"tasks[{i}] ({task['name']}) has group {task.get('group')!r}",
                      "a group name such as clinical or biomedical")
        names.append(task["name"])
    if len(set(names)) != len(names):
        raise bad(f"duplicate task names in {names}", "unique task names")
    models = results["models"]
    if not isinstance(models, list) or not models or not all(isinstance(m, str) for m in models):
        raise bad("'models' is empty or not a list of names", "a non-empty list of model names")
    cells = results["cells"]
    if not isinstance(cells, dict):
        raise bad("'cells' is not an object", '{"<model>": {"<task>": {"mean": .., "sd": ..}}}')
    for model, row in cells.items():
        if model not in models:
            raise bad(f"cells has model {model!r} not listed in 'models'", f"one of {models}")
        if not isinstance(row, dict):
            raise bad(f"cells[{model!r}] is not an object", "an object keyed by task name")
        for task, cell in row.items():
            if task not in names:
                raise bad(f"cells[{model!r}] has task {task!r} not listed in 'tasks'", f"one of {names}")
            if not isinstance(cell, dict) or not _is_number_or_none(cell.get("mean")):
                shown = cell.get("mean") if isinstance(cell, dict) else cell
                raise bad(f"cells[{model!r}][{task!r}].mean is {shown!r}", "a number or null")
            if not _is_number_or_none(cell.get("sd")):
                raise bad(f"cells[{model!r}][{task!r}].sd is {cell['sd']!r}", "a number or null")
            for j, point in enumerate(cell.get("curve") or []):
                if not isinstance(point, dict) or not is_number(point.get("epoch")):
                    raise bad(f"cells[{model!r}][{task!r}].curve[{j}] has no numeric epoch",
                              '{"epoch": int, "dev": float, "test": float}')
    summary = results.get("summary") or {}
    if not isinstance(summary, dict):
        raise bad("'summary' is not an object", '{"<model>": {"total": .., "clinical": .., "biomedical": ..}}')
    for model, row in summary.items():
        for key in summary_members(tasks):
            value = (row or {}).get(key)
            if isinstance(value, dict):
                value = value.get("mean")
            if not _is_number_or_none(value):
                raise bad(f"summary[{model!r}].{key} is {value!r}", "a number, {mean, sd}, or null")
        if not isinstance((row or {}).get(PARTIAL, []), list):
            raise bad(f"summary[{model!r}].{PARTIAL} is {row[PARTIAL]!r}", "a list of summary column names")


def _is_number_or_none(value: Any) -> bool:
    return value is None or is_number(value, finite=False)  # a diverged cell's NaN is recorded as such
