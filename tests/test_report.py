"""BLUE table report: ranking, formats, the HTML as Chromium renders it, and rebuilding from MLflow."""
from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from orchestrator.core.errors import InputError
from orchestrator.core.manifest import read_manifest
from orchestrator.core.results import summarize
from orchestrator.report.blue_table import write_report
from orchestrator.report.pages import render_markdown
from orchestrator.report.table import build_table, rank_top2, seed_sd

ROOT = Path(__file__).resolve().parents[1]


def make_results() -> dict:
    """Three models, two biomedical tasks (one lower-is-better), one clinical task, 3 seeds each."""
    tasks = [{"name": "BIOSSES", "metric": "pearson", "higher_is_better": True, "group": "biomedical"},
             {"name": "MedNLI", "metric": "accuracy", "higher_is_better": True, "group": "clinical"},
             {"name": "ErrTask", "metric": "mae", "higher_is_better": False, "group": "biomedical"}]
    scores = {  # model -> task -> per-seed test scores
        "base": {"BIOSSES": [0.80, 0.82, 0.78], "MedNLI": [0.70, 0.71, 0.69], "ErrTask": [0.30, 0.31, 0.29]},
        "ampv": {"BIOSSES": [0.90, 0.91, 0.89], "MedNLI": [0.60, 0.61, 0.59], "ErrTask": [0.20, 0.21, 0.19]},
        # MedNLI mean 0.70 + 1e-9: rounds to the same "70.0" as base but must rank strictly above it.
        "simpt": {"BIOSSES": [0.85, 0.86, 0.84], "MedNLI": [0.70 + 1e-9] * 3, "ErrTask": [0.25, 0.26, 0.24]},
    }
    cells, summary = {}, {}
    for model, row in scores.items():
        cells[model] = {}
        for task, values in row.items():
            mean = sum(values) / len(values)
            cells[model][task] = {
                "mean": mean, "sd": (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5,
                "n": len(values), "selected": {"learning_rate": 5e-5, "epochs": 2}, "dev_mean": mean + 0.01,
                "test_scores": values,
                "curve": [{"epoch": 1, "dev": mean - 0.1, "test": mean - 0.12},
                          {"epoch": 2, "dev": mean + 0.01, "test": mean}],
            }
        means = {t: c["mean"] for t, c in cells[model].items()}
        # ErrTask, lower is better, is in no average (it ranked the worse model first)
        summary[model] = {"total": (means["BIOSSES"] + means["MedNLI"]) / 2, "clinical": means["MedNLI"],
                          "biomedical": means["BIOSSES"]}
    return {"tasks": tasks, "models": list(scores), "cells": cells, "summary": summary}


# ---------------------------------------------------------------------------------------------
def test_rank_top2_ties_missing_and_direction():
    assert rank_top2([0.5, 0.9, 0.7, None]) == [None, 1, 2, None]
    assert rank_top2([0.5, 0.9, 0.7], higher_is_better=False) == [1, None, 2]
    assert rank_top2([0.9, 0.9, 0.7]) == [1, 1, 2]  # a tie shares the bold
    assert rank_top2([float("nan"), 0.1]) == [None, 1]
    assert rank_top2([None, None]) == [None, None]


def test_build_table_ranks_columns_as_seed_000():
    table = build_table(make_results())
    assert [c.key for c in table.columns] == ["total", "clinical", "biomedical", "BIOSSES", "MedNLI", "ErrTask"]
    rank = {(m, c.key): table.cell(m, c.key).rank for m in table.models for c in table.columns}
    assert (rank["ampv", "BIOSSES"], rank["simpt", "BIOSSES"], rank["base", "BIOSSES"]) == (1, 2, None)
    # lower is better: the smallest error is bold
    assert (rank["ampv", "ErrTask"], rank["simpt", "ErrTask"], rank["base", "ErrTask"]) == (1, 2, None)
    # same rounded text, ranked on the unrounded means (Table 7's bold 83.9 over underlined 83.9)
    assert (rank["simpt", "MedNLI"], rank["base", "MedNLI"], rank["ampv", "MedNLI"]) == (1, 2, None)
    assert table.text(table.cell("simpt", "MedNLI").mean) == table.text(table.cell("base", "MedNLI").mean) == "70.0"
    # the summary sd is recomputed over seeds from the per-task test scores
    assert table.cell("base", "clinical").sd == pytest.approx(0.01)
    assert seed_sd(make_results(), "base", ["BIOSSES", "ErrTask"]) == pytest.approx(0.015)
    paired = make_results()
    for row in paired["cells"].values():  # seeds listed in a different order per task: paired by seed
        row["BIOSSES"]["seeds"], row["ErrTask"]["seeds"] = [1, 2, 3], [3, 1, 2]
        row["ErrTask"]["test_scores"] = [row["ErrTask"]["test_scores"][i] for i in (2, 0, 1)]
    assert seed_sd(paired, "base", ["BIOSSES", "ErrTask"]) == pytest.approx(0.015)
    paired["cells"]["base"]["ErrTask"]["seeds"] = [4, 5, 6]
    assert seed_sd(paired, "base", ["BIOSSES", "ErrTask"]) is None  # no common seeds: no sd claimed
    # a cross-validated cell holds a score per fold, not per seed: 3 folds were paired with 3 seeds' scores
    folds = make_results()
    for task in ("BIOSSES", "ErrTask"):
        folds["cells"]["base"][task]["seeds"] = [1, 2, 3]
    assert seed_sd(folds, "base", ["BIOSSES", "ErrTask"]) == pytest.approx(0.015)
    folds["cells"]["base"]["ErrTask"]["folds"] = 3
    assert seed_sd(folds, "base", ["BIOSSES", "ErrTask"]) is None
    folds["cells"]["base"]["BIOSSES"]["folds"] = 3
    assert build_table(folds).cell("base", "biomedical").sd is None


def test_a_lower_is_better_task_is_in_no_summary_score():
    """An extension probe (session 48): a user's task with a lower-is-better metric (an MSE) was averaged into
    Total and its group with scores where higher is better, so the model worse on every task ranked first
    on both, and its summary difference was marked better."""
    from orchestrator.core.results import summarize
    from orchestrator.report.compare import paired_differences

    tasks = [{"name": "Sim", "metric": "pearson", "higher_is_better": True, "group": "biomedical"},
             {"name": "Err", "metric": "mse", "higher_is_better": False, "group": "biomedical"},
             {"name": "Loss", "metric": "mse", "higher_is_better": False, "group": "clinical"}]
    scores = {"good": {"Sim": [0.8, 0.82], "Err": [0.1, 0.12], "Loss": [0.2, 0.2]},
              "bad": {"Sim": [0.7, 0.72], "Err": [0.9, 0.92], "Loss": [0.5, 0.6]}}  # worse on every task
    cells = {m: {t: {"mean": sum(v) / 2, "sd": 0.01, "n": 2, "test_scores": v, "seeds": [1, 2],
                     "selected": {"learning_rate": 1e-4}} for t, v in row.items()} for m, row in scores.items()}
    results = {"tasks": tasks, "models": ["good", "bad"], "cells": cells, "summary": summarize(tasks, cells)}
    assert results["summary"]["bad"] == {"total": pytest.approx(0.71), "biomedical": pytest.approx(0.71),
                                         "partial": []}  # Sim alone; no clinical column: Loss is its only task
    table = build_table(results)
    assert [c.key for c in table.columns] == ["total", "biomedical", "Sim", "Err", "Loss"]
    assert table.cell("good", "total").rank == 1 and table.cell("bad", "total").rank == 2
    assert table.cell("good", "Err").rank == 1  # its own column still ranks the lowest error first
    diff = paired_differences(results, "good")["rows"]["bad"]
    assert diff["total"]["better"] is False and diff["total"]["tasks"] == ["Sim"]
    note = render_markdown(table)
    assert "Total is the macro average over the 3 tasks shown but Err, Loss (lower is better" in note


def blue_results(stems: list[str]) -> dict:
    """A results document of the shipped tasks ``stems`` (in that order), as the sweep writes it: each task's
    name, metric, direction and group from its YAML; models m and n, two seeds, task k scoring 0.1 + k / 100
    (m) and 0.1 + k / 200 (n)."""
    from orchestrator.finetune.metrics import METRICS
    from orchestrator.finetune.spec import load_task

    specs = [load_task(stem) for stem in stems]
    tasks = [{"name": s.name, "metric": s.metric, "higher_is_better": METRICS.get(s.metric).higher_is_better,
              "group": s.group} for s in specs]
    cells = {model: {s.name: {"mean": 0.1 + k / scale, "sd": 0.0, "n": 2, "test_scores": [0.1 + k / scale] * 2,
                              "seeds": [1, 2]} for k, s in enumerate(specs)}
             for model, scale in (("m", 100), ("n", 200))}
    return {"tasks": tasks, "models": ["m", "n"], "cells": cells, "summary": summarize(tasks, cells)}


def test_each_metric_is_named_as_blues_tables_name_it_in_html_and_markdown(tmp_path):
    """Probe B4: the HTML header showed the registry's ids (ner_f1, micro_f1_positive, hoc_example_f1), the
    Markdown no metric at all. BLUE's README names them Pearson, F1, micro F1, example-based F1 and accuracy."""
    paths = write_report(blue_results(["medsts", "bc5cdr_disease", "ddi", "i2b2_2010", "hoc", "mednli"]),
                         tmp_path / "report")
    heads = dict(re.findall(r'<th class="task" data-column="([^"]+)"[^>]*>[^<]*<br><span class="metric">([^<]*)</span>',
                            paths["html"].read_text()))
    assert heads == {"MedSTS": "Pearson", "BC5CDR-disease": "F1", "DDI": "micro F1", "i2b2-2010": "micro F1",
                     "HoC": "example-based F1", "MedNLI": "accuracy"}
    assert ("Metrics: Pearson (MedSTS), F1 (BC5CDR-disease), micro F1 (DDI, i2b2-2010), example-based F1 (HoC), "
            "accuracy (MedNLI).") in paths["md"].read_text().splitlines()
    lower = make_results()  # a user's metric the project does not name: its id, and its direction
    assert "Metrics: Pearson (BIOSSES), accuracy (MedNLI), mae, lower is better (ErrTask)." in \
        render_markdown(build_table(lower))

    from orchestrator.core.results import METRIC_NAMES
    from orchestrator.finetune.metrics import METRICS

    assert set(METRIC_NAMES) == set(METRICS.names())  # a metric added to the registry gets its display name

def test_blues_tasks_keep_blues_order_and_a_total_over_fewer_says_so(tmp_path):
    """Probe B5: with ``sweep.tasks`` in another order the table followed it (ShARe/CLEFE after MedNLI), and a
    6-task mean under BLUE's column names read "Total is the macro average over all tasks"."""
    from orchestrator.core.config import read_yaml
    from orchestrator.finetune.spec import load_task

    stems = read_yaml(ROOT / "search_spaces" / "blue.yaml")["tasks"]
    blue = [load_task(stem).name for stem in stems]  # BLUE's order, as its search space lists the tasks
    given = ["jsts", "biosses", "chemprot_resplit", "bc5cdr_chemical", "ddi", "hoc", "mednli", "shareclefe"]
    results = blue_results(given)
    paths = write_report(results, tmp_path / "report", baseline="n")
    md = paths["md"].read_text()
    order = ["BIOSSES", "BC5CDR-chemical", "ShARe/CLEFE", "DDI", "HoC", "MedNLI", "JSTS", "ChemProt-resplit"]
    header = next(line for line in md.splitlines() if line.startswith("| Model"))
    assert header == "| Model | Total | Clinical | Biomedical | Other | " + " | ".join(order) + " |"
    html_columns = re.findall(r'<th class="task" data-column="([^"]+)"', paths["html"].read_text())
    assert html_columns == order + order  # the table and the paired differences
    assert [c["key"] for c in json.loads(paths["comparison"].read_text())["columns"] if c["kind"] == "task"] == order
    assert ("Total is the macro average over the 8 tasks shown; each group's score (clinical, biomedical, other) "
            "averages the tasks of that group. BLUE's Total averages its ten tasks; MedSTS, BC5CDR-disease, "
            "ChemProt, i2b2-2010 are not in this table, so its summary scores are not BLUE's.") in md
    table = build_table(results)  # the numbers are the document's
    assert table.cell("m", "total").mean == pytest.approx(sum(0.1 + k / 100 for k in range(8)) / 8)
    assert table.cell("m", "total").mean == results["summary"]["m"]["total"]

    full = write_report(blue_results(stems[::-1]), tmp_path / "full")["md"].read_text()
    assert next(line for line in full.splitlines() if line.startswith("| Model")) == \
        "| Model | Total | Clinical | Biomedical | " + " | ".join(blue) + " |"
    assert "Total is the macro average over all tasks;" in full and "not BLUE's" not in full

    from orchestrator.core.results import BLUE_TASKS

    assert list(BLUE_TASKS) == blue  # the report's order is the blue search space's

def test_markdown_cells():
    md = render_markdown(build_table(make_results()), curves="curves.png")
    scores, selection = md.split("## Settings selected on dev")
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in scores.splitlines() if line.startswith("| ") and not line.startswith("| Model")}
    assert set(rows) == {"base", "ampv", "simpt"}
    assert rows["ampv"][3] == "**90.0** (1.0)"
    assert rows["simpt"][3] == "<u>85.0</u> (1.0)"
    assert rows["base"][3] == "80.0 (2.0)"
    assert rows["ampv"][5] == "**20.0** (1.0)"  # ErrTask, lower is better
    assert "| base | learning_rate=5e-05, epochs=2; dev 81.0 |" in selection
    assert "![learning curves per task](curves.png)" in selection
    # one seed: the mean alone, as a summary score without a spread (probe D: it read "-27.3 (0.0)")
    one = make_results()
    for cell in one["cells"]["base"].values():
        cell.update(n=1, sd=0.0, test_scores=cell["test_scores"][:1], mean=cell["test_scores"][0])
    md = render_markdown(build_table(one))
    base = next(line for line in md.splitlines() if line.startswith("| base |"))
    assert "(" not in base, base
    assert "means (standard deviations) over random seeds" in md  # the other models have 3 seeds
    # every model with one seed: the note says so, and speaks of no standard deviation (session 47's display probe)
    for row in one["cells"].values():
        for cell in row.values():
            cell.update(n=1, sd=0.0, test_scores=cell["test_scores"][:1], mean=cell["test_scores"][0])
    md = render_markdown(build_table(one))
    assert "single-seed scores (one seed per setting: no standard deviation) at the setting selected on dev" in md
    assert "standard deviations" not in md


