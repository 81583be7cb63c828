"""Arms replicated at other pretraining seeds: the paired differences at each seed, and which recur.

The report's paired differences are over fine-tuning seeds of one pretraining per arm, so they do not hold the
pretraining's own variation; on ``experiments/entity_masking.yaml`` another ``pretrain.seed`` alone moved an arm's
Total by 11 points (session 56). A replicate is another arm: ``<arm>_s<seed>`` is read as ``<arm>`` pretrained
at ``pretrain.seed: <seed>`` (the experiment's ``replicate_seeds`` names them so; they can be written by hand).
Where the baseline has replicates, each arm is compared with the baseline at its own seed and, at each replicate
seed, its replicate with the baseline's: a difference with p < alpha and the same sign at every seed recurs.

Across the seeds, each arm's difference is also estimated with the pretraining seed as the unit (``across_seeds``):
the mean of the per-seed mean differences, a t interval over them and the one-sample t-test's p. Each per-seed
difference holds both pretrainings' variation and the fine-tuning seeds', so their spread estimates the whole
variance of a difference; for a balanced design (the same fine-tuning seeds at every pretraining seed) this is the
test of the arm's effect in the nested random-effects model (pretraining seeds, fine-tuning seeds within them).
With two pretraining seeds it has one degree of freedom: only a large, consistent difference gets p < alpha.
"""
from __future__ import annotations

import html
import math
from collections.abc import Callable
from functools import partial

from orchestrator.core.results import REPLICATE
from orchestrator.report.compare import p_text, paired_differences
from orchestrator.report.pages import md_escape, shown_columns, signed_diff
from orchestrator.report.table import BlueTable

TITLE = "Paired differences at each pretraining seed"
ACROSS = "Across pretraining seeds"


def replicate_differences(results: dict, comparison: dict) -> dict | None:
    """``{"baseline", "seeds": ["own", "s7", ...], "columns", "rows": {arm: {column: {"entries": [...],
    "recurs": bool}}}}``: per arm, its entry of ``comparison`` (``paired_differences`` against the baseline, at the
    arms' own seed), then at each seed the baseline has a replicate at, its replicate's against the baseline's,
    with ``comparison``'s settings (None where it has no replicate there). ``recurs``: at every seed the difference
    has p < alpha, and the same sign. None when the baseline has no replicate, or no other arm has one at a seed
    the baseline has."""
    baseline, alpha = comparison["baseline"], comparison["alpha"]
    settings = {"n_boot": comparison["n_boot"], "seed": comparison["seed"], "alpha": alpha}
    models = list(results["models"])
    at: dict[str, dict[str, str]] = {}  # seed -> arm -> its replicate's model name
    for model in models:
        match = REPLICATE.match(model)
        if match and match["arm"] in models:
            at.setdefault(match["seed"], {})[match["arm"]] = model
    seeds = sorted((s for s in at if baseline in at[s]), key=int)
    arms = [m for m in models if m != baseline and not any(m in group.values() for group in at.values())
            and any(m in at[s] for s in seeds)]
    if not arms:
        return None
    docs = [comparison] + [paired_differences(results, at[s][baseline], models=[at[s][a] for a in arms if a in at[s]],
                                              **settings) for s in seeds]
    names = [{a: a for a in arms}] + [{a: at[s].get(a) for a in arms} for s in seeds]
    rows = {}
    for arm in arms:
        row = {}
        for column in docs[0]["columns"]:
            entries = [doc["rows"].get(name[arm], {}).get(column["key"]) if name[arm] else None
                       for doc, name in zip(docs, names, strict=True)]
            diffs = [e["mean_diff"] for e in entries if e and e["mean_diff"] is not None and e["significant"]]
            row[column["key"]] = {"entries": entries, "recurs": len(diffs) == len(entries) and
                                  (all(d > 0 for d in diffs) or all(d < 0 for d in diffs)),
                                  "across": across_seeds(entries, alpha)}
        rows[arm] = row
    return {"baseline": baseline, "seeds": ["own"] + [f"s{s}" for s in seeds], "alpha": alpha,
            "columns": docs[0]["columns"], "rows": rows}


def across_seeds(entries: list[dict | None], alpha: float) -> dict | None:
    """``{"n", "mean_diff", "low", "high", "p"}`` with the pretraining seed as the unit: the mean of the entries'
    mean differences (one per pretraining seed), its t interval at 1 - alpha over them and the one-sample t-test's
    two-sided p against 0 (``low``, ``high`` and ``p`` None with fewer than two seeds or when every seed's
    difference is the same). None when a seed has no difference, or one over fewer tasks than its column has
    (``partial``: the seeds' differences would average different tasks)."""
    diffs = [e["mean_diff"] if e and not e.get("partial") else None for e in entries]
    if not diffs or any(d is None for d in diffs):
        return None
    n, mean = len(diffs), sum(diffs) / len(diffs)
    out = {"n": n, "mean_diff": mean, "low": None, "high": None, "p": None, "significant": False}
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1)) if n > 1 else 0.0
    if sd > 1e-12 * max(1.0, abs(mean)):
        from scipy.stats import t  # heavy: scipy

        se = sd / math.sqrt(n)
        half = float(t.ppf(1 - alpha / 2, n - 1)) * se
        p = float(2 * t.sf(abs(mean) / se, n - 1))
        out.update(low=mean - half, high=mean + half, p=p, significant=p < alpha)
    return out


