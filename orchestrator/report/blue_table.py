"""The BLUE table as seed 000 prints it (Tables 6, 7, A3), plus learning curves.

    paths = write_report(results, Path("runs/demo/report"))
    # {"md": .../blue_table.md, "html": .../blue_table.html, "png": .../blue_table.png,
    #  "curves": .../curves.png, "results": .../results.json, "manifest": .../manifest.json}

``results`` is the ``sweep/results.json`` document of docs/ARCHITECTURE.md. One row per model;
columns Total, Clinical, Biomedical, then one per task. Cells read "mean (sd)" in points
(scores x 100, one decimal, as in the seed); per column the best mean is bold and the second
best underlined, ranked on the unrounded means so that "83.9" can be bold above an underlined
"83.9", exactly as Table 7 shows. A task whose metric has ``higher_is_better: false`` ranks
the lowest value best. Building the table (``build_table``) is pure and tested without I/O;
the renderers only format it.

With ``baseline=<model>`` (and two or more models) the report adds "Paired differences vs
<baseline>": per model and column the mean difference over seeds with its bootstrap interval,
``*`` when the paired t-test gives p < 0.05, the p-values in a second table (Markdown) or each
cell's title (HTML); and seed 001's NER before/after tables. The numbers come from
``orchestrator.report.compare`` and are written as ``comparison.json``.
"""
from __future__ import annotations

import base64
import html
import logging
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.core.config import is_number
from orchestrator.core.manifest import atomic_dir, atomic_write_json, atomic_write_text, write_manifest
from orchestrator.core.results import PARTIAL, SEED_GROUPS, summary_members, validate_results
from orchestrator.report import sources as source_gains
from orchestrator.report.compare import check_baseline, comparison_document

log = logging.getLogger(__name__)

DAGGER = "\u2020"
FILES = {"md": "blue_table.md", "html": "blue_table.html", "png": "blue_table.png", "curves": "curves.png",
         "results": "results.json", "comparison": "comparison.json"}
MINUS = "\u2212"
SIGNIFICANT = "*"
NER_TITLE = "NER before / after (seed 001, Tables 3 and 4)"


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