def test_markdown_shows_a_model_or_task_name_as_typed_never_as_html():
    """A security probe (session 45): a model named `<script>alert(1)</script>` went into blue_table.md as
    HTML, which Markdown viewers render (the HTML report escaped it)."""
    results = make_results()
    results["cells"]["<script>x</script>|b"] = results["cells"].pop("ampv")
    results["summary"]["<script>x</script>|b"] = results["summary"].pop("ampv")
    results["models"] = ["base", "<script>x</script>|b", "simpt"]
    results["tasks"][0]["name"] = "BIOSSES & <b>"
    for row in results["cells"].values():
        row["BIOSSES & <b>"] = row.pop("BIOSSES")
    results["cells"]["<script>x</script>|b"]["BIOSSES & <b>"]["cut"] = {"test": {"cut": 1, "of": 2}}  # in a note too
    md = render_markdown(build_table(results))
    assert "<script>" not in md and "<b>" not in md
    assert "BIOSSES &amp; &lt;b&gt; (&lt;script&gt;x&lt;/script&gt;\\|b: test 1 of 2)" in md
    assert "| &lt;script&gt;x&lt;/script&gt;\\|b |" in md and "BIOSSES &amp; &lt;b&gt;" in md


def test_a_task_name_with_a_pipe_keeps_every_markdown_table_whole():
    """An extension probe (session 48): a task named "Para|Pipe" was escaped in the scores table but not in the
    paired differences' and p-values' heads, which split there into one column more than their rows."""
    import re

    from orchestrator.report.compare import paired_differences
    from orchestrator.report.pages import comparison_markdown

    results = make_results()
    results["tasks"][0]["name"] = "Para|Pipe"
    for row in results["cells"].values():
        row["Para|Pipe"] = row.pop("BIOSSES")
    md = render_markdown(build_table(results)) + comparison_markdown(build_table(results),
                                                                     paired_differences(results, "base"))
    for table in re.findall(r"(?:^\|.*\|\n)+", md, flags=re.M):
        widths = {len(re.findall(r"(?<!\\)\|", line)) for line in table.splitlines()}
        assert len(widths) == 1, table
    assert md.count("Para\\|Pipe") >= 4  # the scores', selection's, differences' and p-values' heads
    assert "With 2 pairs" not in md  # 3 seeds
    for row in results["cells"].values():  # 2 seeds (an outputs probe, session 48): the interval is the 2 differences
        for cell in row.values():
            scores = cell["test_scores"][:2]
            cell.update(test_scores=scores, n=2, mean=sum(scores) / 2)
    two = comparison_markdown(build_table(results), paired_differences(results, "base"))
    assert "With 2 pairs the interval is the two differences themselves: it may exclude 0 beside a large p" in two