def _across_text(table: BlueTable, cell: dict, alpha: float) -> str:
    """'+5.3 [−1.2, +11.8] (p 0.090)' in display units, * when p < alpha; an en dash where it has none."""
    a = cell.get("across")
    if not a:
        return "\u2013"
    if a["p"] is None:
        return signed_diff(table, a["mean_diff"])
    return (f"{signed_diff(table, a['mean_diff'])} [{signed_diff(table, a['low'])}, {signed_diff(table, a['high'])}]"
            f"{'*' if a['significant'] else ''} (p {p_text(a['p'], alpha)})")


def _cell_text(table: BlueTable, cell: dict) -> str:
    """'−9.5* / −18.2*': each seed's mean difference in display units, * when p < alpha there."""
    def one(entry: dict | None) -> str:
        if not entry or entry["mean_diff"] is None:
            return "\u2013"
        return signed_diff(table, entry["mean_diff"]) + ("*" if entry["significant"] else "")

    return " / ".join(one(e) for e in cell["entries"])


def _notes(doc: dict) -> str:
    seeds = ", ".join(doc["seeds"][1:])
    return (f"Each cell is the mean difference over fine-tuning seeds (model \u2212 {doc['baseline']}), at the arms' "
            f"own pretraining seed, then at {seeds}: each arm's replicate <arm>_s<seed> against "
            f"{doc['baseline']}_s<seed>; * marks p < {doc['alpha']:g} (paired t-test) at that seed. Bold: p < "
            f"{doc['alpha']:g} with the same sign at every pretraining seed (it recurs). A difference at one seed "
            "alone may be the pretraining's own variation, which no single seed's interval holds.")


def _across_notes(doc: dict) -> str:
    n, alpha = len(doc["seeds"]), doc["alpha"]
    return (f"Across the {n} pretraining seeds, the seed as the unit: the mean of each arm's per-seed differences "
            f"above, its {100 * (1 - alpha):g} % t interval over the seeds and the one-sample t-test's p (* p < "
            f"{alpha:g}); an en dash where a seed has no difference. Unlike a row above it holds the pretraining's "
            f"own variation; with {n} seeds it has {n - 1} degree{'s' * (n > 2)} of freedom, so only a large "
            f"difference of about the same size at every seed reaches p < {alpha:g}.")


def _markdown_rows(table: BlueTable, doc: dict, columns: list[dict], text: Callable[[BlueTable, dict], str],
                   bold: Callable[[dict], bool]) -> list[str]:
    lines = ["| Model | " + " | ".join(md_escape(c["label"]) for c in columns) + " |",
             "|" + "|".join(["---"] + [":---:"] * len(columns)) + "|"]
    for arm, row in doc["rows"].items():
        cells = [text(table, row[c["key"]]).replace("*", "\\*") for c in columns]
        cells = [f"**{t}**" if bold(row[c["key"]]) else t for c, t in zip(columns, cells, strict=True)]
        lines.append(f"| {md_escape(arm)} | " + " | ".join(cells) + " |")
    return lines


def replicates_markdown(table: BlueTable, doc: dict) -> str:
    columns, across = shown_columns(table, doc), partial(_across_text, alpha=doc["alpha"])
    return "\n".join([f"## {TITLE} ({' / '.join(doc['seeds'])})", "",
                      *_markdown_rows(table, doc, columns, _cell_text, lambda cell: cell["recurs"]), "",
                      md_escape(_notes(doc)), "", f"### {ACROSS}", "",
                      *_markdown_rows(table, doc, columns, across, lambda cell: False), "",
                      md_escape(_across_notes(doc))]) + "\n"


def _html_table(table: BlueTable, doc: dict, columns: list[dict], table_id: str,
                text: Callable[[BlueTable, dict], str], bold: Callable[[dict], bool], *,
                marks_recurs: bool = False) -> list[str]:
    """One of the replicates tables; ``marks_recurs``: each cell says whether its difference recurs at every seed
    (the per-seed table's bold)."""
    esc = html.escape
    out = [f'<table class="blue" id="{table_id}"><thead><tr><th class="model">Model</th>']
    out += [f'<th class="{c["kind"]}" data-column="{esc(c["key"])}">{esc(c["label"])}</th>' for c in columns]
    out.append("</tr></thead><tbody>")
    for arm, row in doc["rows"].items():
        out.append(f'<tr data-model="{esc(arm)}"><td class="model">{esc(arm)}</td>')
        for c in columns:
            cell, value = row[c["key"]], esc(text(table, row[c["key"]]))
            recurs = f' data-recurs="{"true" if cell["recurs"] else "false"}"' if marks_recurs else ""
            out.append(f'<td class="{c["kind"]}" data-column="{esc(c["key"])}"{recurs}>'
                       + (f"<strong>{value}</strong>" if bold(cell) else value) + "</td>")
        out.append("</tr>")
    return [*out, "</tbody></table>"]


def replicates_html(table: BlueTable, doc: dict) -> str:
    esc = html.escape
    columns, across = shown_columns(table, doc), partial(_across_text, alpha=doc["alpha"])
    return "\n".join([f"<h2>{esc(TITLE)} ({esc(' / '.join(doc['seeds']))})</h2>",
                      *_html_table(table, doc, columns, "replicates", _cell_text, lambda cell: cell["recurs"],
                                   marks_recurs=True),
                      f'<p class="notes">{esc(_notes(doc))}</p>', f"<h3>{esc(ACROSS)}</h3>",
                      *_html_table(table, doc, columns, "replicates-across", across, lambda cell: False),
                      f'<p class="notes">{esc(_across_notes(doc))}</p>'])
