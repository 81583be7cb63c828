"""One HTML page per experiment, built from MLflow alone: arms, the seed 000 table, paired
differences against the baseline arm, pretraining loss curves and fine-tuning curves.

    python dashboards/experiment_page.py --tracking-uri sqlite:///runs/exp/mlflow.db --out page.html
    python dashboards/experiment_page.py --run-dir runs/exp          # -> runs/exp/report/experiment.html

    build_page("sqlite:///runs/exp/mlflow.db", "page.html")          # the newest experiment in the store
    build_page(uri, "page.html", experiment_run_id="3f2a...")         # one experiment's parent run

What it shows is read by ``dashboards.experiment_data`` (an ``Experiment``: the arms, their
pretraining loss, the sweep's results and the paired differences); this module renders it. The
table is ``orchestrator.report.table``'s, the differences ``orchestrator.report.compare``'s, both
rendered by the report's own HTML (``orchestrator.report.pages``): nothing is computed twice.

The page is one static file: inline CSS and inline SVG plots, no script, no font or image from
anywhere (its Content-Security-Policy forbids every load, so a browser would say so if one crept
in). Missing pieces are said where they would be: a failed arm (with its error), an arm without a
pretraining run (the untrained floor, a published model, or an output shared with another arm),
an experiment whose sweep has not run yet, a baseline without results.
"""
from __future__ import annotations

import argparse
import dataclasses
import html
import logging
import os
import sys
import time
from pathlib import Path

from dashboards.experiment_data import Experiment, load_experiment
from dashboards.svg import Series, interval_panel, line_plot, signed, thin
from orchestrator.core.config import is_number, redacted
from orchestrator.core.cost import cost_note, duration
from orchestrator.core.errors import OrchestratorError
from orchestrator.core.manifest import atomic_write_text
from orchestrator.core.results import in_blue_order
from orchestrator.report.compare import p_text
from orchestrator.report.table import DAGGER
from orchestrator.retrieval.table import CSS as RETRIEVAL_CSS
from orchestrator.retrieval.table import render_html as retrieval_html
from orchestrator.track import local_uri
from orchestrator.track import schema as S
from orchestrator.track.local_store import readable_store

log = logging.getLogger(__name__)

#: Where jobs/blue_sweep.py writes the page, under the run directory.
PAGE_PATH = Path("report") / "experiment.html"
#: Arm colours, the same arm in the same colour on every plot (matplotlib's tab10).
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")
KIND_TEXT = {"pretrain": "pretrained", "random": "untrained floor (random init)", "model": "published model"}
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"


# ---------------------------------------------------------------------------------------------
# The page
def build_page(tracking_uri: str, out_path: str | Path, experiment_run_id: str | None = None,
               run_dir: str | Path | None = None) -> Path:
    """Read the experiment from MLflow and write its page to ``out_path`` (temp file + rename); ``run_dir``: the
    experiment of that run directory, in a store several share."""
    with readable_store(tracking_uri) as readable:  # a run directory moved elsewhere: where its artifacts are now
        exp = dataclasses.replace(load_experiment(readable, experiment_run_id, run_dir=run_dir),
                                  tracking_uri=tracking_uri)
    path = atomic_write_text(Path(out_path), render_page(exp))
    log.info("experiment page written: %s", path)
    return path


_PAGE_CSS = """
h2 { margin-top: 1.6em; border-bottom: 1px solid #ccc; padding-bottom: 2px; }
p.meta { font-size: 12px; color: #555; }
p.meta code { font-size: 11px; }
table.arms td, table.arms th { text-align: left; }
td.failed, span.failed { color: #b00; font-weight: bold; }
td.ok { color: #080; }
td.error { font-size: 12px; color: #800; max-width: 40em; }
span.baseline { font-size: 11px; background: #eee; border-radius: 3px; padding: 0 4px; margin-left: 4px; }
span.swatch { display: inline-block; width: 10px; height: 10px; margin-right: 5px; border-radius: 2px; }
div.panels { display: flex; flex-wrap: wrap; gap: 10px; }
svg { background: #fff; }
svg text { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; }
td.sig { font-weight: bold; }
p.missing { color: #a60; font-style: italic; }
"""