def test_no_clinical_task_means_no_clinical_column():
    results = make_results()
    results["tasks"] = [t for t in results["tasks"] if t["group"] == "biomedical"]
    for row in results["cells"].values():
        row.pop("MedNLI")
    keys = [c.key for c in build_table(results).columns]
    assert "clinical" not in keys and keys[:2] == ["total", "biomedical"]


def test_a_group_beyond_blue_gets_its_total_column(tmp_path):
    """Issue 16: a task group other than clinical/biomedical (a declared name, or 'other') is a column of its
    own beside Total, averaging that group's tasks, in the Markdown, the HTML and the comparison; the notes
    name it. A task YAML declares such a group; a reserved name is refused."""
    from orchestrator.core.config import from_dict
    from orchestrator.core.errors import ConfigError
    from orchestrator.finetune.spec import TaskSpec, load_task

    results = make_results()
    results["tasks"] += [{"name": "JSTS", "metric": "pearson", "higher_is_better": True, "group": "japanese"},
                         {"name": "XNLI-de", "metric": "accuracy", "higher_is_better": True, "group": "other"}]
    extra = {"base": (0.60, 0.50), "ampv": (0.70, 0.40), "simpt": (0.65, 0.45)}
    for model, (jsts, xnli) in extra.items():
        cells = results["cells"][model]
        cells["JSTS"] = {"mean": jsts, "sd": 0.01, "n": 3, "test_scores": [jsts - 0.01, jsts, jsts + 0.01]}
        cells["XNLI-de"] = {"mean": xnli, "sd": 0.01, "n": 3, "test_scores": [xnli - 0.01, xnli, xnli + 0.01]}
    results["summary"] = summarize(results["tasks"], results["cells"])
    table = build_table(results)
    assert [c.key for c in table.columns][:5] == ["total", "clinical", "biomedical", "japanese", "other"]
    assert table.cell("ampv", "japanese").mean == pytest.approx(0.70) and table.cell("ampv", "japanese").rank == 1
    assert table.cell("base", "other").mean == pytest.approx(0.50) and table.cell("base", "other").rank == 1
    paths = write_report(results, tmp_path / "report", baseline="base")
    md = paths["md"].read_text()
    header = next(line for line in md.splitlines() if line.startswith("| Model"))
    assert header.startswith("| Model | Total | Clinical | Biomedical | Japanese | Other | BIOSSES")
    row = next(line for line in md.splitlines() if line.startswith("| ampv"))
    assert row.split(" | ")[4].startswith("**70.0") and row.split(" | ")[5].startswith("40.0")
    assert "(clinical, biomedical, japanese, other) averages" in md
    assert 'data-column="japanese"' in paths["html"].read_text()
    comparison = json.loads(paths["comparison"].read_text())
    assert {"japanese", "other"} <= {c["key"] for c in comparison["columns"]}

    task = tmp_path / "jsts.yaml"
    task.write_text("include: _sentence_pair_regression.yaml\nname: JSTS\ngroup: japanese\ndir: jsts\n",
                    encoding="utf-8")
    assert load_task(str(task)).group == "japanese"
    base = {"name": "T", "family": "sts", "metric": "pearson", "files": {"train": "a", "dev": "b", "test": "c"}}
    with pytest.raises(ConfigError, match="group 'total'"):
        from_dict(TaskSpec, {**base, "group": "total"})
    with pytest.raises(ConfigError, match="lower-case name"):
        from_dict(TaskSpec, {**base, "group": "Japanese Tasks"})


