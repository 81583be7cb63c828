"""The report's figures (PNG, matplotlib): the BLUE table as an image, the fine-tuning learning
curves and seed 004's source-analysis figures (each measure against the gain; the correlation matrix).

    render_table_png(build_table(results), Path("blue_table.png"))
    render_curves_png(results, Path("curves.png"))            # None when no cell has a curve
    render_figures(doc, out_dir)                              # {"scatter": ..., "matrix": ...}

Each draws a model it is given and computes no number; matplotlib is imported inside the functions.
"""
from __future__ import annotations

import base64
import math
from pathlib import Path

from orchestrator.core.config import is_number
from orchestrator.core.results import in_blue_order, metric_name
from orchestrator.report.sources import GAIN, POOLED, SOURCE_MEASURES
from orchestrator.report.table import DAGGER, BlueTable

#: The source analysis's figures, by kind (beside the report's other files).
SOURCE_FIGURES = {"scatter": "sources_scatter.png", "matrix": "sources_matrix.png"}


def plain_text(text: str) -> str:
    """A name as matplotlib draws it as typed: a ``$`` pair is otherwise mathtext (``pub$x$`` drew as "pubx")."""
    return text.replace("$", r"\$")


# ---------------------------------------------------------------------------------------------
# The BLUE table and the learning curves
def render_table_png(table: BlueTable, path: Path, title: str = "BLUE results") -> Path:
    """The table as an image: bold for best, mathtext underline for second best."""
    import matplotlib  # heavy: matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # heavy: matplotlib

    # each task's metric as BLUE's tables name it under its name, as the HTML header has it (probe B4)
    header = ["Model"] + [plain_text(c.label) + (f"\n{plain_text(metric_name(c.metric))}" if c.metric else "")
                          for c in table.columns]
    rows, ranks = [], []
    for model in table.models:
        row, rrow = [plain_text(model)], [None]
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
    fig, ax = plt.subplots(figsize=(width, 0.3 * (len(rows) + 2)))
    ax.axis("off")
    ax.set_title(title, fontsize=11)
    tab = ax.table(cellText=rows, colLabels=header, cellLoc="center", bbox=[0, 0, 1, 1])
    tab.auto_set_font_size(False)
    tab.set_fontsize(8)
    tab.auto_set_column_width(list(range(len(header))))
    for (r, c), cell in tab.get_celld().items():
        if r == 0:
            cell.set_text_props(weight="bold")
            cell.set_height(2 * cell.get_height())  # two lines: the name and the metric
        elif ranks[r - 1][c] == 1:
            cell.set_text_props(weight="bold")
    fig.savefig(path, dpi=150, bbox_inches="tight", pad_inches=0.2)
    plt.close(fig)
    return path


def render_curves_png(results: dict, path: Path) -> Path | None:
    """One panel per task: dev (solid) and test (dashed) score per epoch, one colour per model.

    The epoch chosen on dev (``selected.epochs``) is marked. Returns None when no cell has a curve.
    """
    tasks = [t for t in in_blue_order(results["tasks"])
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
                    ax.plot(xs, ys, style, color=colour, marker="o", markersize=3,
                            label=plain_text(f"{model} {split}"))
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
# Seed 004's source analysis
def render_scatter_png(doc: dict, path: str | Path, scale: float = 100.0) -> Path:
    """One panel per measure: the gain (x ``scale``) of every (arm, task, seed) point against the arm's
    measure on that task's text, a colour per task, each (arm, task) mean as a labelled larger marker;
    the panel's title gives the pooled r, rho, n and arms."""
    import matplotlib  # heavy: matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # heavy: matplotlib
    from matplotlib.ticker import NullFormatter

    points = [p for p in doc["points"] if p["column"] != "total"]
    columns = list(dict.fromkeys(p["column"] for p in points))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axes = plt.subplots(1, len(SOURCE_MEASURES), figsize=(4.0 * len(SOURCE_MEASURES), 3.6), squeeze=False)
    for ax, measure in zip(axes.flat, SOURCE_MEASURES):
        for k, column in enumerate(columns):
            pts = [p for p in points if p["column"] == column]
            colour = colours[k % len(colours)]
            ax.scatter([p[measure] for p in pts], [p[GAIN] * scale for p in pts], s=12, alpha=0.45, color=colour,
                       label=column)
            for arm in dict.fromkeys(p["arm"] for p in pts):
                mine = [p for p in pts if p["arm"] == arm]
                x, y = mine[0][measure], sum(p[GAIN] for p in mine) / len(mine) * scale
                ax.scatter([x], [y], s=60, marker="D", color=colour, edgecolors="black", linewidths=0.6)
                ax.annotate(arm, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        if measure == "ppl" and points and min(p["ppl"] for p in points) > 0:
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(NullFormatter())  # 2-3 decades at most: the major ticks say enough
        ax.axhline(0.0, color="#888", linewidth=0.8)
        c = doc["correlations"][POOLED][measure]
        stats = (f"r={c['r']:+.2f}" if c["r"] is not None else "r undefined") + \
                (f", \u03c1={c['rho']:+.2f}" if c["rho"] is not None else "") + f", n={c['n']} ({c['arms']} arms)"
        ax.set_title(f"{measure.upper()} ({SOURCE_MEASURES[measure]})\n{stats}", fontsize=9)
        ax.set_xlabel(measure.upper())
        ax.grid(alpha=0.3)
    axes.flat[0].set_ylabel(f"gain vs {doc['baseline']} (x {scale:g})")
    if columns:
        axes.flat[0].legend(fontsize=6)
    fig.suptitle("Source measure vs gain per (arm, task, seed); diamonds: the arm's mean per task", fontsize=10)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def render_matrix_png(doc: dict, path: str | Path) -> Path:
    """Seed 004's Figure 3: the Pearson correlation between the measures and the gain as a heat map,
    each cell printed (\u2013 where undefined)."""
    import matplotlib  # heavy: matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # heavy: matplotlib
    import numpy as np  # heavy: numpy

    names = [n.upper() if n != GAIN else "\u0394 (gain)" for n in doc["matrix"]["variables"]]
    values = np.array([[np.nan if v is None else v for v in row] for row in doc["matrix"]["pearson"]], dtype=float)
    fig, ax = plt.subplots(figsize=(4.8, 4.2))
    image = ax.imshow(np.ma.masked_invalid(values), cmap="RdBu_r", vmin=-1, vmax=1)
    ax.set_xticks(range(len(names)), names, fontsize=8)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    for i in range(len(names)):
        for j in range(len(names)):
            v = values[i, j]
            ax.text(j, i, "\u2013" if np.isnan(v) else f"{v:.2f}", ha="center", va="center", fontsize=8,
                    color="white" if not np.isnan(v) and abs(v) > 0.6 else "black")
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    m = doc["matrix"]
    ax.set_title(f"Pearson r over {m['n']} points ({m['units']} (arm, task) values)", fontsize=9)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def render_figures(doc: dict, out_dir: Path, scale: float = 100.0) -> dict[str, Path]:
    """Both figures into ``out_dir`` (``SOURCE_FIGURES`` names)."""
    return {"scatter": render_scatter_png(doc, Path(out_dir) / SOURCE_FIGURES["scatter"], scale),
            "matrix": render_matrix_png(doc, Path(out_dir) / SOURCE_FIGURES["matrix"])}


def embedded(paths: dict[str, Path]) -> dict[str, str]:
    """{kind: base64 of the PNG} for ``sources_html``."""
    return {kind: base64.b64encode(Path(p).read_bytes()).decode("ascii") for kind, p in paths.items()}
