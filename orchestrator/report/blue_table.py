"""The BLUE report of a sweep as seed 000 prints it (Tables 6, 7, A3), plus learning curves: the files.

    paths = write_report(results, Path("runs/demo/report"))
    # {"md": .../blue_table.md, "html": .../blue_table.html, "png": .../blue_table.png,
    #  "curves": .../curves.png, "results": .../results.json, "manifest": .../manifest.json}

``results`` is the ``sweep/results.json`` document of docs/ARCHITECTURE.md. The numbers come from
the models (``orchestrator.report.table``: the ranked table; ``orchestrator.report.compare``: the
paired differences; ``orchestrator.report.sources``: seed 004's analysis), the text from
``orchestrator.report.pages`` (Markdown, HTML) and the images from ``orchestrator.report.figures``
(PNG); this module writes them all into one folder that appears complete or not at all.

With ``baseline=<model>`` (and two or more models) the report adds "Paired differences vs
<baseline>": per model and column the mean difference over seeds with its bootstrap interval,
``*`` when the paired t-test gives p < 0.05, the p-values in a second table (Markdown) or each
cell's title (HTML); and seed 001's NER before/after tables. Their numbers are written as
``comparison.json``.
"""
from __future__ import annotations

import base64
import logging
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from orchestrator.core.manifest import atomic_dir, atomic_write_json, atomic_write_text, write_manifest
from orchestrator.core.reuse import output_lock
from orchestrator.report.compare import check_baseline, comparison_document
from orchestrator.report.figures import embedded, render_curves_png, render_figures, render_table_png
from orchestrator.report.pages import render_html, render_markdown
from orchestrator.report.replicates import replicate_differences, replicates_html, replicates_markdown
from orchestrator.report.sources import source_correlations
from orchestrator.report.table import build_table

log = logging.getLogger(__name__)

FILES = {"md": "blue_table.md", "html": "blue_table.html", "png": "blue_table.png", "curves": "curves.png",
         "results": "results.json", "comparison": "comparison.json"}
#: Files other tools write into a report's folder, which a new report keeps: the experiment page
#: (``dashboards.experiment_page.PAGE_PATH``; ``jobs/report.py --run-dir`` dropped it: a probe, session 47)
KEPT = ("experiment.html",)


def write_report(results: dict, out_dir: Path, title: str = "BLUE results", scale: float = 100.0,
                 digits: int = 1, source: str | Path = "results.json", baseline: str | None = None,
                 notes: Sequence[str] = (), source_scores: dict[str, dict] | None = None,
                 sections: Sequence[tuple[str, str]] = (), documents: Mapping[str, Any] | None = None
                 ) -> dict[str, Path]:
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
    ``documents`` are JSON files written beside them, by file name (an experiment's ``training_data.json``, the
    rows of its training-data section, which a report rebuilt from MLflow reads back), each returned as a kind
    of its name without ``.json``.
    """
    out_dir = Path(out_dir)
    table = build_table(results, scale=scale, digits=digits, source=source)
    comparison = None
    if baseline is not None:
        check_baseline(results, baseline, source)
        if len(table.models) >= 2:
            comparison = comparison_document(results, baseline, source=source)
            replicates = replicate_differences(results, comparison)
            if replicates is not None:  # arms replicated at other pretraining seeds (<arm>_s<seed>)
                comparison["replicates"] = replicates
                sections = [(replicates_markdown(table, replicates), replicates_html(table, replicates)),
                            *sections]
            if source_scores:
                comparison["sources"] = source_correlations(comparison, source_scores)
        else:
            log.info("one model only: no paired differences against %s", baseline)
    # two writers of one report (two jobs on a run directory, or one and jobs/report.py): one at a time (the other's
    # replace failed as "unexpected FileNotFoundError (a bug)": a probe, session 46)
    with output_lock(out_dir), atomic_dir(out_dir, "report") as tmp:
        written = {"md": FILES["md"], "html": FILES["html"], "png": FILES["png"], "results": FILES["results"]}
        curves = render_curves_png(results, tmp / FILES["curves"])
        if curves is not None:
            written["curves"] = FILES["curves"]
        curves_png = base64.b64encode(curves.read_bytes()).decode("ascii") if curves else None
        figures = None
        if comparison is not None and comparison.get("sources"):
            drawn = render_figures(comparison["sources"], tmp, scale)
            written.update({f"sources_{kind}": path.name for kind, path in drawn.items()})
            figures = embedded(drawn)
        atomic_write_text(tmp / FILES["md"], render_markdown(table, title, curves=written.get("curves"),
                                                             comparison=comparison, notes=notes,
                                                             sections=[md for md, _ in sections]))
        atomic_write_text(tmp / FILES["html"], render_html(table, title, curves_png=curves_png, comparison=comparison,
                                                           notes=notes, source_figures=figures,
                                                           sections=[h for _, h in sections]))
        render_table_png(table, tmp / FILES["png"], title)
        atomic_write_json(tmp / FILES["results"], results)
        for name, document in (documents or {}).items():
            atomic_write_json(tmp / name, document)
            written[name.removesuffix(".json")] = name
        config = {"title": title, "scale": scale, "digits": digits, "source": str(source), "baseline": baseline}
        if comparison is not None:
            atomic_write_json(tmp / FILES["comparison"], comparison)
            written["comparison"] = FILES["comparison"]
            config.update(alpha=comparison["alpha"], n_boot=comparison["n_boot"])
        for name in KEPT:
            if (out_dir / name).is_file() and not (tmp / name).exists():
                shutil.copy2(out_dir / name, tmp / name)
        write_manifest(tmp, stage="report", config=config, seed=comparison["seed"] if comparison else None,
                       counts={"models": len(table.models), "tasks": len(results["tasks"]),
                               "columns": len(table.columns)},
                       extra={"files": sorted(written.values())})
        written["manifest"] = "manifest.json"
    paths = {kind: out_dir / name for kind, name in written.items()}
    log.info("report written: %s", paths["html"])
    return paths