@pytest.mark.parametrize("mutate, message", [
    (lambda r: r.pop("cells"), "missing key 'cells'"),
    (lambda r: r["tasks"][0].update(group=""), "has group ''"),
    (lambda r: r["cells"]["base"]["BIOSSES"].update(mean="high"), "BIOSSES"),
    (lambda r: r["cells"].update(ghost={}), "'ghost' not listed"),
    (lambda r: r["cells"]["base"].update(Unknown={"mean": 1.0}), "'Unknown' not listed"),
])
def test_bad_results_name_source_and_place(mutate, message):
    results = make_results()
    mutate(results)
    with pytest.raises(InputError, match=re.escape(message)) as err:
        build_table(results, source="runs/x/sweep/results.json")
    assert "runs/x/sweep/results.json" in str(err.value)


def test_write_report_outputs(tmp_path):
    out = tmp_path / "report"
    paths = write_report(make_results(), out)
    assert {"md", "html", "png", "curves", "results", "manifest"} <= set(paths)
    for kind in ("png", "curves"):
        assert paths[kind].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    html_text = paths["html"].read_text()
    assert "<link" not in html_text and "<script" not in html_text and "http://" not in html_text
    assert "data:image/png;base64," in html_text  # curves embedded: the page is self-contained
    assert read_manifest(out)["stage"] == "report"
    assert json.loads(paths["results"].read_text())["models"] == ["base", "ampv", "simpt"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dirs left behind


def test_failed_report_leaves_previous_output(tmp_path):
    out = tmp_path / "report"
    write_report(make_results(), out)
    before = (out / "blue_table.md").read_text()
    broken = make_results()
    broken["cells"]["base"]["BIOSSES"]["mean"] = "high"
    with pytest.raises(InputError):
        write_report(broken, out)
    assert (out / "blue_table.md").read_text() == before


# ---------------------------------------------------------------------------------------------
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

# Appended to a copy of the page: records what the browser computed for each score cell.
PROBE = """<script>
for (const td of document.querySelectorAll('td[data-column]')) {
  const strong = td.querySelector('b, u') || td;
  const style = getComputedStyle(strong);
  td.setAttribute('data-weight', style.fontWeight);
  td.setAttribute('data-decoration', style.textDecorationLine);
  td.setAttribute('data-text', td.innerText);
}
document.body.setAttribute('data-probed', 'yes');
</script>"""


class CellCollector(HTMLParser):
    def __init__(self):
        super().__init__()
        self.cells: dict[tuple[str, str], dict[str, str]] = {}
        self.probed = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "body" and a.get("data-probed") == "yes":
            self.probed = True
        if tag == "td" and "data-column" in a:
            self.cells[(a["data-model"], a["data-column"])] = a


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (scripts/setup.sh --test installs it)")
def test_html_rendered_by_headless_chromium(tmp_path):
    paths = write_report(make_results(), tmp_path / "report")
    page = tmp_path / "probe.html"
    page.write_text(paths["html"].read_text().replace("</body>", PROBE + "</body>"))
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
           f"--user-data-dir={tmp_path / 'chrome-profile'}", "--dump-dom", page.as_uri()]
    dom = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True).stdout
    parser = CellCollector()
    parser.feed(dom)
    assert parser.probed, "the probe script did not run"
    cells = parser.cells
    assert len(cells) == 3 * 6  # a row per model, a column per task + total/clinical/biomedical

    def shown(model, column):
        c = cells[(model, column)]
        bold = int(c["data-weight"]) >= 600
        underlined = "underline" in c["data-decoration"]
        return c["data-text"], bold, underlined

    assert shown("ampv", "BIOSSES") == ("90.0 (1.0)", True, False)
    assert shown("simpt", "BIOSSES") == ("85.0 (1.0)", False, True)
    assert shown("base", "BIOSSES") == ("80.0 (2.0)", False, False)
    assert shown("ampv", "ErrTask")[1:] == (True, False)
    assert shown("base", "ErrTask")[1:] == (False, False)
    assert shown("simpt", "MedNLI")[1:] == (True, False)
    assert shown("base", "MedNLI")[1:] == (False, True)
    bold_per_column = {}
    for (_, column), c in cells.items():
        bold_per_column[column] = bold_per_column.get(column, 0) + (int(c["data-weight"]) >= 600)
    assert all(n >= 1 for n in bold_per_column.values())