def render_page(exp: Experiment) -> str:
    """The page's HTML (pure: no I/O)."""
    from orchestrator.report.pages import CSS  # the report's package: loaded for a page, not for --help

    esc = html.escape
    colours = _colours(exp)
    title = f"Experiment {exp.name}"
    started = time.strftime("%Y-%m-%d %H:%M", time.localtime(exp.started)) if exp.started else "?"
    meta = [f"MLflow store <code>{esc(redacted(exp.tracking_uri))}</code>",
            f"experiment run <code>{esc(exp.run_id)}</code> "
            f"({esc(exp.status.lower())}, started {esc(started)})"]
    if exp.sweep_run:
        meta.append(f"sweep run <code>{esc(exp.sweep_run)}</code> (results from its {esc(exp.results_source or '?')})")
    if exp.git_commit:
        meta.append(f"commit <code>{esc(exp.git_commit[:12])}</code>")
    meta.append(f"page built {esc(time.strftime('%Y-%m-%d %H:%M'))}")
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">', f"<title>{esc(title)}</title>",
           f"<style>{CSS}{_PAGE_CSS}</style></head><body>", f"<h1>{esc(title)}</h1>",
           '<p class="meta">' + " &middot; ".join(meta) + "</p>"]
    out += [f'<p class="missing">{esc(note)}</p>' for note in exp.notes]
    out.append(_arms_html(exp, colours))
    out.append(_cost_section(exp, colours))
    table = _blue_table(exp)
    out.append(_table_section(exp, table))
    out.append(_differences_section(exp))
    out.append(_replicates_section(exp, table))
    out.append(_sources_section(exp, table))
    out.append(_retrieval_section(exp))
    out.append(_loss_section(exp, colours))
    out.append(_curves_section(exp, colours))
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def _colours(exp: Experiment) -> dict[str, str]:
    names = list(exp.arms) + [m for m in (exp.results or {}).get("models", []) if m not in exp.arms]
    return {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(names)}


def _swatch(colour: str) -> str:
    return f'<span class="swatch" style="background:{colour}"></span>'


def _arms_html(exp: Experiment, colours: dict[str, str]) -> str:
    esc = html.escape
    in_sweep = set((exp.results or {}).get("models", []))
    out = ['<h2>Arms</h2><table class="blue arms" id="arms"><thead><tr><th class="model">Arm</th><th>Kind</th>'
           "<th>Status</th><th>Pretraining (MLflow)</th><th>In the sweep</th><th>Error</th></tr></thead><tbody>"]
    for arm in exp.arms.values():
        badge = '<span class="baseline">baseline</span>' if arm.name == exp.baseline else ""
        status = arm.status or "unknown"
        where = f" in {arm.stage}" if arm.status in ("failed", "interrupted") and arm.stage else ""
        if arm.pretrain_run:
            loss = (f"; loss {arm.loss[0][1]:.3f} \u2192 {arm.loss[-1][1]:.3f} over {arm.loss[-1][0]} steps"
                    if arm.loss else "; no loss logged")
            pretraining = f"run {arm.pretrain_run[:8]} ({arm.pretrain_status.lower()}){loss}"
        elif arm.kind == "random":
            pretraining = "none: untrained floor"
        elif arm.kind == "model":
            pretraining = "none: a published model"
        elif arm.status == "failed":
            pretraining = "none"
        else:
            pretraining = "no run under this experiment (its output is shared with another arm's, or was reused)"
        error = arm.error if arm.status == "failed" else ""
        out.append(f'<tr data-arm="{esc(arm.name)}" data-status="{esc(status)}" data-kind="{esc(arm.kind)}">'
                   f'<td class="model">{_swatch(colours[arm.name])}{esc(arm.name)}{badge}</td>'
                   f"<td>{esc(KIND_TEXT.get(arm.kind, arm.kind or '?'))}</td>"
                   f'<td class="{esc(status)}">{esc(status + where)}</td><td>{esc(pretraining)}</td>'
                   f"<td>{'yes' if arm.name in in_sweep else 'no'}</td><td class=\"error\">{esc(error)}</td></tr>")
    out.append("</tbody></table>")
    extra = [m for m in in_sweep if m not in exp.arms]
    if extra:
        out.append(f'<p class="notes">Also in the sweep (compare_models, not arms): {esc(", ".join(sorted(extra)))}.'
                   "</p>")
    return "\n".join(out)


