"""Arms replicated at other pretraining seeds: the paired differences at each seed, and which recur.

The report's paired differences are over fine-tuning seeds of one pretraining per arm, so they do not hold the
pretraining's own variation; on ``experiments/entity_masking.yaml`` another ``pretrain.seed`` alone moved an arm's
Total by 11 points (session 56). A replicate is another arm: ``<arm>_s<seed>`` is read as ``<arm>`` pretrained
at ``pretrain.seed: <seed>`` (the experiment's ``replicate_seeds`` names them so; they can be written by hand).
Where the baseline has replicates, each arm is compared with the baseline at its own seed and, at each replicate
seed, its replicate with the baseline's: a difference with p < alpha and the same sign at every seed recurs.
"""
from __future__ import annotations

import html

from orchestrator.core.results import REPLICATE
from orchestrator.report.compare import paired_differences
from orchestrator.report.pages import md_escape, shown_columns, signed_diff
from orchestrator.report.table import BlueTable

TITLE = "Paired differences at each pretraining seed"


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
                                  (all(d > 0 for d in diffs) or all(d < 0 for d in diffs))}
        rows[arm] = row
    return {"baseline": baseline, "seeds": ["own"] + [f"s{s}" for s in seeds], "alpha": alpha,
            "columns": docs[0]["columns"], "rows": rows}


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


def replicates_markdown(table: BlueTable, doc: dict) -> str:
    columns = shown_columns(table, doc)
    lines = [f"## {TITLE} ({' / '.join(doc['seeds'])})", "",
             "| Model | " + " | ".join(md_escape(c["label"]) for c in columns) + " |",
             "|" + "|".join(["---"] + [":---:"] * len(columns)) + "|"]
    for arm, row in doc["rows"].items():
        cells = [_cell_text(table, row[c["key"]]).replace("*", "\\*") for c in columns]
        cells = [f"**{text}**" if row[c["key"]]["recurs"] else text for c, text in zip(columns, cells, strict=True)]
        lines.append(f"| {md_escape(arm)} | " + " | ".join(cells) + " |")
    return "\n".join([*lines, "", md_escape(_notes(doc))]) + "\n"


def replicates_html(table: BlueTable, doc: dict) -> str:
    esc = html.escape
    columns = shown_columns(table, doc)
    out = [f"<h2>{esc(TITLE)} ({esc(' / '.join(doc['seeds']))})</h2>",
           '<table class="blue" id="replicates"><thead><tr><th class="model">Model</th>']
    out += [f'<th class="{c["kind"]}" data-column="{esc(c["key"])}">{esc(c["label"])}</th>' for c in columns]
    out.append("</tr></thead><tbody>")
    for arm, row in doc["rows"].items():
        out.append(f'<tr data-model="{esc(arm)}"><td class="model">{esc(arm)}</td>')
        for c in columns:
            cell, text = row[c["key"]], esc(_cell_text(table, row[c["key"]]))
            out.append(f'<td class="{c["kind"]}" data-column="{esc(c["key"])}" '
                       f'data-recurs="{"true" if cell["recurs"] else "false"}">'
                       + (f"<strong>{text}</strong>" if cell["recurs"] else text) + "</td>")
        out.append("</tr>")
    out += ["</tbody></table>", f'<p class="notes">{esc(_notes(doc))}</p>']
    return "\n".join(out)