# ---------------------------------------------------------------------------------------------
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
    (else by position), when every task has a score for the same two or more seeds.
    """
    rows = results["cells"].get(model, {})
    per_task: list[dict[Any, float]] = []
    for name in task_names:
        cell = rows.get(name) or {}
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
    tasks = results["tasks"]
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
            raw[(model, name)] = (_clean(cell.get("mean")), _clean(cell.get("sd")), cell.get("n"))
            chosen[(model, name)] = (tuple((cell.get("selected") or {}).items()), _clean(cell.get("dev_mean")))

    cells: dict[tuple[str, str], Cell] = {}
    for col in columns:
        ranked = [None if (m, col.key) in partial else raw[(m, col.key)][0] for m in models]
        ranks = rank_top2(ranked, col.higher_is_better)
        for model, rank in zip(models, ranks):
            mean, sd, n = raw[(model, col.key)]
            selected, dev_mean = chosen.get((model, col.key), ((), None))
            cells[(model, col.key)] = Cell(mean=mean, sd=sd, n=n, rank=rank, selected=selected, dev_mean=dev_mean,
                                           partial=(model, col.key) in partial)
    return BlueTable(models=models, columns=tuple(columns), cells=cells, scale=scale, digits=digits)


# ---------------------------------------------------------------------------------------------
# Renderers
def render_markdown(table: BlueTable, title: str = "BLUE results", curves: str | None = None,
                    comparison: dict | None = None, notes: Sequence[str] = (), sections: Sequence[str] = ()) -> str:
    """GitHub Markdown: best ``**bold**``, second ``<u>underlined</u>`` as in the seed's tables;
    the paired differences after the table when ``comparison`` (``compare.comparison_document``) is given;
    ``sections`` (Markdown, e.g. an experiment's retrieval tables) before the learning curves."""
    head = ["Model"] + [c.label for c in table.columns]
    rule = "|" + "|".join(["---"] + [":---:"] * len(table.columns)) + "|"
    lines = [f"# {title}", "", "| " + " | ".join(head) + " |", rule]
    for model in table.models:
        row = [_md_escape(model)]
        for col in table.columns:
            cell = table.cell(model, col.key)
            mean = table.text(cell.mean) + (DAGGER if cell.partial else "")
            if cell.rank == 1:
                mean = f"**{mean}**"
            elif cell.rank == 2:
                mean = f"<u>{mean}</u>"
            row.append(mean if cell.sd is None else f"{mean} ({table.text(cell.sd)})")
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", _notes(table)] + [f"\n**{_md_escape(note)}**" for note in notes]
    if comparison:
        lines += ["", comparison_markdown(table, comparison).rstrip("\n")]
    tasks = [c for c in table.columns if c.kind == "task"]
    if any(table.cell(m, c.key).selected for m in table.models for c in tasks):
        lines += ["", "## Settings selected on dev", "",
                  "| Model | " + " | ".join(c.label for c in tasks) + " |", "|---|" + "---|" * len(tasks)]
        for model in table.models:
            lines.append(f"| {_md_escape(model)} | " + " | ".join(_selection_text(table, table.cell(model, c.key))
                                                               for c in tasks) + " |")
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
        metric = f'<br><span class="metric">{esc(col.metric)}{arrow}</span>' if col.metric else ""
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
    return "\n".join(out)


def comparison_markdown(table: BlueTable, comparison: dict) -> str:
    """The section "Paired differences vs <baseline>" (differences, then p-values) and the NER before/after tables."""
    columns = _comparison_columns(table, comparison)
    rule = "|" + "|".join(["---"] + [":---:"] * len(columns)) + "|"
    head = "| Model | " + " | ".join(_column_label(c) for c in columns) + " |"
    lines = [f"## Paired differences vs {_md_escape(comparison['baseline'])}", "", head, rule]
    for model, row in comparison["rows"].items():
        lines.append(f"| {_md_escape(model)} | " + " | ".join(_diff_text(table, row.get(c["key"])) for c in columns)
                     + " |")
    lines += ["", _comparison_notes(table, comparison), "",
              "### p-values (paired t-test over seeds; n = pairs)", "", head, rule]
    for model, row in comparison["rows"].items():
        lines.append(f"| {_md_escape(model)} | " + " | ".join(_p_text(row.get(c["key"])) for c in columns) + " |")
    if comparison.get("ner"):
        lines += ["", f"## {NER_TITLE}"]
    for tasks in comparison.get("ner", {}).values():
        for task, ner in tasks.items():
            lines += ["", *_ner_markdown(table, task, ner)]
    if comparison.get("sources"):
        lines += ["", *source_gains.sources_markdown(comparison["sources"], table.scale, table.digits)]
    return "\n".join(lines) + "\n"


def comparison_html(table: BlueTable, comparison: dict, source_figures: dict[str, str] | None = None) -> str:
    """The HTML of ``comparison_markdown``: each difference cell carries ``data-model``, ``data-column``,
    ``data-significant`` and the test in its ``title`` (p, t, pairs). ``source_figures``: the source
    analysis's PNGs (base64) to embed."""
    esc = html.escape
    columns = _comparison_columns(table, comparison)
    out = [f"<h2>Paired differences vs {esc(comparison['baseline'])}</h2>",
           '<table class="blue" id="paired-differences"><thead><tr><th class="model">Model</th>']
    for c in columns:
        arrow = "" if c["higher_is_better"] else " (lower is better)"
        metric = f'<br><span class="metric">{esc(c["metric"])}{arrow}</span>' if c["metric"] else ""
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
        out.append(sources_html(table, comparison["sources"], source_figures))
    return "\n".join(out)


def render_table_png(table: BlueTable, path: Path, title: str = "BLUE results") -> Path:
    """The table as an image: bold for best, mathtext underline for second best."""
    import matplotlib  # heavy: matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # heavy: matplotlib

    header = ["Model"] + [c.label for c in table.columns]
    rows, ranks = [], []
    for model in table.models:
        row, rrow = [model], [None]
        for col in table.columns:
            cell = table.cell(model, col.key)
            mean = table.text(cell.mean) + (DAGGER if cell.partial else "")
            if cell.rank == 2:
                mean = rf"$\underline{{\mathrm{{{mean}}}}}$"
            row.append(mean if cell.sd is None else f"{mean} ({table.text(cell.sd)})")
            rrow.append(cell.rank)
        rows.append(row)
        ranks.append(rrow)
    width = max(6.0, 1.1 * len(header) + 1.5)
    fig, ax = plt.subplots(figsize=(width, 0.3 * (len(rows) + 1)))
    ax.axis("off")
    ax.set_title(title, fontsize=11)
    tab = ax.table(cellText=rows, colLabels=header, cellLoc="center", bbox=[0, 0, 1, 1])
    tab.auto_set_font_size(False)
    tab.set_fontsize(8)
    tab.auto_set_column_width(list(range(len(header))))
    for (r, c), cell in tab.get_celld().items():
        if r == 0:
            cell.set_text_props(weight="bold")
        elif ranks[r - 1][c] == 1:
            cell.set_text_props(weight="bold")
    fig.savefig(path, dpi=150, bbox_inches="tight", pad_inches=0.2)
    plt.close(fig)
    return path


def render_curves_png(results: dict, path: Path) -> Path | None:
    """One panel per task: dev (solid) and test (dashed) score per epoch, one colour per model.

    The epoch chosen on dev (``selected.epochs``) is marked. Returns None when no cell has a curve.
    """
    tasks = [t for t in results["tasks"]
             if any((results["cells"].get(m, {}).get(t["name"]) or {}).get("curve") for m in results["models"])]
    if not tasks:
        return None
    import matplotlib  # heavy: matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # heavy: matplotlib
    from matplotlib.ticker import MaxNLocator

    ncols = min(3, len(tasks))
    nrows = math.ceil(len(tasks) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.2 * nrows), squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, task in zip(axes.flat, tasks):
        for i, model in enumerate(results["models"]):
            cell = results["cells"].get(model, {}).get(task["name"]) or {}
            curve = sorted(cell.get("curve") or [], key=lambda p: p["epoch"])
            if not curve:
                continue
            colour = colours[i % len(colours)]
            for split, style in (("dev", "-"), ("test", "--")):
                pts = [(p["epoch"], p[split]) for p in curve if is_number(p.get(split))]
                if pts:
                    xs, ys = zip(*pts)
                    ax.plot(xs, ys, style, color=colour, marker="o", markersize=3, label=f"{model} {split}")
            chosen = (cell.get("selected") or {}).get("epochs")
            dev_at = [p["dev"] for p in curve if p["epoch"] == chosen and is_number(p.get("dev"))]
            if dev_at:
                ax.plot([chosen], dev_at, marker="*", markersize=12, color=colour, linestyle="none")
        ax.set_title(f"{task['name']} ({task.get('metric', '')})", fontsize=10)
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(tasks):]:
        ax.axis("off")
    fig.suptitle("Fine-tuning curves (dev solid, test dashed; \u2605 = epoch selected on dev)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------------
def write_report(results: dict, out_dir: Path, title: str = "BLUE results", scale: float = 100.0,
                 digits: int = 1, source: str | Path = "results.json", baseline: str | None = None,
                 notes: Sequence[str] = (), source_scores: dict[str, dict] | None = None,
                 sections: Sequence[tuple[str, str]] = ()) -> dict[str, Path]:
    """Write Markdown, HTML, PNG table and learning curves atomically into ``out_dir``.

    ``out_dir`` appears complete (with a manifest.json and a copy of ``results``) or not at all.
    With ``baseline`` (one of the results' models; InputError naming ``source`` otherwise) and two
    or more models, the Markdown and HTML add the paired differences against it and
    ``comparison.json`` holds their numbers. Returns the final paths by kind: md, html, png, curves
    (when any cell has a curve), results, comparison (with a baseline), manifest; the manifest
    lists the files. ``notes`` are said under the table (an experiment's failed arms).
    ``source_scores`` (``{model: {"measures", "by_task"}}``, an experiment's seed 004 scores) add
    "Source similarity vs gain": per task and seed, the Pearson r and Spearman rho of each measure
    with the gain over the baseline, the matrix between the measures and the gain, and two figures
    (``orchestrator.report.sources``; numbers in ``comparison.json`` under ``sources``, figures
    ``sources_scatter.png`` and ``sources_matrix.png``, returned as kinds sources_scatter and
    sources_matrix).
    ``sections`` are (Markdown, HTML) pairs added to both pages (an experiment's retrieval tables).
    """
    out_dir = Path(out_dir)
    table = build_table(results, scale=scale, digits=digits, source=source)
    comparison = None
    if baseline is not None:
        check_baseline(results, baseline, source)
        if len(table.models) >= 2:
            comparison = comparison_document(results, baseline, source=source)
            if source_scores:
                comparison["sources"] = source_gains.source_correlations(comparison, source_scores)
        else:
            log.info("one model only: no paired differences against %s", baseline)
    with atomic_dir(out_dir, "report") as tmp:
        written = {"md": FILES["md"], "html": FILES["html"], "png": FILES["png"], "results": FILES["results"]}
        curves = render_curves_png(results, tmp / FILES["curves"])
        if curves is not None:
            written["curves"] = FILES["curves"]
        embedded = base64.b64encode(curves.read_bytes()).decode("ascii") if curves else None
        figures = None
        if comparison is not None and comparison.get("sources"):
            drawn = source_gains.render_figures(comparison["sources"], tmp, scale)
            written.update({f"sources_{kind}": path.name for kind, path in drawn.items()})
            figures = source_gains.embedded(drawn)
        atomic_write_text(tmp / FILES["md"], render_markdown(table, title, curves=written.get("curves"),
                                                             comparison=comparison, notes=notes,
                                                             sections=[md for md, _ in sections]))
        atomic_write_text(tmp / FILES["html"], render_html(table, title, curves_png=embedded, comparison=comparison,
                                                           notes=notes, source_figures=figures,
                                                           sections=[h for _, h in sections]))
        render_table_png(table, tmp / FILES["png"], title)
        atomic_write_json(tmp / FILES["results"], results)
        config = {"title": title, "scale": scale, "digits": digits, "source": str(source), "baseline": baseline}
        if comparison is not None:
            atomic_write_json(tmp / FILES["comparison"], comparison)
            written["comparison"] = FILES["comparison"]
            config.update(alpha=comparison["alpha"], n_boot=comparison["n_boot"])
        write_manifest(tmp, stage="report", config=config, seed=comparison["seed"] if comparison else None,
                       counts={"models": len(table.models), "tasks": len(results["tasks"]),
                               "columns": len(table.columns)},
                       extra={"files": sorted(written.values())})
        written["manifest"] = "manifest.json"
    paths = {kind: out_dir / name for kind, name in written.items()}
    log.info("report written: %s", paths["html"])
    return paths


# ---------------------------------------------------------------------------------------------
def _selection_text(table: BlueTable, cell: Cell) -> str:
    """'learning_rate=5e-05, epochs=3; dev 85.0' for one cell of the selection table."""
    if not cell.selected:
        return "\u2013"
    text = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in cell.selected)
    return text if cell.dev_mean is None else f"{text}; dev {table.text(cell.dev_mean)}"