def _cost_section(exp: Experiment, colours: dict[str, str]) -> str:
    """Each arm's stages: wall time and device time (CPUs or GPUs held x wall), the arm's total, and the
    whole sweep; a stage made by an earlier run and reused says so (its cost is what it cost then)."""
    esc = html.escape
    if not any(exp.costs.values()):
        return ('<h2>Cost</h2><p class="missing">No stage costs recorded for this experiment (a run from before '
                "they were).</p>")
    out = ['<h2>Cost</h2><p class="notes">Wall time and device time (the CPUs or GPUs a stage held × its wall '
           "time; a data stage is charged the Ray cluster's CPUs, an upper bound). A stage reused from an earlier "
           "run shows what it cost when it was made; an output shared by arms counts in each.</p>",
           '<table class="blue cost" id="cost"><thead><tr><th class="model">Arm</th><th>Stage</th><th>Wall</th>'
           "<th>Device time</th><th>Held</th><th>Note</th></tr></thead><tbody>"]
    for owner, rows in exp.costs.items():
        if not rows:
            continue
        swatch = _swatch(colours[owner]) if owner in colours else ""
        totals: dict[str, float] = {}
        for i, row in enumerate(rows):
            device = str(row.get("device", "CPU"))
            totals[device] = totals.get(device, 0.0) + float(row.get("device_h", 0.0))
            wall = float(row.get("wall_s", 0.0))
            note = cost_note(row)  # the summary's words
            head = (f'<td class="model" rowspan="{len(rows) + 1}">{swatch}{esc(owner)}</td>' if i == 0 else "")
            out.append(f'<tr data-owner="{esc(owner)}" data-stage="{esc(str(row.get("stage", "")))}">{head}'
                       f"<td>{esc(str(row.get('stage', '')))}</td><td>{'-' if wall < 0 else esc(duration(wall))}</td>"
                       f"<td>{float(row.get('device_h', 0.0)):.3f} {esc(device)}-h</td>"
                       f"<td>{float(row.get('units', 0.0)):g} {esc(device)}</td><td>{esc(note)}</td></tr>")
        total = ", ".join(f"{h:.3f} {esc(d)}-h" for d, h in totals.items())
        out.append(f'<tr class="total" data-owner="{esc(owner)}"><td>total</td><td></td><td>{total}</td>'
                   "<td></td><td></td></tr>")
    out.append("</tbody></table>")
    return "\n".join(out)


def _failure_notes(exp: Experiment) -> list[str]:
    return [f"Arm {a.name} failed" + (f" in {a.stage}" if a.stage else "") + (f": {a.error}" if a.error else "")
            for a in exp.arms.values() if a.status == "failed"]


def _blue_table(exp: Experiment):
    """The seed 000 table of the sweep's results (None before the sweep ran): built once per page."""
    from orchestrator.report.table import build_table  # the report's package: loaded for a page, not for --help

    return build_table(exp.results, source=f"{exp.tracking_uri} run {exp.sweep_run}") if exp.results else None


def _table_section(exp: Experiment, table) -> str:
    from orchestrator.report.pages import selection_html, table_html  # loaded for a page, not for --help

    if table is None:
        return '<h2>Results</h2><p class="missing">No sweep results yet.</p>'
    parts = ["<h2>Results (seed 000 layout: mean (sd) over seeds, x 100)</h2>",
             table_html(table, _failure_notes(exp))]
    tasks = [c for c in table.columns if c.kind == "task"]
    if any(table.cell(m, c.key).selected for m in table.models for c in tasks):
        parts.append(selection_html(table))
    return "\n".join(parts)


def _sources_section(exp: Experiment, table) -> str:
    """Seed 004's analysis, when the arms' sources were scored: each arm's measures and gain, and the
    Pearson r and Spearman rho of each measure with the gains (``orchestrator.report.sources``)."""
    if not exp.source_scores:
        return ""
    from orchestrator.report.pages import SOURCES_TITLE, sources_html  # loaded for a page, not for --help

    if not (exp.comparison and exp.comparison.get("sources")):
        return (f"<h2>{html.escape(SOURCES_TITLE)}</h2><p class=\"missing\">Sources of {len(exp.source_scores)} "
                "arm(s) were scored; their correlation with the gains needs the paired differences.</p>")
    return sources_html(exp.comparison["sources"], table.scale, table.digits)