# ---------------------------------------------------------------------------------------------
def log_sweep(run_dir: Path, results: dict) -> str:
    """Log ``results`` as a finished sweep with the sweep's own writer (orchestrator.track.sweep)."""
    from orchestrator.track import TrackingConfig
    from orchestrator.track.sweep import log_sweep as log

    sweep_dir = run_dir / "sweep"
    sweep_dir.mkdir(parents=True, exist_ok=True)
    (sweep_dir / "results.json").write_text(json.dumps(results))
    records = [{"trial": {"model_name": m, "learning_rate": 5e-5, "seed": 1}, "task": t, "trial_id": f"{m}-{t}-s1",
                "epochs": [{"epoch": 1, "dev": 0.5, "test": 0.4}], "seconds": 1.0}
               for m in results["models"] for t in results["cells"][m]]
    return log(TrackingConfig(), run_dir, name="demo", config={"sweep": {"seeds": [1]}}, results=results,
               records=records, model_tags={}, artifacts=[sweep_dir / "results.json"])


def test_report_job_rebuilds_from_mlflow_alone(tmp_path):
    """The artifact and the metric fallback both give back the document the sweep logged: cells,
    curves, selections, and each task's group and direction from its tags (no re-coded task list)."""
    from mlflow import MlflowClient

    from orchestrator.report.mlflow_results import load_results, results_from_children
    from orchestrator.track import local_uri

    run_dir = tmp_path / "runs" / "demo"
    run_dir.mkdir(parents=True)
    results = make_results()
    results["summary"] = summarize(results["tasks"], results["cells"])
    results["cells"]["base"]["MedNLI"]["dev_tied"] = True  # every setting scored alike on dev
    results["cells"]["ampv"]["BIOSSES"]["edge"] = {"epochs": "most", "learning_rate": "largest"}  # session 58
    for model in results["models"]:  # a test split cut by sweep.max_eval_examples
        results["cells"][model]["BIOSSES"]["test_sample"] = 300
    # inputs cut at max_seq_length (session 54: counted since session 53, said nowhere)
    results["cells"]["ampv"]["MedNLI"]["cut"] = {"train": {"cut": 1200, "of": 11232}, "test": {"cut": 3, "of": 1422}}
    results["cells"]["base"]["MedNLI"]["cut"] = {"dev": {"cut": 2, "of": 1395}}
    uri = local_uri(run_dir)
    pid = log_sweep(run_dir, results)
    loaded = load_results(uri)
    assert loaded.run_id == pid and loaded.source == "artifact" and loaded.results == results

    client = MlflowClient(uri)
    rebuilt = results_from_children(client, client.get_run(pid))  # the fallback: metrics, no artifact
    assert sorted(rebuilt["models"]) == sorted(results["models"])  # order: as logged (track sorts by name)
    for model in results["models"]:
        for task, want in results["cells"][model].items():
            got = rebuilt["cells"][model][task]
            assert got["mean"] == pytest.approx(want["mean"]) and got["sd"] == pytest.approx(want["sd"])
            assert list(got["selected"].items()) == list(want["selected"].items()) and got["n"] == want["n"]
            assert got.get("dev_tied") == want.get("dev_tied") and got.get("test_sample") == want.get("test_sample")
            assert got.get("cut") == want.get("cut") and got.get("edge") == want.get("edge")
            # per seed too, so a rebuilt report has its paired differences (they read "- (n=0)": session 47)
            assert got["test_scores"] == pytest.approx(want["test_scores"]) and got["seeds"] == want.get("seeds", [])
            assert [(p["epoch"], p["dev"]) for p in got["curve"]] == [(p["epoch"], p["dev"]) for p in want["curve"]]
        for key in ("total", "clinical", "biomedical"):
            assert rebuilt["summary"][model][key] == pytest.approx(results["summary"][model][key])
    assert {t["name"]: (t["group"], t["higher_is_better"]) for t in rebuilt["tasks"]} == {
        t["name"]: (t["group"], t["higher_is_better"]) for t in results["tasks"]}
    from orchestrator.report.compare import paired_differences

    rows = paired_differences(rebuilt, "base")["rows"]
    assert rows["ampv"]["BIOSSES"]["n"] == 3 and rows["ampv"]["total"]["n"] == 3

    job = report_job("--run-dir", str(run_dir))
    assert job.returncode == 0, job.stderr[-3000:]
    md = (run_dir / "report" / "blue_table.md").read_text()
    assert "**90.0**" in md and "<u>85.0</u>" in md
    tied = [line for line in md.splitlines() if "(a tie: every setting)" in line]
    assert len(tied) == 1 and tied[0].startswith("| base |") and "\nA tie: every setting scored the same on dev" in md
    assert "A tie: every setting" in (run_dir / "report" / "blue_table.html").read_text()
    # a selection at an end of its grid: in its cell (in the sweep's axis order), a note, and the table's count
    edge = [line for line in md.splitlines() if "(at the grid's end:" in line]
    assert len(edge) == 1 and edge[0].startswith("| ampv |")
    assert "(at the grid's end: largest learning_rate, most epochs)" in edge[0]
    cells = sum(len(c) for c in results["cells"].values())
    for text in (md, (run_dir / "report" / "blue_table.html").read_text()):
        assert f"In 1 of {cells} cells the setting selected on dev is at an end of its grid" in text
        assert "At the grid's end: the setting selected" in html.unescape(text)
    said = "BIOSSES: the test scores are on a seeded sample of 300 test examples, not on the whole test set"
    assert said in md and said in (run_dir / "report" / "blue_table.html").read_text()
    assert "MedNLI: the test scores" not in md
    said = ("Inputs longer than max_seq_length word pieces were cut to it (the words past the cut unread; an NER word "
            "there predicted O): MedNLI (base: dev 2 of 1,395; ampv: train 1,200 of 11,232, test 3 of 1,422).")
    assert said in md and said in (run_dir / "report" / "blue_table.html").read_text()
    assert md.count("of 1,395") == 1 and "simpt:" not in md  # a model and a task with no cut input: nothing
    assert (run_dir / "report" / "curves.png").is_file()


