"""One HTML page per experiment, built from MLflow alone: arms, the seed 000 table, paired
differences against the baseline arm, pretraining loss curves and fine-tuning curves.

    python dashboards/experiment_page.py --tracking-uri sqlite:///runs/exp/mlflow.db --out page.html
    python dashboards/experiment_page.py --run-dir runs/exp          # -> runs/exp/report/experiment.html

    build_page("sqlite:///runs/exp/mlflow.db", "page.html")          # the newest experiment in the store
    build_page(uri, "page.html", experiment_run_id="3f2a...")         # one experiment's parent run

What is read (names from ``orchestrator.track.schema``): the experiment's parent run (tagged
``orchestrator.kind=experiment``; the newest one unless a run id is given) and its tags naming
the arms, the baseline and each arm's status; its children: each arm's pretraining run (tag
``arm``, per-step training loss) and the sweep's parent run, whose results document
``orchestrator.report.mlflow_results`` rebuilds. The table is ``orchestrator.report.blue_table``'s,
the differences ``orchestrator.report.compare``'s: nothing is computed twice.

The page is one static file: inline CSS and inline SVG plots, no script, no font or image from
anywhere (its Content-Security-Policy forbids every load, so a browser would say so if one crept
in). Missing pieces are said where they would be: a failed arm (with its error), an arm without a
pretraining run (the untrained floor, a published model, or an output shared with another arm),
an experiment whose sweep has not run yet, a baseline without results.
"""
from __future__ import annotations

import argparse
import html
import json
import logging
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from dashboards.svg import Series, interval_panel, line_plot, signed, thin
from orchestrator.core.config import is_number
from orchestrator.core.cost import duration
from orchestrator.core.errors import OrchestratorError
from orchestrator.core.manifest import atomic_write_text
from orchestrator.retrieval.table import CSS as RETRIEVAL_CSS
from orchestrator.retrieval.table import RESULTS as RETRIEVAL_RESULTS
from orchestrator.retrieval.table import render_html as retrieval_html
from orchestrator.track import local_uri
from orchestrator.track import schema as S

log = logging.getLogger(__name__)

#: Where jobs/blue_sweep.py writes the page, under the run directory.
PAGE_PATH = Path("report") / "experiment.html"
#: Arm colours, the same arm in the same colour on every plot (matplotlib's tab10).
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")
KIND_TEXT = {"pretrain": "pretrained", "random": "untrained floor (random init)", "model": "published model"}
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"


# ---------------------------------------------------------------------------------------------
# What the page shows, read from MLflow
@dataclass
class Arm:
    name: str
    kind: str = ""  # pretrain | random | model ("" when the store does not say)
    status: str = ""  # ok | failed | pending ("" when the store does not say)
    stage: str = ""  # the stage that failed
    error: str = ""
    pretrain_run: str = ""  # run id of its pretraining run, "" without one
    pretrain_status: str = ""  # FINISHED, FAILED, RUNNING ...
    loss: list[tuple[int, float]] = field(default_factory=list)  # (step, training loss)


@dataclass
class Experiment:
    tracking_uri: str
    run_id: str
    name: str
    status: str
    started: float | None  # seconds since the epoch
    baseline: str
    arms: dict[str, Arm]
    sweep_run: str = ""
    results: dict | None = None
    results_source: str = ""
    comparison: dict | None = None
    source_scores: dict[str, dict] = field(default_factory=dict)  # arm -> seed 004 scores (its selection run)
    retrieval: dict | None = None  # seed 002's retrieval results document (its newest retrieval run's)
    notes: list[str] = field(default_factory=list)  # what could not be shown, and why
    costs: dict[str, list[dict]] = field(default_factory=dict)  # arm (or the sweep) -> its stages' costs
    git_commit: str = ""


def check_store(tracking_uri: str) -> None:
    """A SQLite store must exist: MLflow would otherwise create an empty one and find nothing."""
    if tracking_uri.startswith("sqlite:///"):
        path = Path(tracking_uri[len("sqlite:///"):])
        if not path.is_file():
            raise OrchestratorError(f"no MLflow store at {tracking_uri} ({path} does not exist): give the "
                                    "mlflow.db of a run directory, e.g. sqlite:///runs/<name>/mlflow.db")