def _retrieval_section(exp: Experiment) -> str:
    """Seed 002's Table 6, when the arms' encoders were evaluated on parallel text
    (``orchestrator.retrieval.table``: the report's own rendering)."""
    if not exp.retrieval:
        return ""
    return f"<style>{RETRIEVAL_CSS}</style>\n" + retrieval_html(exp.retrieval)


def _replicates_section(exp: Experiment, table) -> str:
    """The report's "Paired differences at each pretraining seed", where arms have replicates (``<arm>_s<seed>``)."""
    from orchestrator.report.replicates import replicates_html  # the report's package: loaded for a page

    doc = (exp.comparison or {}).get("replicates")
    return replicates_html(table, doc) if doc and table is not None else ""


# ---------------------------------------------------------------------------------------------
# Paired differences: an interval plot per column, and the numbers
def _differences_section(exp: Experiment) -> str:
    esc = html.escape
    head = f"<h2>Paired differences vs {esc(exp.baseline)}</h2>" if exp.baseline else "<h2>Paired differences</h2>"
    comp = exp.comparison
    if comp is None:
        return head + '<p class="missing">No paired differences (see the notes above).</p>'
    scale = 100.0
    level = f"{comp['ci_level'] * 100:g} %"
    out = [head, f'<p class="notes">Each point is the mean over seeds of (arm \u2212 {esc(comp["baseline"])}) in '
                 f"points (scores x 100), paired by seed (by fold for cross-validated tasks); the bar is its {level} "
                 f"percentile bootstrap interval ({comp['n_boot']} resamples of the pairs). * marks p &lt; "
                 f"{comp['alpha']:g} in a two-sided paired t-test; green: significantly better, red: significantly "
                 "worse (for a metric where lower is better a negative difference is better). Summary columns "
                 "compare per-seed macro averages.</p>", '<div class="panels" id="difference-plots">']
    arms = list(comp["rows"])
    for column in comp["columns"]:
        entries = [(arm, comp["rows"][arm].get(column["key"])) for arm in arms]
        if any(e for _, e in entries):
            out.append(interval_panel(column, entries, scale))
    out.append("</div>")
    out.append('<table class="blue" id="differences"><thead><tr><th class="model">Arm</th><th>Column</th>'
               f"<th>Metric</th><th>n</th><th>\u0394 (points)</th><th>{level} interval</th><th>p</th><th></th>"
               "</tr></thead><tbody>")
    partial = False
    for arm in arms:
        for column in comp["columns"]:
            e = comp["rows"][arm].get(column["key"])
            if not e:
                continue
            sig = "true" if e["significant"] else "false"
            ci = "\u2013" if not e["ci"] else f"[{signed(e['ci'][0] * scale)}, {signed(e['ci'][1] * scale)}]"
            p = "\u2013" if e["p"] is None else esc(p_text(e["p"], comp["alpha"]))
            diff = "\u2013" if e["mean_diff"] is None else signed(e["mean_diff"] * scale)
            if e.get("partial"):  # a summary column over the tasks both have (an augmented arm's NER tasks)
                diff += DAGGER
                partial = True
            mark = "*" if e["significant"] else ""
            arrow = "" if column["higher_is_better"] else " (\u2193)"
            said = [e["note"]] if e.get("note") else []
            if e.get("partial"):
                said.append(f"partial: averages {', '.join(e.get('tasks') or [])} only")
            title = f' title="{esc("; ".join(said))}"' if said else ""
            out.append(f'<tr data-arm="{esc(arm)}" data-column="{esc(column["key"])}" data-significant="{sig}"{title}>'
                       f'<td class="model">{esc(arm)}</td><td class="{column["kind"]}">{esc(column["label"])}</td>'
                       f'<td>{esc(column["metric"])}{arrow}</td><td>{e["n"]}</td><td>{diff}</td><td>{ci}</td>'
                       f'<td>{p}</td><td class="sig">{mark}</td></tr>')
    out.append("</tbody></table>")
    if partial:
        out.append(f'<p class="notes">{DAGGER} the column averages only the tasks both have with per-seed scores '
                   "(the row's tooltip names them), not the whole column: not comparable with the other rows.</p>")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# Line plots
