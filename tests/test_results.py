"""The results document's one summary: Total and the group scores, and partial rows that are
shown but never ranked against full ones (issue 11: two definitions of Total)."""
from __future__ import annotations

import pytest

from orchestrator.core.errors import InputError
from orchestrator.core.results import summarize, validate_results
from orchestrator.report.pages import render_markdown
from orchestrator.report.table import build_table

TASKS = [{"name": "MedSTS", "metric": "pearson", "higher_is_better": True, "group": "clinical"},
         {"name": "MedNLI", "metric": "accuracy", "higher_is_better": True, "group": "clinical"},
         {"name": "BIOSSES", "metric": "pearson", "higher_is_better": True, "group": "biomedical"},
         {"name": "BC5CDR-chemical", "metric": "ner_f1", "higher_is_better": True, "group": "biomedical"}]


def _cells(scores: dict[str, float]) -> dict:
    return {task: {"mean": value, "sd": 0.0, "n": 1} for task, value in scores.items()}


def test_total_and_groups_are_macro_averages():
    cells = {"a": _cells({"MedSTS": 0.8, "MedNLI": 0.6, "BIOSSES": 0.9, "BC5CDR-chemical": 0.7})}
    summary = summarize(TASKS, cells)["a"]
    assert summary["total"] == pytest.approx(0.75)
    assert summary["clinical"] == pytest.approx(0.7) and summary["biomedical"] == pytest.approx(0.8)
    assert summary["partial"] == []


def test_a_row_over_fewer_tasks_is_partial_and_never_ranked_against_full_rows():
    """An augmented row has NER cells only: its 'Total' is its NER score. It is marked partial, shown
    with a dagger, and the full row keeps the bold Total even though the partial number is higher."""
    cells = {"ours": _cells({"MedSTS": 0.8, "MedNLI": 0.6, "BIOSSES": 0.9, "BC5CDR-chemical": 0.7}),
             "ours+filtered-bert": _cells({"BC5CDR-chemical": 0.95})}
    summary = summarize(TASKS, cells)
    assert summary["ours+filtered-bert"]["total"] == pytest.approx(0.95)
    assert summary["ours+filtered-bert"]["partial"] == ["total", "biomedical"]
    assert summary["ours+filtered-bert"]["clinical"] is None
    results = {"tasks": TASKS, "models": list(cells), "cells": cells, "summary": summary}
    validate_results(results)
    table = build_table(results)
    assert table.cell("ours", "total").rank == 1 and table.cell("ours+filtered-bert", "total").rank is None
    assert table.cell("ours+filtered-bert", "total").partial
    assert table.cell("ours+filtered-bert", "BC5CDR-chemical").rank == 1  # a task column compares like with like
    md = render_markdown(table)
    row = next(line for line in md.splitlines() if line.startswith("| ours+filtered-bert"))
    assert "95.0\u2020" in row and "**95.0" not in row.split("|")[2]
    assert "not ranked" in md


def test_other_groups_get_their_own_column():
    tasks = TASKS[:1] + [{"name": "JSTS", "metric": "pearson", "higher_is_better": True, "group": "japanese"}]
    cells = {"m": _cells({"MedSTS": 0.5, "JSTS": 0.7})}
    results = {"tasks": tasks, "models": ["m"], "cells": cells, "summary": summarize(tasks, cells)}
    table = build_table(results)
    assert [c.key for c in table.columns] == ["total", "clinical", "japanese", "MedSTS", "JSTS"]
    assert table.cell("m", "japanese").mean == pytest.approx(0.7)


def test_validate_names_the_broken_place():
    with pytest.raises(InputError, match=r"tasks\[0\] \(T\) has group ''"):
        validate_results({"tasks": [{"name": "T", "group": ""}], "models": ["m"], "cells": {}})
    with pytest.raises(InputError, match="summary.*partial"):
        validate_results({"tasks": TASKS, "models": ["m"], "cells": {}, "summary": {"m": {"partial": "total"}}})