def find_experiment_run(client, run_id: str | None = None):
    """The experiment's parent run: ``run_id`` if given (it must be an experiment's), else the newest
    run of any MLflow experiment in the store tagged ``orchestrator.kind=experiment``."""
    from mlflow.exceptions import MlflowException  # heavy: mlflow

    where = client.tracking_uri
    if run_id:
        try:
            run = client.get_run(run_id)
        except MlflowException as exc:
            raise OrchestratorError(f"run {run_id} not found at {where} ({exc.message})") from None
        kind = run.data.tags.get(S.KIND, "")
        if kind != S.KIND_EXPERIMENT:
            raise OrchestratorError(f"run {run_id} at {where} is not an experiment's parent run "
                                    f"({S.KIND}={kind or 'unset'}, expected {S.KIND_EXPERIMENT})")
        return run
    ids = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(ids, filter_string=f"tags.`{S.KIND}` = '{S.KIND_EXPERIMENT}'",
                              order_by=["attributes.start_time DESC"], max_results=1) if ids else []
    if not runs:
        raise OrchestratorError(f"no experiment run at {where}: no run is tagged {S.KIND}={S.KIND_EXPERIMENT}. "
                                "An experiment is a jobs/blue_sweep.py run with arms: (docs/EXPERIMENTS.md); a "
                                "plain sweep's report is jobs/report.py")
    return runs[0]


def load_experiment(tracking_uri: str, experiment_run_id: str | None = None, *, n_boot: int = 10000) -> Experiment:
    """Everything the page shows, from the store at ``tracking_uri``."""
    from mlflow import MlflowClient  # heavy: mlflow

    check_store(tracking_uri)
    client = MlflowClient(tracking_uri)
    parent = find_experiment_run(client, experiment_run_id)
    pid, tags, params = parent.info.run_id, parent.data.tags, parent.data.params
    children = client.search_runs([parent.info.experiment_id], filter_string=f"tags.`{S.PARENT}` = '{pid}'",
                                  order_by=["attributes.start_time DESC"], max_results=5000)
    pretrains = [r for r in children if r.data.tags.get(S.KIND) == S.KIND_PRETRAIN]
    scores: dict[str, dict] = {}
    sweeps = [r for r in children if r.data.tags.get(S.KIND) == S.KIND_SWEEP]
    for run in children:  # newest first: an arm keeps its newest scores
        arm = run.data.tags.get(S.ARM)
        if run.data.tags.get(S.KIND) == S.KIND_SELECTION and arm and arm not in scores:
            scores[arm] = S.read_source_metrics(run.data.metrics)
    # orchestrator.workflows.blue_sweep names the run "experiment:<run_name>"
    name = (parent.info.run_name or pid[:8]).removeprefix(f"{S.KIND_EXPERIMENT}:")
    exp = Experiment(tracking_uri=tracking_uri, run_id=pid, name=name,
                     status=parent.info.status, started=(parent.info.start_time or 0) / 1000 or None,
                     baseline=tags.get(S.BASELINE_TAG) or params.get(S.BASELINE, ""), arms=_arms(tags, params),
                     costs=S.read_cost_tags(tags))
    for run in pretrains:  # newest first: an arm keeps its newest pretraining run
        name = run.data.tags.get(S.ARM)
        if not name:
            continue
        arm = exp.arms.setdefault(name, Arm(name))
        if not arm.pretrain_run:
            arm.pretrain_run, arm.pretrain_status = run.info.run_id, run.info.status
            arm.kind = arm.kind or "pretrain"
            arm.loss = _history(client, run.info.run_id, S.PRETRAIN_LOSS)
    if sweeps:
        _load_sweep(exp, sweeps[0], n_boot=n_boot)
        if len(sweeps) > 1:
            exp.notes.append(f"{len(sweeps)} sweeps ran under this experiment (its sweep settings changed between "
                             f"runs): the newest, run {sweeps[0].info.run_id[:8]}, is shown")
    else:
        exp.notes.append("no sweep under this experiment yet: the table, the differences and the fine-tuning "
                         "curves appear once the arms' models are fine-tuned")
    for model in (exp.results or {}).get("models", []):
        arm = exp.arms.get(model)
        if arm is not None and not arm.status:
            arm.status = "ok"  # an older run without status tags: in the sweep, so it finished
    exp.source_scores = scores
    retrievals = [r for r in children if r.data.tags.get(S.KIND) == S.KIND_RETRIEVAL]
    if retrievals:  # newest first: every arm's encoder is in one output, whose document each run carries
        exp.retrieval = _retrieval_results(client, retrievals[0], exp.notes)
    if scores and exp.comparison is not None:
        from orchestrator.report.sources import source_correlations  # heavy: scipy

        exp.comparison["sources"] = source_correlations(exp.comparison, scores)
    if not exp.baseline and exp.arms:
        exp.baseline = next(iter(exp.arms))
    return exp