def _notes(table: BlueTable) -> str:
    scale = "" if table.scale == 1 else f" Scores x {table.scale:g}."
    partial = ""
    if any(c.partial for c in table.cells.values()):
        partial = (f" {DAGGER} averages only the tasks that model was fine-tuned on (e.g. an augmented row has "
                   "NER tasks only): it is not comparable with the full scores and is not ranked.")
    groups = [c.key for c in table.columns if c.kind == "summary" and c.key != "total"]
    # BLUE's groups: the text the report has always had, even when a group has no task here
    named = ", ".join(SEED_GROUPS if set(groups) <= set(SEED_GROUPS) else groups)
    return ("The numbers are means (standard deviations) over random seeds at the setting selected on dev; "
            "the best score per column is bold and the second best underlined (ranked on unrounded means; "
            "for a metric where lower is better the lowest ranks first). Total is the macro average over "
            f"all tasks; each group's score ({named}) averages the tasks of that group.{scale}"
            f"{partial}")


def _comparison_columns(table: BlueTable, comparison: dict) -> list[dict]:
    """The comparison's columns that the table shows too (a group without tasks has none)."""
    shown = {c.key for c in table.columns}
    return [c for c in comparison["columns"] if c["key"] in shown]


def _column_label(column: dict) -> str:
    return column["label"] + ("" if column["higher_is_better"] else " (\u2193)")