def test_a_selection_lists_its_keys_in_one_order_whatever_order_its_document_has():
    """Session 47's and 49's probes: a report rebuilt by jobs/report.py read "epochs=20, learning_rate=0.003"
    where the job's said "learning_rate=0.003, epochs=20" (results.json keeps its keys sorted by name)."""
    results = make_results()
    for row in results["cells"].values():
        for cell in row.values():
            cell["selected"] = {"epochs": 2, "batch_size": 16, "learning_rate": 5e-5}
    cell = build_table(results).cell("base", "BIOSSES")
    assert cell.selected == (("learning_rate", 5e-5), ("epochs", 2), ("batch_size", 16))
    assert "| learning_rate=5e-05, epochs=2, batch_size=16; dev " in render_markdown(build_table(results))


def test_a_report_of_a_run_directory_reads_the_store_mlflow_tracking_uri_names(tmp_path, monkeypatch):
    """A probe (session 49): the job logged to the server $MLFLOW_TRACKING_URI named, and jobs/report.py --run-dir
    in the same shell read the run directory's own SQLite file, whose older sweep had the opposite conclusion."""
    from orchestrator.report.mlflow_results import load_results
    from orchestrator.track import local_uri
    from orchestrator.workflows.report import ReportConfig

    run_dir = tmp_path / "runs" / "demo"
    run_dir.mkdir(parents=True)
    older = make_results()
    older["summary"] = summarize(older["tasks"], older["cells"])
    log_sweep(run_dir, older)  # an earlier run, into the run directory's own store
    newer = make_results()
    del newer["cells"]["simpt"]
    newer["models"], newer["summary"] = ["base", "ampv"], summarize(newer["tasks"], newer["cells"])
    server = f"sqlite:///{tmp_path / 'server.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server)
    log_sweep(run_dir, newer)  # the job reads the variable: the newer sweep is in that store
    cfg = ReportConfig(run_dir=str(run_dir))
    assert cfg.resolved_uri() == server and cfg.sweep_of() == str(run_dir)
    assert load_results(cfg.resolved_uri(), run_dir=cfg.sweep_of()).results["models"] == ["base", "ampv"]
    own = ReportConfig(run_dir=str(run_dir), tracking_uri=local_uri(run_dir))  # the run directory's store, named
    assert load_results(own.resolved_uri(), run_dir=own.sweep_of()).results["models"] == ["base", "ampv", "simpt"]


