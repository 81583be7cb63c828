"""The results document's one summary: Total and the group scores, and partial rows that are
shown but never ranked against full ones (issue 11: two definitions of Total)."""
from __future__ import annotations

import re

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


def _document() -> dict:
    cells = {"a": {task: {"mean": 0.5, "sd": 0.01, "n": 2, "selected": {"learning_rate": 5e-5, "epochs": 2},
                          "dev_mean": 0.6, "test_scores": [0.49, 0.51], "seeds": [1, 2],
                          "curve": [{"epoch": 1, "dev": 0.4, "test": 0.3}, {"epoch": 2, "dev": 0.6, "test": 0.5}]}
                   for task in ("MedSTS", "BIOSSES")}}
    tasks = [dict(TASKS[0]), dict(TASKS[2])]
    return {"tasks": tasks, "models": ["a"], "cells": cells, "summary": summarize(tasks, cells)}


@pytest.mark.parametrize("mutate, message", [
    # probe: each of these passed the check (the dry run said valid) and then crashed the report
    (lambda r: r["summary"].update(a=[1, 2]), "summary['a'] is [1, 2]"),
    (lambda r: r["summary"]["a"].update(total={"mean": 0.5, "sd": "x"}), "summary['a'].total.sd is 'x'"),
    (lambda r: r["summary"]["a"].update(partial=[1]), "summary['a'].partial is [1]"),
    (lambda r: r["tasks"][1].update(metric=5), "tasks[1] (BIOSSES).metric is 5"),
    (lambda r: r["cells"]["a"].update(BIOSSES=[0.5]), "cells['a']['BIOSSES'] is [0.5]"),
    (lambda r: r["cells"]["a"]["BIOSSES"].update(curve=5), "cells['a']['BIOSSES'].curve is 5"),
    (lambda r: r["cells"]["a"]["BIOSSES"]["curve"][1].update(dev="0.6"), "cells['a']['BIOSSES'].curve[1].dev is '0.6'"),
    (lambda r: r["cells"]["a"]["MedSTS"].update(n="2"), "cells['a']['MedSTS'].n is '2'"),
    (lambda r: r["cells"]["a"]["MedSTS"].update(selected=["lr"]), "cells['a']['MedSTS'].selected is ['lr']"),
    (lambda r: r["cells"]["a"]["MedSTS"].update(dev_mean=[0.6]), "cells['a']['MedSTS'].dev_mean is [0.6]"),
    (lambda r: r["cells"]["a"]["MedSTS"].update(test_scores=0.5), "cells['a']['MedSTS'].test_scores is 0.5"),
    (lambda r: r["cells"]["a"]["MedSTS"].update(seeds=[[1]]), "cells['a']['MedSTS'].seeds is [[1]]"),
    (lambda r: r["cells"]["a"]["MedSTS"].update(folds="5"), "cells['a']['MedSTS'].folds is '5'"),
    (lambda r: r["cells"]["a"]["MedSTS"].update(per_tag={"Disease": {"f1": "high"}}),
     "cells['a']['MedSTS'].per_tag['Disease'] is {'f1': 'high'}"),
    # a second probe: documents that read as valid and drew a table contradicting itself
    (lambda r: r.update(models=["a", "a"]), "'models' lists 'a' twice"),
    (lambda r: r["cells"]["a"]["MedSTS"].update(test_scores=[0.5]),
     "cells['a']['MedSTS'].n is 2, but test_scores has 1"),
    (lambda r: r["cells"]["a"]["BIOSSES"].update(mean=5.0), "cells['a']['BIOSSES'].mean is 5.0, but its test_scores' "
                                                            "mean is 0.5"),
])
def test_validate_checks_the_type_of_every_field_the_report_reads(mutate, message):
    results = _document()
    validate_results(results, "runs/x/results.json")  # the unbroken document passes
    mutate(results)
    with pytest.raises(InputError, match=re.escape(message)) as err:
        validate_results(results, "runs/x/results.json")
    assert str(err.value).startswith("runs/x/results.json: ")