def _arms(tags: dict[str, str], params: dict[str, str]) -> dict[str, Arm]:
    """The arms in config order with their status, from the parent's tags (or, for a run logged
    before those tags existed, the arm names its params hold)."""
    names = [n for n in tags.get(S.ARMS, "").split(",") if n]
    if not names:  # params arm.<name>.<key>: an arm without overrides is only found by its runs
        names = list(dict.fromkeys(k[len(S.ARM_PARAM_PREFIX):].split(".")[0] for k in params
                                   if k.startswith(S.ARM_PARAM_PREFIX)))
    arms = {}
    for name in names:
        got = {f: tags.get(S.arm_tag(name, f), "") for f in S.ARM_FIELDS}
        arms[name] = Arm(name, kind=got["kind"], status=got["status"], stage=got["stage"], error=got["error"])
    return arms


def _history(client, run_id: str, key: str) -> list[tuple[int, float]]:
    """A metric per step (the last value logged at a step wins: a resumed run logs some steps again)."""
    by_step: dict[int, tuple[int, float]] = {}
    for m in client.get_metric_history(run_id, key):
        if math.isfinite(m.value) and (m.step not in by_step or m.timestamp >= by_step[m.step][0]):
            by_step[m.step] = (m.timestamp, m.value)
    return [(step, by_step[step][1]) for step in sorted(by_step)]


def _retrieval_results(client, run, notes: list[str]) -> dict | None:
    """The results document (``results.json``) a retrieval run carries as an artifact, checked against
    the run's own metrics (a document that disagrees with them is not shown)."""
    with tempfile.TemporaryDirectory() as tmp:
        try:
            doc = json.loads(Path(client.download_artifacts(run.info.run_id, RETRIEVAL_RESULTS, tmp)).read_text())
        except Exception as exc:  # a store whose artifacts are gone, or a run logged without them
            notes.append(f"cross-lingual retrieval run {run.info.run_id[:8]}: its {RETRIEVAL_RESULTS} could not be "
                         f"read ({type(exc).__name__}): no retrieval table")
            return None
    model = run.data.tags.get(S.MODEL, "")
    logged = S.read_retrieval_metrics(run.data.metrics)
    if any(doc.get(k, {}).get(model) != v for k, v in logged.items()):
        notes.append(f"cross-lingual retrieval run {run.info.run_id[:8]}: its {RETRIEVAL_RESULTS} does not match "
                     "its metrics: no retrieval table")
        return None
    return doc


def _load_sweep(exp: Experiment, sweep, *, n_boot: int) -> None:
    from orchestrator.report.compare import paired_differences  # heavy: numpy, scipy
    from orchestrator.report.mlflow_results import load_results

    exp.sweep_run = sweep.info.run_id
    exp.git_commit = sweep.data.tags.get(S.GIT_COMMIT, "")
    try:
        found = load_results(exp.tracking_uri, run_id=exp.sweep_run)
    except OrchestratorError as exc:
        exp.notes.append(f"the sweep's results could not be read: {exc}")
        return
    exp.results, exp.results_source = found.results, found.source
    models = found.results["models"]
    if exp.baseline not in models:
        exp.notes.append(f"the baseline arm {exp.baseline!r} has no results: no paired differences")
    elif len(models) < 2:
        exp.notes.append("one model only: no paired differences")
    else:
        exp.comparison = paired_differences(found.results, exp.baseline, n_boot=n_boot,
                                            source=f"{exp.tracking_uri} run {exp.sweep_run}")