def test_metric_fallback_refuses_runs_without_group_and_direction(tmp_path):
    """A (model, task) run without the group / higher_is_better tags is refused by name, not guessed."""
    from mlflow import MlflowClient

    from orchestrator.report.mlflow_results import results_from_children
    from orchestrator.track import local_uri
    from orchestrator.track import schema as S

    uri = local_uri(tmp_path)
    client = MlflowClient(uri)
    exp = client.create_experiment("bioptorch")
    pid = client.create_run(exp, tags={S.KIND: S.KIND_SWEEP}).info.run_id
    cid = client.create_run(exp, tags={S.PARENT: pid, S.KIND: S.KIND_MODEL_TASK, S.MODEL: "m", S.TASK: "T"})
    client.log_metric(cid.info.run_id, S.TEST_MEAN, 0.5)
    with pytest.raises(InputError, match=r"lacks tags \['group', 'higher_is_better'\]"):
        results_from_children(client, client.get_run(pid))


def report_job(*args: str) -> subprocess.CompletedProcess:
    """Run the real entry script, as a user would."""
    return subprocess.run([sys.executable, str(ROOT / "jobs" / "report.py"), *args], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)


def test_report_job_errors(tmp_path):
    missing = report_job("--run-dir", str(tmp_path / "nowhere"), "--dry-run")
    assert missing.returncode == 2 and "mlflow.db" in missing.stderr
    bad = tmp_path / "results.json"
    bad.write_text('{"tasks": [}')
    broken = report_job(f"results_json={bad}", f"out_dir={tmp_path / 'r'}")
    assert broken.returncode == 2 and f"{bad}:1" in broken.stderr
    dry = report_job(f"results_json={bad}", f"out_dir={tmp_path / 'r'}", "--dry-run")  # issue 12: said "valid"
    assert dry.returncode == 2 and f"{bad}:1" in dry.stderr
    assert report_job().returncode == 2  # nothing to read from


def test_an_unknown_run_id_is_bad_input_not_a_bug(tmp_path):
    """Probe B item 9: `--run-id deadbeef` crashed as "unexpected MlflowException (a bug)", exit 1, in the
    dry run too; an unknown --experiment already got a one-line error."""
    run_dir = tmp_path / "runs" / "demo"
    run_dir.mkdir(parents=True)
    log_sweep(run_dir, make_results())
    out = tmp_path / "out"
    for dry in (("--dry-run",), ()):
        res = report_job("--run-dir", str(run_dir), "--out-dir", str(out), "--run-id", "deadbeef", *dry)
        assert res.returncode == 2, res.stderr[-3000:]
        assert res.stderr == (f"error: run_id 'deadbeef' not found at sqlite:///{run_dir}/mlflow.db (leave run_id "
                              "empty for the newest sweep run of experiment 'bioptorch' there)\n")
    assert not out.exists()
    assert report_job("--run-dir", str(run_dir), "--out-dir", str(out), "--dry-run").returncode == 0  # the store


def test_report_dry_run_refuses_badly_typed_results(tmp_path):
    """Probe: a summary row that is a list crashed the dry run; a numeric metric name passed it and
    then crashed the real run in html.escape."""
    for name, mutate, message in (
            ("summary", lambda r: r["summary"].update(base=[1, 2]), "summary['base'] is [1, 2]"),
            ("metric", lambda r: r["tasks"][0].update(metric=5), "tasks[0] (BIOSSES).metric is 5")):
        results = make_results()
        mutate(results)
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(results))
        dry = report_job(f"results_json={path}", f"out_dir={tmp_path / 'r'}", "--dry-run")
        assert dry.returncode == 2 and f"{path}: {message}" in dry.stderr and "unexpected" not in dry.stderr
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("content, message", [
    (b"", "empty, not an MLflow store"),
    (b"a text file\n", "not an MLflow SQLite store (file is not a database)"),
])
def test_report_refuses_a_store_that_is_not_mlflow_and_never_writes_it(tmp_path, content, message):
    """Probe: a text mlflow.db crashed with a multi-line SQL dump, and the dry run migrated an empty
    one into a 1 MB MLflow store: the store is checked read-only, by the dry run and the real run."""
    from orchestrator.report.mlflow_results import load_results
    from orchestrator.track import local_uri

    store = tmp_path / "mlflow.db"
    store.write_bytes(content)
    dry = report_job("--run-dir", str(tmp_path), "--dry-run")
    assert dry.returncode == 2 and f"{store}: {message}" in dry.stderr
    assert "unexpected" not in dry.stderr and "[SQL:" not in dry.stderr and len(dry.stderr.splitlines()) == 1
    with pytest.raises(InputError, match=re.escape(message)):  # the real run reads it the same way
        load_results(local_uri(tmp_path))
    assert store.read_bytes() == content and [p.name for p in tmp_path.iterdir()] == ["mlflow.db"]


