"""The report as text: Markdown and HTML of the BLUE table, the paired differences, seed 001's NER
before/after tables and seed 004's source analysis.

    md = render_markdown(build_table(results), comparison=comparison_document(results, "base"))
    page = render_html(table, curves_png=base64_png, comparison=doc)

Pure: each function formats a model it is given (``orchestrator.report.table.BlueTable``, the
documents of ``orchestrator.report.compare`` and ``orchestrator.report.sources``) and computes no
number. Markdown marks the best cell ``**bold**`` and the second ``<u>underlined</u>``, as the
seed's tables do; HTML cells carry ``data-model``, ``data-column`` and ``data-rank`` so tools and
tests can find them. ``orchestrator.report.blue_table.write_report`` writes the files.
"""
from __future__ import annotations

import html
from collections.abc import Callable, Sequence

from orchestrator.core.results import BLUE_TASKS, SEED_GROUPS, metric_name
from orchestrator.report.compare import p_text
from orchestrator.report.figures import SOURCE_FIGURES
from orchestrator.report.table import DAGGER, BlueTable, Cell

MINUS = "\u2212"
SIGNIFICANT = "*"
NER_TITLE = "NER before / after (seed 001, Tables 3 and 4)"
SOURCES_TITLE = "Source similarity vs gain (seed 004)"


# ---------------------------------------------------------------------------------------------
# The BLUE table
def render_markdown(table: BlueTable, title: str = "BLUE results", curves: str | None = None,
                    comparison: dict | None = None, notes: Sequence[str] = (), sections: Sequence[str] = ()) -> str:
    """GitHub Markdown: best ``**bold**``, second ``<u>underlined</u>`` as in the seed's tables;
    the paired differences after the table when ``comparison`` (``compare.comparison_document``) is given;
    ``sections`` (Markdown, e.g. an experiment's retrieval tables) before the learning curves."""
    head = ["Model"] + [md_escape(c.label) for c in table.columns]
    rule = "|" + "|".join(["---"] + [":---:"] * len(table.columns)) + "|"
    lines = [f"# {md_escape(title)}", "", "| " + " | ".join(head) + " |", rule]
    for model in table.models:
        row = [md_escape(model)]
        for col in table.columns:
            cell = table.cell(model, col.key)
            mean = table.text(cell.mean) + (DAGGER if cell.partial else "")
            if cell.rank == 1:
                mean = f"**{mean}**"
            elif cell.rank == 2:
                mean = f"<u>{mean}</u>"
            row.append(mean if cell.sd is None else f"{mean} ({table.text(cell.sd)})")
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", _metrics_line(table), "", _notes(table, md_escape)] + [f"\n**{md_escape(note)}**" for note in notes]
    if comparison:
        lines += ["", comparison_markdown(table, comparison).rstrip("\n")]
    tasks = [c for c in table.columns if c.kind == "task"]
    if any(table.cell(m, c.key).selected for m in table.models for c in tasks):
        lines += ["", "## Settings selected on dev", "",
                  "| Model | " + " | ".join(md_escape(c.label) for c in tasks) + " |", "|---|" + "---|" * len(tasks)]
        for model in table.models:
            lines.append(f"| {md_escape(model)} | " + " | ".join(_selection_text(table, table.cell(model, c.key))
                                                               for c in tasks) + " |")
        lines += [text for note in _selection_notes(table) for text in ("", note)]
    lines += [text for section in sections for text in ("", section.rstrip("\n"))]
    if curves:
        lines += ["", "## Learning curves", "", f"![learning curves per task]({curves})"]
    return "\n".join(lines) + "\n"


CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 2em; color: #222; }
table.blue { border-collapse: collapse; font-size: 14px; }
table.blue th, table.blue td { padding: 4px 10px; text-align: center; border-bottom: 1px solid #ddd; }
table.blue thead th { border-bottom: 2px solid #333; vertical-align: bottom; }
table.blue th.model, table.blue td.model { text-align: left; white-space: nowrap; }
table.blue th.summary, table.blue td.summary { background: #f6f6f6; }
td b { font-weight: bold; }
td u { text-decoration: underline; }
.metric { font-weight: normal; font-size: 11px; color: #666; }
p.notes { font-size: 12px; color: #555; max-width: 60em; }
img { max-width: 100%; height: auto; }
"""


def render_html(table: BlueTable, title: str = "BLUE results", curves_png: str | None = None,
                comparison: dict | None = None, notes: Sequence[str] = (),
                source_figures: dict[str, str] | None = None, sections: Sequence[str] = ()) -> str:
    """A self-contained page (inline CSS, no scripts, no external assets); ``sections`` are HTML
    fragments placed before the learning curves.

    Each score cell carries ``data-model``, ``data-column`` and ``data-rank`` so tools and
    tests can find it; the visible emphasis is ``<b>`` (best) and ``<u>`` (second best).
    """
    esc = html.escape
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">', f"<title>{esc(title)}</title>",
           f"<style>{CSS}</style></head><body>", f"<h1>{esc(title)}</h1>", table_html(table, notes)]
    if comparison:
        out.append(comparison_html(table, comparison, source_figures))
    tasks = [c for c in table.columns if c.kind == "task"]
    if any(table.cell(m, c.key).selected for m in table.models for c in tasks):
        out.append(selection_html(table))
    out.extend(sections)
    if curves_png:
        out.append(f'<h2>Learning curves</h2><img alt="learning curves" src="data:image/png;base64,{curves_png}">')
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def table_html(table: BlueTable, notes: Sequence[str] = ()) -> str:
    """The table itself (``id="blue-table"``), its notes and ``notes`` in bold: a fragment of a page
    (``render_html``, the experiment page of ``dashboards/``) that ``CSS`` styles."""
    esc = html.escape
    out = ['<table class="blue" id="blue-table"><thead><tr><th class="model">Model</th>']
    for col in table.columns:
        arrow = "" if col.higher_is_better else " (lower is better)"
        metric = f'<br><span class="metric">{esc(metric_name(col.metric))}{arrow}</span>' if col.metric else ""
        group = f' data-group="{esc(col.group)}"' if col.group else ""
        out.append(f'<th class="{col.kind}" data-column="{esc(col.key)}"{group}>{esc(col.label)}{metric}</th>')
    out.append("</tr></thead><tbody>")
    for model in table.models:
        out.append(f'<tr data-model="{esc(model)}"><td class="model">{esc(model)}</td>')
        for col in table.columns:
            cell = table.cell(model, col.key)
            mean = esc(table.text(cell.mean) + (DAGGER if cell.partial else ""))
            if cell.rank == 1:
                mean = f"<b>{mean}</b>"
            elif cell.rank == 2:
                mean = f"<u>{mean}</u>"
            sd = "" if cell.sd is None else f" ({esc(table.text(cell.sd))})"
            rank = "" if cell.rank is None else str(cell.rank)
            title_attr = f' title="n={cell.n}"' if cell.n else ""
            out.append(f'<td class="{col.kind}" data-model="{esc(model)}" data-column="{esc(col.key)}" '
                       f'data-rank="{rank}"{title_attr}>{mean}{sd}</td>')
        out.append("</tr>")
    out.append("</tbody></table>")
    out.append(f'<p class="notes">{esc(_notes(table))}</p>')
    out.extend(f'<p class="notes failed"><strong>{esc(note)}</strong></p>' for note in notes)
    return "\n".join(out)


def selection_html(table: BlueTable) -> str:
    """"Settings selected on dev": per model and task the chosen setting and its dev score (a fragment)."""
    esc = html.escape
    tasks = [c for c in table.columns if c.kind == "task"]
    out = ['<h2>Settings selected on dev</h2><table class="blue" id="selection"><thead><tr>'
           '<th class="model">Model</th>' + "".join(f"<th>{esc(c.label)}</th>" for c in tasks)
           + "</tr></thead><tbody>"]
    for model in table.models:
        out.append(f'<tr><td class="model">{esc(model)}</td>' + "".join(
            f"<td>{esc(_selection_text(table, table.cell(model, c.key)))}</td>" for c in tasks) + "</tr>")
    out.append("</tbody></table>")
    out += [f'<p class="notes">{esc(note)}</p>' for note in _selection_notes(table)]
    return "\n".join(out)


def _selection_notes(table: BlueTable) -> list[str]:
    """What "a tie" and "at the grid's end" in the selection table mean, where a cell has one."""
    notes = []
    if any(cell.dev_tied for cell in table.cells.values()):
        notes.append("A tie: every setting scored the same on dev (every one perfect on a small dev split, a dev "
                     "split whose gold scores are all equal, a model that predicts one value), so dev chose nothing "
                     "and the tie-break did (the fewest epochs, then the smallest learning rate).")
    if _edge_cells(table):
        notes.append("At the grid's end: the setting selected on dev is the first or the last value of a grid axis of "
                     "three or more values, so a better setting may lie beyond the grid and the score may understate "
                     "the model (the more cells at an end, the more a comparison depends on the grid); widen that "
                     "axis (sweep.learning_rates, sweep.epochs, sweep.reinit_layers, the search space's batch_size) "
                     "to tell.")
    return notes


def _edge_cells(table: BlueTable) -> list[tuple[str, str]]:
    """(model, task) of the task cells whose selection is at an end of its grid (``sweep.selection.grid_edges``)."""
    return [(m, c.key) for c in table.columns if c.kind == "task" for m in table.models if table.cell(m, c.key).edge]


def _selection_text(table: BlueTable, cell: Cell) -> str:
    """'learning_rate=5e-05, epochs=3; dev 85.0' for one cell of the selection table."""
    if not cell.selected:
        return "\u2013"
    text = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in cell.selected)
    text = text if cell.dev_mean is None else f"{text}; dev {table.text(cell.dev_mean)}"
    if cell.edge:  # the best setting may lie beyond the grid (the notes say)
        text += " (at the grid's end: " + ", ".join(f"{word} {axis}" for axis, word in cell.edge) + ")"
    # every setting scored alike on dev: the tie-break chose (fewest epochs, smallest learning rate)
    return f"{text} (a tie: every setting)" if cell.dev_tied else text


def _metrics_line(table: BlueTable) -> str:
    """Markdown's line of each task's metric as BLUE's tables name it ("Metrics: Pearson (MedSTS, BIOSSES), F1
    (...)"): its one header row holds the task names, where HTML puts the metric under each."""
    tasks: dict[str, list[str]] = {}
    for col in table.columns:
        if col.kind == "task" and col.metric:
            name = metric_name(col.metric) + ("" if col.higher_is_better else ", lower is better")
            tasks.setdefault(name, []).append(col.label)
    if not tasks:
        return ""
    return "Metrics: " + ", ".join(f"{md_escape(name)} ({', '.join(map(md_escape, labels))})"
                                   for name, labels in tasks.items()) + "."


def _notes(table: BlueTable, name: Callable[[str], str] = str) -> str:
    """The table's notes; ``name`` writes a model's or task's name in them (Markdown: escaped, as typed)."""
    scale = "" if table.scale == 1 else f" Scores x {table.scale:g}."
    partial = ""
    if any(c.partial for c in table.cells.values()):
        partial = (f" {DAGGER} averages only the tasks that model was fine-tuned on (e.g. an augmented row has "
                   "NER tasks only): it is not comparable with the full scores and is not ranked.")
    groups = [c.key for c in table.columns if c.kind == "summary" and c.key != "total"]
    tasks = {c.key for c in table.columns if c.kind == "task"}
    lower = [c.label for c in table.columns if c.kind == "task" and not c.higher_is_better]
    # over other tasks than BLUE's ten the Total is not BLUE's: the caption counts them (probe B5: a 6-task
    # mean read "the macro average over all tasks" under BLUE's column names)
    shown = "all tasks" if tasks == set(BLUE_TASKS) else f"the {len(tasks)} task{'s' * (len(tasks) > 1)} shown"
    averaged = (f"{shown} but {', '.join(lower)} (lower is better: averaged with the others it would rank the worse "
                "model first)" if lower else shown)
    among = " among those" if lower else ""
    missing = [name for name in BLUE_TASKS if name not in tasks]
    not_blue = (f" BLUE's Total averages its ten tasks; {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} "
                "not in this table, so its summary scores are not BLUE's."
                if missing and tasks & set(BLUE_TASKS) else "")
    # BLUE's groups: the text the report has always had, even when a group has no task here
    named = ", ".join(SEED_GROUPS if set(groups) <= set(SEED_GROUPS) else groups)
    task_ns = {c.n for (_, key), c in table.cells.items() if c.n is not None and key in tasks}
    what = ("The numbers are single-seed scores (one seed per setting: no standard deviation)"
            if task_ns == {1} else "The numbers are means (standard deviations) over random seeds")
    return (f"{what} at the setting selected on dev; "
            "the best score per column is bold and the second best underlined (ranked on unrounded means; "
            "for a metric where lower is better the lowest ranks first). Total is the macro average over "
            f"{averaged}; each group's score ({named}) averages the tasks of that group{among}.{not_blue}{scale}"
            f"{partial}{_sample_note(table, name)}{_cut_note(table, name)}{_edge_note(table)}")


def _edge_note(table: BlueTable) -> str:
    """How many task cells' selections are at an end of their grid (the selection table names them)."""
    edge, cells = _edge_cells(table), sum(c.kind == "task" for c in table.columns) * len(table.models)
    return (f" In {len(edge)} of {cells} cells the setting selected on dev is at an end of its grid: a better one may "
            "lie beyond it (the settings selected on dev below)." if edge else "")


def _sample_note(table: BlueTable, name: Callable[[str], str] = str) -> str:
    """The tasks whose test scores are on a sample of the test split (``sweep.max_eval_examples``)."""
    sampled: dict[int, list[str]] = {}
    for col in table.columns:
        sizes = {table.cell(m, col.key).test_sample for m in table.models} - {None}
        if col.kind == "task" and sizes:
            sampled.setdefault(max(sizes), []).append(name(col.label))
    return "".join(f" {', '.join(names)}: the test scores are on a seeded sample of {size:,} test examples, not on "
                   "the whole test set (sweep.max_eval_examples caps dev and test; a task scored per document, as "
                   "HoC, by whole documents, at least that many examples)."
                   for size, names in sorted(sampled.items()))



def _cut_note(table: BlueTable, name: Callable[[str], str] = str) -> str:
    """The tasks and models whose fine-tuning cut inputs longer than max_seq_length word pieces, how many of how
    many per split (nothing where none was)."""
    said = []
    for col in table.columns:
        rows = [f"{name(model)}: " + ", ".join(f"{split} {n:,} of {of:,}" for split, n, of in
                                              table.cell(model, col.key).cut)
                for model in table.models if col.kind == "task" and table.cell(model, col.key).cut]
        if rows:
            said.append(f"{name(col.label)} ({'; '.join(rows)})")
    return (" Inputs longer than max_seq_length word pieces were cut to it (the words past the cut unread; an NER "
            f"word there predicted O): {', '.join(said)}." if said else "")


# ---------------------------------------------------------------------------------------------
# The paired differences and the NER tables
def comparison_markdown(table: BlueTable, comparison: dict) -> str:
    """The section "Paired differences vs <baseline>" (differences, then p-values) and the NER before/after tables."""
    columns = shown_columns(table, comparison)
    rule = "|" + "|".join(["---"] + [":---:"] * len(columns)) + "|"
    head = "| Model | " + " | ".join(md_escape(_column_label(c)) for c in columns) + " |"
    lines = [f"## Paired differences vs {md_escape(comparison['baseline'])}", "", head, rule]
    for model, row in comparison["rows"].items():
        lines.append(f"| {md_escape(model)} | " + " | ".join(_diff_text(table, row.get(c["key"])) for c in columns)
                     + " |")
    lines += ["", _comparison_notes(table, comparison), "",
              "### p-values (paired t-test over seeds; n = pairs)", "", head, rule]
    for model, row in comparison["rows"].items():
        lines.append(f"| {md_escape(model)} | " + " | ".join(_p_text(row.get(c["key"]), comparison["alpha"])
                                                                for c in columns) + " |")
    if comparison.get("ner"):
        lines += ["", f"## {NER_TITLE}"]
    for tasks in comparison.get("ner", {}).values():
        for task, ner in tasks.items():
            lines += ["", *_ner_markdown(table, task, ner)]
    if comparison.get("sources"):
        lines += ["", *sources_markdown(comparison["sources"], table.scale, table.digits)]
    return "\n".join(lines) + "\n"


def comparison_html(table: BlueTable, comparison: dict, source_figures: dict[str, str] | None = None) -> str:
    """The HTML of ``comparison_markdown``: each difference cell carries ``data-model``, ``data-column``,
    ``data-significant`` and the test in its ``title`` (p, t, pairs). ``source_figures``: the source
    analysis's PNGs (base64) to embed."""
    esc = html.escape
    columns = shown_columns(table, comparison)
    out = [f"<h2>Paired differences vs {esc(comparison['baseline'])}</h2>",
           '<table class="blue" id="paired-differences"><thead><tr><th class="model">Model</th>']
    for c in columns:
        arrow = "" if c["higher_is_better"] else " (lower is better)"
        metric = f'<br><span class="metric">{esc(metric_name(c["metric"]))}{arrow}</span>' if c["metric"] else ""
        out.append(f'<th class="{c["kind"]}" data-column="{esc(c["key"])}">{esc(c["label"])}{metric}</th>')
    out.append("</tr></thead><tbody>")
    for model, row in comparison["rows"].items():
        out.append(f'<tr data-model="{esc(model)}"><td class="model">{esc(model)}</td>')
        for c in columns:
            entry = row.get(c["key"])
            significant = "true" if entry and entry["significant"] else "false"
            out.append(f'<td class="{c["kind"]}" data-model="{esc(model)}" data-column="{esc(c["key"])}" '
                       f'data-significant="{significant}" title="{esc(_test_text(entry))}">'
                       f"{esc(_diff_text(table, entry))}</td>")
        out.append("</tr>")
    out.append("</tbody></table>")
    out.append(f'<p class="notes">{esc(_comparison_notes(table, comparison))}</p>')
    if comparison.get("ner"):
        out.append(f"<h2>{esc(NER_TITLE)}</h2>")
    for model, tasks in comparison.get("ner", {}).items():
        for task, ner in tasks.items():
            out.append(_ner_html(table, task, ner, model))
    if comparison.get("sources"):
        out.append(sources_html(comparison["sources"], table.scale, table.digits, source_figures))
    return "\n".join(out)


def shown_columns(table: BlueTable, comparison: dict) -> list[dict]:
    """The comparison's columns that the table shows too (a group without tasks has none)."""
    shown = {c.key for c in table.columns}
    return [c for c in comparison["columns"] if c["key"] in shown]


def _column_label(column: dict) -> str:
    return column["label"] + ("" if column["higher_is_better"] else " (\u2193)")


def signed_diff(table: BlueTable, value: float) -> str:
    """'+1.2' / '\u22120.3' in display units; '0.0' when it rounds to zero."""
    text = f"{abs(value) * table.scale:.{table.digits}f}"
    if float(text) == 0:
        return text
    return ("+" if value > 0 else MINUS) + text


def _diff_text(table: BlueTable, entry: dict | None) -> str:
    """'+1.2 [\u22120.3, +2.7]*' (mean difference, bootstrap interval, * when significant), a dagger
    when the column is partial, an en dash without pairs."""
    if not entry or entry["mean_diff"] is None:
        return "\u2013"
    text = signed_diff(table, entry["mean_diff"])
    if entry["ci"]:
        text += f" [{signed_diff(table, entry['ci'][0])}, {signed_diff(table, entry['ci'][1])}]"
    return text + (SIGNIFICANT if entry["significant"] else "") + (DAGGER if entry.get("partial") else "")


def _p_text(entry: dict | None, alpha: float) -> str:
    if not entry:
        return "\u2013"
    if entry["p"] is None:
        return f"\u2013 (n={entry['n']})"
    return f"{p_text(entry['p'], alpha)} (n={entry['n']})"


def _test_text(entry: dict | None) -> str:
    """A difference cell's title: the test, the pairs and any note."""
    if not entry:
        return "no cell for this task in one of the two models"
    parts = [] if entry["p"] is None else [f"p = {entry['p']:.4g}, t = {entry['t']:.3g}"]
    by = "seeds" if entry["pairs_by"] == "seed" else "folds"
    parts.append(f"n = {entry['n']} pairs ({by} {', '.join(map(str, entry['paired']))})")
    if entry.get("partial"):
        parts.append(f"partial: averages {', '.join(entry['tasks'])} only")
    if entry["note"]:
        parts.append(entry["note"])
    return "; ".join(parts)


def _comparison_notes(table: BlueTable, comparison: dict) -> str:
    scale = "" if table.scale == 1 else f" in points (scores x {table.scale:g})"
    level = f"{comparison['ci_level'] * 100:g} %"
    partial = ""
    if any(e.get("n") == 2 for row in comparison["rows"].values() for e in row.values()):
        partial += (" With 2 pairs the interval is the two differences themselves: it may exclude 0 beside a large "
                    "p (read the p-value).")
    if any(e.get("partial") for row in comparison["rows"].values() for e in row.values()):
        partial += (f" {DAGGER} the column averages only the tasks both models have with per-seed scores "
                    "(the same tasks on both sides); it is not the full column.")
    return (f"Each cell is the mean over seeds of (model \u2212 {comparison['baseline']}){scale}, paired by seed "
            f"(by fold for cross-validated tasks), with the {level} percentile bootstrap interval of that mean "
            f"({comparison['n_boot']} resamples of the pairs). {SIGNIFICANT} marks p < {comparison['alpha']:g} in a "
            "two-sided paired t-test over the pairs. For a metric where lower is better (\u2193) a negative "
            "difference is an improvement. Summary columns compare per-seed macro averages. An en dash: no "
            f"pairs.{partial} The seeds are fine-tuning seeds: each model is one pretraining, whose own variation "
            "the interval does not hold (on the entity-masking experiment another pretrain.seed alone moved an "
            "arm's Total by 11 points): compare arms replicated at other pretraining seeds (replicate_seeds, "
            "docs/EXPERIMENTS.md).")


def _ner_rows(table: BlueTable, ner: dict) -> tuple[list[list[str]], list[list[str]]]:
    """Seed 001's Table 3 (overall: before, after) and Table 4 (per tag: P, R, F1 before/after, support)."""
    def value(row: dict | None, key: str) -> str:
        return table.text((row or {}).get(key))

    def support(before: dict | None, after: dict | None) -> str:
        counts = [r["support"] for r in (before, after) if r]
        return str(counts[0]) if len(set(counts)) == 1 else " / ".join(map(str, counts)) or "\u2013"

    overall = [[f"{ner['baseline']} (before)", *(value(ner["overall"]["before"], k) for k in ("precision", "recall",
                                                                                              "f1"))],
               [f"{ner['model']} (after)", *(value(ner["overall"]["after"], k) for k in ("precision", "recall", "f1"))]]
    per_tag = []
    for tag, pair in [*ner["tags"].items(), ("overall", ner["overall"])]:
        cells = [value(pair[side], k) for k in ("precision", "recall", "f1") for side in ("before", "after")]
        per_tag.append([tag, *cells, support(pair["before"], pair["after"])])
    return overall, per_tag


_NER_HEAD = ["Tag", "Precision before", "Precision after", "Recall before", "Recall after", "F1 before", "F1 after",
             "Support"]


def _ner_note(ner: dict) -> str:
    return "Overall: " + "; ".join(f"{k}: {v}" for k, v in ner["overall_method"].items()) + "."


def _ner_markdown(table: BlueTable, task: str, ner: dict) -> list[str]:
    overall, per_tag = _ner_rows(table, ner)
    lines = [f"### NER {md_escape(task)}: {md_escape(ner['baseline'])} (before) vs {md_escape(ner['model'])} "
             "(after)", "", "| | Precision | Recall | F1 |", "|---|:---:|:---:|:---:|"]
    lines += ["| " + " | ".join(md_escape(c) for c in row) + " |" for row in overall]
    lines += ["", "| " + " | ".join(_NER_HEAD) + " |", "|" + "|".join(["---"] + [":---:"] * 7) + "|"]
    lines += ["| " + " | ".join(md_escape(c) for c in row) + " |" for row in per_tag]
    return [*lines, "", _ner_note(ner)]


def _ner_html(table: BlueTable, task: str, ner: dict, model: str) -> str:
    esc = html.escape
    overall, per_tag = _ner_rows(table, ner)
    attrs = f'data-model="{esc(model)}" data-task="{esc(task)}"'
    out = [f"<h3>NER {esc(task)}: {esc(ner['baseline'])} (before) vs {esc(ner['model'])} (after)</h3>",
           f'<table class="blue ner-overall" {attrs}><thead><tr><th class="model"></th><th>Precision</th>'
           "<th>Recall</th><th>F1</th></tr></thead><tbody>"]
    out += ['<tr><td class="model">' + "</td><td>".join(esc(c) for c in row) + "</td></tr>" for row in overall]
    out.append(f'</tbody></table><table class="blue ner-tags" {attrs}><thead><tr>'
               + "".join(f"<th>{esc(h)}</th>" for h in _NER_HEAD) + "</tr></thead><tbody>")
    out += [f'<tr data-tag="{esc(row[0])}"><td class="model">' + "</td><td>".join(esc(c) for c in row)
            + "</td></tr>" for row in per_tag]
    out.append(f'</tbody></table><p class="notes">{esc(_ner_note(ner))}</p>')
    return "\n".join(out)



# ---------------------------------------------------------------------------------------------
# Seed 004's source analysis: tables
def _label(column: str) -> str:
    return "Total" if column == "total" else column


def _stat(value: float | None, p: float | None) -> str:
    return "\u2013" if value is None else f"{value:+.3f} (p={p:.2g})" if p is not None else f"{value:+.3f}"


def _tables(doc: dict, scale: float, digits: int) -> list[tuple[str, list[str], list[list[str]]]]:
    """(id, head, rows) of the three tables: each arm's measures and mean gain on Total; r and rho per
    column and measure (seed 004's Tables 3/4 layout); the matrix (its Figure 3), Pearson below the
    diagonal and Spearman above it."""
    measures = list(doc["measures"])
    head = ["Arm", *(m.upper() for m in measures), f"Gain on Total vs {doc['baseline']}"]
    rows = []
    for arm, score in doc["scores"].items():
        gain = doc["gains"].get("total", {}).get(arm)
        rows.append([arm, *(f"{score['measures'][m]:.4g}" for m in measures),
                     "\u2013" if gain is None else f"{gain * scale:+.{digits}f}"])
    corr_head = ["Column", "n (arms)", *(f"{kind}({m.upper()})" for m in measures for kind in ("r", "\u03c1"))]
    corr_rows = []
    for column, per in doc["correlations"].items():
        first = next(iter(per.values()))
        row = [_label(column), f"{first['n']} ({first['arms']})"]
        for m in measures:
            c = per[m]
            if c["r"] is None and c["rho"] is None:
                row += [f"\u2013 ({c['why']})", "\u2013"]
            else:
                row += [_stat(c["r"], c["p"]), _stat(c["rho"], c["rho_p"])]
        corr_rows.append(row)
    names = doc["matrix"]["variables"]
    matrix_head = ["", *(n.upper() for n in names)]
    matrix_rows = []
    for i, a in enumerate(names):
        row = [a.upper()]
        for j in range(len(names)):
            value = doc["matrix"]["pearson" if j <= i else "spearman"][i][j]
            row.append("\u2013" if value is None else f"{value:+.2f}")
        matrix_rows.append(row)
    return [("source-scores", head, rows), ("source-correlations", corr_head, corr_rows),
            ("source-matrix", matrix_head, matrix_rows)]


def _caption(doc: dict) -> str:
    directions = "; ".join(f"{m.upper()}: {d}" for m, d in doc["measures"].items())
    m = doc["matrix"]
    text = (f"Measures of each arm's pretraining sources against the sweep's tasks' training text ({directions}). "
            f"Second table: Pearson r and Spearman \u03c1 of each measure with the gain (p two-sided). Third: the "
            f"correlation between the measures and the gain over the {m['n']} pooled points ({m['units']} distinct "
            "(arm, task) values; Pearson below the diagonal, Spearman above). " + doc["note"])
    if doc.get("unscored"):
        text += " Not in the analysis (no scores): " + ", ".join(doc["unscored"]) + "."
    if doc.get("unmatched"):
        text += " Tasks without per-task scores: " + ", ".join(doc["unmatched"]) + "."
    return text


def sources_markdown(doc: dict, scale: float = 100.0, digits: int = 1, figures: bool = True) -> list[str]:
    """The report's section; ``figures``: link the PNGs ``write_report`` puts beside it."""
    lines = [f"## {SOURCES_TITLE}"]
    for _, head, rows in _tables(doc, scale, digits):
        lines += ["", "| " + " | ".join(map(md_escape, head)) + " |",
                  "|" + "|".join(["---"] + [":---:"] * (len(head) - 1)) + "|"]
        # an arm's name escaped as the other tables escape it; the numbers' cells ("<0.001") as written
        lines += ["| " + " | ".join([md_escape(row[0]), *(v.replace("|", "\\|") for v in row[1:])]) + " |"
                  for row in rows]
    lines += ["", _caption(doc)]
    if figures:
        lines += ["", f"![each measure against the gain]({SOURCE_FIGURES['scatter']})", "",
                  f"![correlation between the measures and the gain]({SOURCE_FIGURES['matrix']})"]
    return lines


def sources_html(doc: dict, scale: float = 100.0, digits: int = 1, figures: dict[str, str] | None = None) -> str:
    """The section as an HTML fragment; ``figures``: {"scatter"|"matrix": PNG bytes base64} to embed."""
    esc = html.escape
    out = [f"<h2>{esc(SOURCES_TITLE)}</h2>"]
    for ident, head, rows in _tables(doc, scale, digits):
        out.append(f'<table class="blue" id="{ident}"><thead><tr>' + "".join(f"<th>{esc(h)}</th>" for h in head)
                   + "</tr></thead><tbody>")
        out += ["<tr>" + "".join(f"<td>{esc(v)}</td>" for v in row) + "</tr>" for row in rows]
        out.append("</tbody></table>")
    out.append(f'<p class="notes">{esc(_caption(doc))}</p>')
    for kind, alt in (("scatter", "each measure against the gain"),
                      ("matrix", "correlation between the measures and the gain")):
        if figures and figures.get(kind):
            out.append(f'<img id="source-{kind}" alt="{alt}" src="data:image/png;base64,{figures[kind]}">')
    return "\n".join(out)



def md_escape(text: str) -> str:
    """Text for a Markdown table or heading: ``|`` would end a cell, and Markdown renders HTML (a model named
    ``<script>...`` ran in a viewer that shows HTML): ``&``, ``<`` and ``>`` as entities, displayed as typed."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")
