"""The results document of a sweep (``sweep/results.json``): its schema check and its one summary.

The sweep writes it, the report and the MLflow reader read it; both sides import this module.

    {"tasks": [{"name": "BIOSSES", "metric": "pearson", "higher_is_better": true, "group": "biomedical"}, ...],
     "models": ["tiny-ampv", ...],
     "cells": {"<model>": {"<task>": {"mean": 0.81, "sd": 0.02, "n": 5, ...}}},
     "summary": {"<model>": {"total": .., "clinical": .., "biomedical": .., "partial": ["total", ...]}}}

``summarize`` is the only definition of the summary scores: Total is the macro average over the
document's tasks, each group's score the macro average over that group's tasks (seed 000: clinical
and biomedical); a task whose metric is lower-is-better (none of BLUE's) is in no average. A model
without a cell for every task of a column (an augmented row has NER cells only) still gets the
average over the tasks it has, and that column is listed in its ``partial``: a partial score is
shown but never ranked against full ones.
"""
from __future__ import annotations

import re
import statistics
from pathlib import Path
from typing import Any

from orchestrator.core.config import is_number
from orchestrator.core.errors import InputError

#: A model (an experiment's arm) named ``<arm>_s<seed>`` is ``<arm>``'s replicate at ``pretrain.seed: <seed>``
#: (``ExperimentConfig.replicate_seeds`` names them so); the report pairs replicates by pretraining seed
REPLICATE = re.compile(r"^(?P<arm>.+)_s(?P<seed>\d+)$")


def replicate_name(arm: str, seed: int) -> str:
    return f"{arm}_s{seed}"


#: Seed 000's score groups, shown in this order before any other declared group.
SEED_GROUPS = ("clinical", "biomedical")
PARTIAL = "partial"
#: BLUE's ten tasks by display name, in the order of BLUE's tables (``search_spaces/blue.yaml`` lists them so).
BLUE_TASKS = ("MedSTS", "BIOSSES", "BC5CDR-disease", "BC5CDR-chemical", "ShARe/CLEFE", "DDI", "ChemProt", "i2b2-2010",
              "HoC", "MedNLI")
#: Each metric of ``orchestrator.finetune.metrics.METRICS`` as BLUE's tables name it (its README's "Tasks" table
#: and its HoC text: "example-based F1-score on the abstract level"), as the report's headers show it: the
#: registry's names (``ner_f1``, ``micro_f1_positive``) are code's, not a reader's (probe B4). Here, not beside
#: the metrics, because the report and the dashboards read results documents without the training stages.
METRIC_NAMES = {"pearson": "Pearson", "ner_f1": "F1", "micro_f1_positive": "micro F1",
                "hoc_example_f1": "example-based F1", "accuracy": "accuracy", "macro_f1": "macro F1"}


def metric_name(metric: str) -> str:
    """A results document's metric as BLUE's tables name it; a metric without a name here (a user's, logged by
    another version) as the document names it."""
    return METRIC_NAMES.get(metric, metric)


def groups_of(tasks: list[dict]) -> list[str]:
    """The groups the tasks declare: clinical and biomedical first (seed 000's order), then the rest
    in order of appearance."""
    seen = [t["group"] for t in tasks]
    return [g for g in SEED_GROUPS if g in seen] + [g for g in dict.fromkeys(seen) if g not in SEED_GROUPS]


def in_blue_order(tasks: list[dict]) -> list[dict]:
    """A document's tasks in the order its tables show them: BLUE's in BLUE's order wherever the document lists
    them (a sweep's ``sweep.tasks`` given in another order put ShARe/CLEFE after MedNLI: probe B5), then the others
    in the document's order."""
    rank = {name: i for i, name in enumerate(BLUE_TASKS)}
    return sorted(tasks, key=lambda task: rank.get(task["name"], len(rank)))