def test_report_never_creates_a_missing_store(tmp_path):
    """The real run on a run directory without mlflow.db made a new 1 MB store there before failing."""
    from orchestrator.report.mlflow_results import load_results
    from orchestrator.track import local_uri

    with pytest.raises(InputError, match="mlflow.db: MLflow store not found"):
        load_results(local_uri(tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_report_never_replaces_a_folder_it_did_not_write(tmp_path):
    """Issue 12: `jobs/report.py out_dir=<a folder with other files>` wiped that folder."""
    good = tmp_path / "results.json"
    good.write_text(json.dumps(make_results()))
    mine = tmp_path / "papers"
    mine.mkdir()
    (mine / "draft.tex").write_text("my paper")
    for dry in ((), ("--dry-run",)):
        res = report_job(f"results_json={good}", f"out_dir={mine}", *dry)
        assert res.returncode == 2 and "not an output of this project" in res.stderr
    assert [p.name for p in mine.iterdir()] == ["draft.tex"] and (mine / "draft.tex").read_text() == "my paper"
    assert report_job(f"results_json={good}", f"out_dir={tmp_path / 'report'}").returncode == 0
    assert report_job(f"results_json={good}", f"out_dir={tmp_path / 'report'}").returncode == 0  # its own: replaced


def test_a_report_of_one_run_directory_finds_its_own_sweep_in_a_store_runs_share(tmp_path, monkeypatch):
    """A concurrency probe (session 46): two jobs logging to one MLflow store (tracking.tracking_uri), then
    `jobs/report.py --run-dir x --tracking-uri <store>` reported y's newer sweep under x's name (Total 21.6 against
    x's own 17.9), exit 0. A sweep run now carries its run directories (one sweep logged the same from two shares
    its run), and a report of a run directory in a store that is not its own reads that directory's sweep."""
    from orchestrator.core.errors import OrchestratorError
    from orchestrator.report.mlflow_results import load_results
    from orchestrator.track import TrackingConfig
    from orchestrator.track.sweep import log_sweep as log
    from orchestrator.workflows.report import ReportConfig

    shared = f"sqlite:///{tmp_path / 'shared.db'}"

    def logged(name: str, seeds: list[int]) -> str:
        run_dir = tmp_path / "runs" / name
        (run_dir / "sweep").mkdir(parents=True)
        results = make_results()
        results["summary"] = summarize(results["tasks"], results["cells"])
        (run_dir / "sweep" / "results.json").write_text(json.dumps(results))
        return log(TrackingConfig(tracking_uri=shared), run_dir, name=name, config={"sweep": {"seeds": seeds}},
                   results=results, records=[], model_tags={}, artifacts=[run_dir / "sweep" / "results.json"])

    x, y = logged("x", [1]), logged("y", [2])
    assert x != y and load_results(shared).run_id == y  # the newest, as before, without a run directory
    assert load_results(shared, run_dir=tmp_path / "runs" / "x").run_id == x
    assert logged("z", [1]) == x  # the same sweep from another run directory: one sweep run, found from both
    assert load_results(shared, run_dir=tmp_path / "runs" / "z").run_id == x
    with pytest.raises(OrchestratorError, match=r"has no sweep of the run directory .*/runs/w; its sweeps are of"):
        load_results(shared, run_dir=tmp_path / "runs" / "w")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # which the logging above exports (MLflow's own)
    assert ReportConfig(run_dir=str(tmp_path / "runs" / "x"), tracking_uri=shared).sweep_of() == \
        str(tmp_path / "runs" / "x")
    assert ReportConfig(run_dir=str(tmp_path / "runs" / "x")).sweep_of() is None  # its own store: its sweeps


def test_names_are_drawn_and_written_as_typed():
    """A compare model's name is the user's text: `pub$x$` drew as mathtext ("pubx") in the PNGs, and the source
    analysis's Markdown tables left `<` and `&` for a viewer to read as HTML (the other tables escape them)."""
    from matplotlib.text import Text

    from orchestrator.report.figures import plain_text
    from orchestrator.report.pages import md_escape

    assert Text()._preprocess_math(plain_text("pub$x$|y")) == ("pub$x$|y", False)  # drawn as typed, not math
    assert Text()._preprocess_math("pub$x$|y")[1] is True  # what it was
    assert md_escape("<b>&|") == "&lt;b&gt;&amp;\\|"


def test_the_dry_run_of_a_moved_run_directory_reads_its_artifacts_where_the_run_does(tmp_path):
    """A helper noticed (session 49): ``jobs/report.py --run-dir <moved> --dry-run`` said "(from its metrics)": it
    read the store's old artifact location, gone, where the report itself reads the artifacts beside the store."""
    import os
    import shutil

    old, new = tmp_path / "runs" / "demo", tmp_path / "elsewhere" / "demo"
    old.mkdir(parents=True)
    results = make_results()
    results["summary"] = summarize(results["tasks"], results["cells"])
    log_sweep(old, results)
    new.parent.mkdir()
    shutil.move(old, new)
    before = (new / "mlflow.db").read_bytes()
    os.environ.pop("MLFLOW_TRACKING_URI", None)  # (logging exported the old store's URI to the job we start)
    plan = report_job("--run-dir", str(new), "--dry-run")
    assert plan.returncode == 0, plan.stderr[-3000:]
    assert "(from its artifact)" in plan.stdout and (new / "mlflow.db").read_bytes() == before and not old.exists()