def _loss_section(exp: Experiment, colours: dict[str, str]) -> str:
    esc = html.escape
    series = [Series(a.name, colours[a.name], thin(a.loss)) for a in exp.arms.values() if a.loss]
    out = ["<h2>Pretraining loss</h2>"]
    if not series:
        out.append('<p class="missing">No arm has a pretraining loss in this store.</p>')
    else:
        out.append(line_plot(series, "pretraining-loss", "training loss per step, all arms", "step", "loss",
                              width=760, height=340))
    without = [a.name for a in exp.arms.values() if not a.loss]
    if series and without:
        out.append(f'<p class="notes">Not on the plot (no pretraining loss logged under this experiment): '
                   f"{esc(', '.join(without))}.</p>")
    return "\n".join(out)


def _curves_section(exp: Experiment, colours: dict[str, str]) -> str:
    out = ["<h2>Fine-tuning learning curves</h2>"]
    results = exp.results
    if not results:
        out.append('<p class="missing">No sweep results yet.</p>')
        return "\n".join(out)
    out.append('<p class="notes">Per task, the score (x 100) after each epoch at the learning rate selected on dev '
               "(mean over seeds): dev solid, test dashed; the ringed dev point is the epoch count selected on dev."
               "</p>")
    out.append('<div class="panels" id="finetune-curves">')
    found = False
    for task in in_blue_order(results["tasks"]):  # the report's order
        series = []
        for model in results["models"]:
            cell = (results["cells"].get(model) or {}).get(task["name"]) or {}
            curve = sorted(cell.get("curve") or [], key=lambda p: p["epoch"])
            chosen = (cell.get("selected") or {}).get("epochs")
            for split, dashed in (("dev", False), ("test", True)):
                pts = [(p["epoch"], p[split] * 100) for p in curve if is_number(p.get(split))]
                if pts:
                    series.append(Series(model, colours.get(model, "#000"), pts, dashed, split,
                                         chosen if split == "dev" and is_number(chosen) else None))
        if series:
            found = True
            arrow = "" if task.get("higher_is_better", True) else ", lower is better"
            out.append(line_plot(series, f"curves-{task['name']}", f"{task['name']} ({task.get('metric', '')}"
                                  f"{arrow})", "epoch", "score", width=380, height=260, integer_x=True,
                                  data_task=task["name"]))
    out.append("</div>")
    if not found:
        out.append('<p class="missing">No cell of the sweep has a per-epoch curve.</p>')
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python dashboards/experiment_page.py",
        description="Write one static HTML page comparing an experiment's arms, read from MLflow alone: arms and "
                    "their status, the seed 000 table, paired differences vs the baseline arm (95 % bootstrap "
                    "intervals, p-values), pretraining loss curves and fine-tuning curves. No network needed to "
                    "build or open it.",
        epilog="examples:\n  python dashboards/experiment_page.py --tracking-uri sqlite:///runs/exp/mlflow.db "
               "--out page.html\n  python dashboards/experiment_page.py --run-dir runs/exp     "
               "# -> runs/exp/report/experiment.html",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tracking-uri", help="MLflow tracking URI (default with --run-dir: sqlite:///<run_dir>/mlflow.db)")
    p.add_argument("--run-dir", type=Path, help=f"a blue_sweep run directory: its store, and <run_dir>/{PAGE_PATH} "
                                                "as the default output")
    p.add_argument("--out", type=Path, help="the HTML file to write")
    p.add_argument("--run-id", default=None, help="the experiment's parent run id (default: the newest run tagged "
                                                  f"{S.KIND}={S.KIND_EXPERIMENT} in the store)")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    args = p.parse_args(argv)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # a results.json: no progress bar
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    if not (args.tracking_uri or args.run_dir):
        p.error("give --tracking-uri or --run-dir")
    if not (args.out or args.run_dir):
        p.error("give --out (or --run-dir, which writes <run_dir>/report/experiment.html)")
    uri = args.tracking_uri or local_uri(args.run_dir)
    out = args.out or args.run_dir / PAGE_PATH
    try:
        # both given: a store several run directories share, whose newest experiment may be another one's
        shared = args.run_dir if args.tracking_uri and args.run_dir and uri != local_uri(args.run_dir) else None
        path = build_page(uri, out, args.run_id, run_dir=shared)
    except OrchestratorError as exc:
        print(redacted(f"error: {exc}"), file=sys.stderr)
        return 2
    print(f"experiment page: {path.resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