def summary_members(tasks: list[dict]) -> dict[str, list[str]]:
    """Summary column -> the task names it averages: total over all, one column per group. A task whose
    metric is lower-is-better (an error) is in none: averaged with scores where higher is better it ranked
    the worse model first. Its own column shows it; a column left with no task is none."""
    scored = [t for t in tasks if t.get("higher_is_better", True)]
    members = {"total": [t["name"] for t in scored],
               **{g: [t["name"] for t in scored if t["group"] == g] for g in groups_of(tasks)}}
    return {key: names for key, names in members.items() if names}


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
    """Raise InputError naming ``source`` and the first place the document breaks the schema: every
    field the report reads is checked for its type here, so a dry run refuses what the report cannot draw."""

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
        if not isinstance(task.get("metric", ""), str):
            raise bad(f"tasks[{i}] ({task['name']}).metric is {_brief(task['metric'])}", "a metric name (a string)")
        if not isinstance(task.get("group"), str) or not task["group"] or task["group"] in ("total", PARTIAL):
            raise bad(f"tasks[{i}] ({task['name']}) has group {task.get('group')!r}",
                      "a group name such as clinical or biomedical")
        names.append(task["name"])
    if len(set(names)) != len(names):
        raise bad(f"duplicate task names in {names}", "unique task names")
    models = results["models"]
    if not isinstance(models, list) or not models or not all(isinstance(m, str) for m in models):
        raise bad("'models' is empty or not a list of names", "a non-empty list of model names")
    if len(set(models)) != len(models):
        raise bad(f"'models' lists {next(m for m in models if models.count(m) > 1)!r} twice", "unique model names")
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
            where = f"cells[{model!r}][{task!r}]"
            if not isinstance(cell, dict):
                raise bad(f"{where} is {_brief(cell)}", '{"mean": .., "sd": .., "n": .., "curve": [..], ...}')
            if not _is_number_or_none(cell.get("mean")):  # null or absent: a cell without a score
                raise bad(f"{where}.mean is {_brief(cell.get('mean'))}", "a number or null")
            for field, check, expected in CELL_FIELDS:
                if cell.get(field) is not None and not check(cell[field]):
                    raise bad(f"{where}.{field} is {_brief(cell[field])}", expected)
            _check_scores(cell, where, bad)
            for j, point in enumerate(cell.get("curve") or []):
                if not isinstance(point, dict) or not is_number(point.get("epoch")):
                    raise bad(f"{where}.curve[{j}] has no numeric epoch", '{"epoch": int, "dev": float, "test": float}')
                for split in ("dev", "test"):
                    if not _is_number_or_none(point.get(split)):
                        raise bad(f"{where}.curve[{j}].{split} is {_brief(point[split])}", "a number or null")
            for tag, scores in (cell.get("per_tag") or {}).items():
                if not isinstance(scores, dict) or not all(_is_number_or_none(scores.get(k)) for k in PER_TAG_FIELDS):
                    raise bad(f"{where}.per_tag[{tag!r}] is {_brief(scores)}",
                              '{"precision": float, "recall": float, "f1": float, "support": int}')
    summary = results.get("summary") or {}
    if not isinstance(summary, dict):
        raise bad("'summary' is not an object", '{"<model>": {"total": .., "clinical": .., "biomedical": ..}}')
    for model, row in summary.items():
        if not isinstance(row or {}, dict):
            raise bad(f"summary[{model!r}] is {_brief(row)}", '{"total": .., "<group>": .., "partial": [..]}')
        for key in summary_members(tasks):
            value = (row or {}).get(key)
            parts = value if isinstance(value, dict) else {"mean": value}
            for part in ("mean", "sd"):
                if not _is_number_or_none(parts.get(part)):
                    shown = f"{key}.{part}" if isinstance(value, dict) else key
                    raise bad(f"summary[{model!r}].{shown} is {_brief(parts[part])}", "a number, {mean, sd}, or null")
        partial = (row or {}).get(PARTIAL, [])
        if not isinstance(partial, list) or not all(isinstance(key, str) for key in partial):
            raise bad(f"summary[{model!r}].{PARTIAL} is {_brief(partial)}", "a list of summary column names")


def _check_scores(cell: dict, where: str, bad) -> None:
    """A cell's ``n``, ``test_scores`` and ``mean`` agree: n scores, and the mean is theirs."""
    scores, n, mean = cell.get("test_scores"), cell.get("n"), cell.get("mean")
    if not isinstance(scores, list):
        return
    if _is_int(n) and len(scores) != n:
        raise bad(f"{where}.n is {n}, but test_scores has {len(scores)} score(s)", "one test score per seed (or fold)")
    if scores and all(is_number(v) for v in scores) and is_number(mean) and not _same(mean, statistics.fmean(scores)):
        raise bad(f"{where}.mean is {mean!r}, but its test_scores' mean is {statistics.fmean(scores)!r}",
                  "the mean of the cell's test_scores")


def _same(a: Any, b: Any) -> bool:
    """Two scores of a document agree: both absent, both NaN, or equal to rounding."""
    if a is None or b is None:
        return a is None and b is None
    if not (is_number(a) and is_number(b)):
        return is_number(a, finite=False) and is_number(b, finite=False) and a != a and b != b  # NaN and NaN
    return abs(a - b) <= 1e-9 + 1e-6 * max(abs(a), abs(b))


def _is_number_or_none(value: Any) -> bool:
    return value is None or is_number(value, finite=False)  # a diverged cell's NaN is recorded as such


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_list_of(check) -> Any:
    return lambda value: isinstance(value, list) and all(check(v) for v in value)


#: The optional fields of a cell the report reads: (field, check, what was expected); null means absent.
CELL_FIELDS = (
    ("sd", _is_number_or_none, "a number or null"),
    ("n", _is_int, "an integer (the number of seeds or folds) or null"),
    ("dev_mean", _is_number_or_none, "a number or null"),
    ("selected", lambda v: isinstance(v, dict) and all(isinstance(x, (str, int, float)) for x in v.values()),
     '{"<setting>": number or string}, e.g. {"learning_rate": 5e-05, "epochs": 3}'),
    ("test_scores", _is_list_of(_is_number_or_none), "a list of numbers, one per seed (or fold)"),
    ("seeds", _is_list_of(lambda v: isinstance(v, (int, str))), "a list of seeds (integers)"),
    ("folds", _is_int, "an integer (the number of folds)"),
    ("per_tag", lambda v: isinstance(v, dict), '{"<entity type>": {"precision": .., "recall": .., "f1": .., '
                                               '"support": ..}}'),
    ("curve", lambda v: isinstance(v, list), '[{"epoch": int, "dev": float, "test": float}, ...]'),
    ("edge", lambda v: isinstance(v, dict) and all(isinstance(x, str) for x in v.values()),
     '{"<setting>": "largest" | "smallest" | "most" | "fewest"} (the selection at an end of its grid)'),
    ("cut", lambda v: isinstance(v, dict) and all(isinstance(c, dict) and _is_int(c.get("cut")) and _is_int(c.get("of"))
                                                  for c in v.values()),
     '{"<split>": {"cut": int, "of": int}} (inputs cut at max_seq_length)'),
)
PER_TAG_FIELDS = ("precision", "recall", "f1", "support")


def _brief(value: Any, width: int = 60) -> str:
    """A value as it reads in an error message, cut to ``width`` characters."""
    text = repr(value)
    return text if len(text) <= width else text[:width - 3] + "..."