# ---------------------------------------------------------------------------------------------
# The page
def build_page(tracking_uri: str, out_path: str | Path, experiment_run_id: str | None = None) -> Path:
    """Read the experiment from MLflow and write its page to ``out_path`` (temp file + rename)."""
    exp = load_experiment(tracking_uri, experiment_run_id)
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
    from orchestrator.report.blue_table import CSS  # heavy: numpy, through orchestrator.report.compare

    esc = html.escape
    colours = _colours(exp)
    title = f"Experiment {exp.name}"
    started = time.strftime("%Y-%m-%d %H:%M", time.localtime(exp.started)) if exp.started else "?"
    meta = [f"MLflow store <code>{esc(exp.tracking_uri)}</code>", f"experiment run <code>{esc(exp.run_id)}</code> "
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
        where = f" in {arm.stage}" if arm.status == "failed" and arm.stage else ""
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
            note = ", ".join(n for n in ("reused" if row.get("reused") else "",
                                         f"shared with {row['shared']}" if row.get("shared") else "") if n)
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
    from orchestrator.report.blue_table import build_table  # heavy: numpy

    return build_table(exp.results, source=f"{exp.tracking_uri} run {exp.sweep_run}") if exp.results else None


def _table_section(exp: Experiment, table) -> str:
    from orchestrator.report.blue_table import selection_html, table_html  # heavy: numpy

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
    from orchestrator.report.blue_table import SOURCES_TITLE, sources_html  # heavy: numpy

    if not (exp.comparison and exp.comparison.get("sources")):
        return (f"<h2>{html.escape(SOURCES_TITLE)}</h2><p class=\"missing\">Sources of {len(exp.source_scores)} "
                "arm(s) were scored; their correlation with the gains needs the paired differences.</p>")
    return sources_html(table, exp.comparison["sources"])


def _retrieval_section(exp: Experiment) -> str:
    """Seed 002's Table 6, when the arms' encoders were evaluated on parallel text
    (``orchestrator.retrieval.table``: the report's own rendering)."""
    if not exp.retrieval:
        return ""
    return f"<style>{RETRIEVAL_CSS}</style>\n" + retrieval_html(exp.retrieval)


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
    for arm in arms:
        for column in comp["columns"]:
            e = comp["rows"][arm].get(column["key"])
            if not e:
                continue
            sig = "true" if e["significant"] else "false"
            ci = "\u2013" if not e["ci"] else f"[{signed(e['ci'][0] * scale)}, {signed(e['ci'][1] * scale)}]"
            p = "\u2013" if e["p"] is None else ("&lt;0.001" if e["p"] < 0.001 else f"{e['p']:.3f}")
            diff = "\u2013" if e["mean_diff"] is None else signed(e["mean_diff"] * scale)
            mark = "*" if e["significant"] else ""
            arrow = "" if column["higher_is_better"] else " (\u2193)"
            title = f' title="{esc(e["note"])}"' if e.get("note") else ""
            out.append(f'<tr data-arm="{esc(arm)}" data-column="{esc(column["key"])}" data-significant="{sig}"{title}>'
                       f'<td class="model">{esc(arm)}</td><td class="{column["kind"]}">{esc(column["label"])}</td>'
                       f'<td>{esc(column["metric"])}{arrow}</td><td>{e["n"]}</td><td>{diff}</td><td>{ci}</td>'
                       f'<td>{p}</td><td class="sig">{mark}</td></tr>')
    out.append("</tbody></table>")
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
    for task in results["tasks"]:
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
                    "their status, the seed 000 table, paired differences vs the baseline arm (95 %% bootstrap "
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
        path = build_page(uri, out, args.run_id)
    except OrchestratorError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"experiment page: {path.resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