def _signed(table: BlueTable, value: float) -> str:
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
    text = _signed(table, entry["mean_diff"])
    if entry["ci"]:
        text += f" [{_signed(table, entry['ci'][0])}, {_signed(table, entry['ci'][1])}]"
    return text + (SIGNIFICANT if entry["significant"] else "") + (DAGGER if entry.get("partial") else "")


def _p_text(entry: dict | None) -> str:
    if not entry:
        return "\u2013"
    if entry["p"] is None:
        return f"\u2013 (n={entry['n']})"
    p = "<0.001" if entry["p"] < 0.001 else f"{entry['p']:.3f}"
    return f"{p} (n={entry['n']})"


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
    if any(e.get("partial") for row in comparison["rows"].values() for e in row.values()):
        partial = (f" {DAGGER} the column averages only the tasks both models have with per-seed scores "
                   "(the same tasks on both sides); it is not the full column.")
    return (f"Each cell is the mean over seeds of (model \u2212 {comparison['baseline']}){scale}, paired by seed "
            f"(by fold for cross-validated tasks), with the {level} percentile bootstrap interval of that mean "
            f"({comparison['n_boot']} resamples of the pairs). {SIGNIFICANT} marks p < {comparison['alpha']:g} in a "
            "two-sided paired t-test over the pairs. For a metric where lower is better (\u2193) a negative "
            "difference is an improvement. Summary columns compare per-seed macro averages. An en dash: no "
            f"pairs.{partial}")


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
    lines = [f"### NER {_md_escape(task)}: {_md_escape(ner['baseline'])} (before) vs {_md_escape(ner['model'])} "
             "(after)", "", "| | Precision | Recall | F1 |", "|---|:---:|:---:|:---:|"]
    lines += ["| " + " | ".join(_md_escape(c) for c in row) + " |" for row in overall]
    lines += ["", "| " + " | ".join(_NER_HEAD) + " |", "|" + "|".join(["---"] + [":---:"] * 7) + "|"]
    lines += ["| " + " | ".join(_md_escape(c) for c in row) + " |" for row in per_tag]
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


SOURCES_TITLE = source_gains.TITLE


def sources_html(table: BlueTable, sources: dict, figures: dict[str, str] | None = None) -> str:
    """Seed 004's section (``orchestrator.report.sources``) in the table's units."""
    return source_gains.sources_html(sources, table.scale, table.digits, figures)


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|")



def _clean(value: Any) -> float | None:
    return float(value) if is_number(value) else None
