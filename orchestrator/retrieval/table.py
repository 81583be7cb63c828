"""Seed 002's Table 6 layout: one row per retrieval direction, one column per model, P@k in percent.

Rows come in three blocks: alignment *to* the pivot language (X -> en) above, *from* it (en -> X)
below, as the seed prints them, then the directions between other languages (when the text has
more than one besides the pivot). The best score of each row is bold (every model that reaches it).
One table per k of ``top_k``. Renders plain text (the job's output; best marked ``*``), Markdown
and an HTML fragment (the experiment's report) from the results document alone.
"""
from __future__ import annotations

import html
from collections.abc import Sequence

#: The results document's file name, in a retrieval output and as its MLflow runs' artifact.
RESULTS = "results.json"
SECTIONS = (("to", "to {pivot}"), ("from", "from {pivot}"), ("other", "other pairs"))
ARROW = "\u2192"


def direction(src: str, tgt: str) -> str:
    """The results' name of a direction: 'de->en' (retrieve the en translation of each de unit)."""
    return f"{src}->{tgt}"


def metric_name(k: int) -> str:
    return f"p_at_{k}"


def section_of(src: str, tgt: str, pivot: str) -> str:
    return "to" if tgt == pivot else "from" if src == pivot else "other"


def blocks(results: dict) -> list[tuple[str, list[dict]]]:
    """[(block title, [direction entries])] in Table 6's order; empty blocks left out."""
    pivot = results["pivot"]
    out = []
    for key, title in SECTIONS:
        rows = [d for d in results["directions"] if d["section"] == key]
        if rows:
            out.append((title.format(pivot=pivot), rows))
    return out


def row_values(results: dict, k: int, name: str) -> list[float | None]:
    scores = results[metric_name(k)]
    return [scores.get(m, {}).get(name) for m in results["models"]]


def best(values: Sequence[float | None], digits: int = 1) -> set[int]:
    """Indices of the row's best value as shown (rounded to ``digits`` of a percentage): ties all count;
    none when fewer than two models have a value (nothing to compare)."""
    shown = [None if v is None else round(100 * v, digits) for v in values]
    if sum(v is not None for v in shown) < 2:
        return set()
    top = max((v for v in shown if v is not None), default=None)
    return {i for i, v in enumerate(shown) if v is not None and v == top}


def _cell(value: float | None, digits: int = 1) -> str:
    return "\u2013" if value is None else f"{100 * value:.{digits}f}"


def _caption(results: dict, k: int) -> str:
    sizes = ", ".join(f"{s['name']}: {s['units']} {s['unit']}s" for s in results["sets"])
    return (f"Precision@{k} (%) of cross-lingual retrieval by cosine nearest neighbour ({sizes}); "
            f"the best score in each row is marked.")


def render_text(results: dict) -> str:
    """Plain-text tables, one per k; the best of a row is followed by '*'."""
    models = results["models"]
    out = []
    for k in results["ks"]:
        names = [d["name"].replace("->", f" {ARROW} ") for _, rows in blocks(results) for d in rows]
        first = max([len("direction"), *(len(n) for n in names)])
        widths = [max(7, len(m) + 1) for m in models]
        lines = [_caption(results, k),
                 f"{'direction':<{first}}  " + "  ".join(f"{m:>{w}}" for m, w in zip(models, widths))]
        for title, rows in blocks(results):
            lines.append(f"-- {title} --")
            for d in rows:
                values = row_values(results, k, d["name"])
                top = best(values)
                cells = [f"{_cell(v) + ('*' if i in top else ''):>{w}}"
                         for i, (v, w) in enumerate(zip(values, widths))]
                lines.append(f"{d['name'].replace('->', f' {ARROW} '):<{first}}  " + "  ".join(cells))
        out.append("\n".join(lines))
    return "\n\n".join(out) + "\n"


def render_markdown(results: dict, heading: str = "##") -> str:
    """Markdown tables, one per k; the best of a row in **bold**; each block opens with an italic label row."""
    models = results["models"]
    out = [f"{heading} Cross-lingual retrieval (seed 002, Table 6)", "", _notes(results)]
    for k in results["ks"]:
        out += ["", f"{heading}# Precision@{k} (%)", "", "| | " + " | ".join(_md(m) for m in models) + " |",
                "|---|" + ":---:|" * len(models)]
        for title, rows in blocks(results):
            out.append(f"| *{_md(title)}* |" + " |" * len(models))
            for d in rows:
                values = row_values(results, k, d["name"])
                top = best(values)
                cells = [f"**{_cell(v)}**" if i in top else _cell(v) for i, v in enumerate(values)]
                out.append(f"| {_md(d['name'].replace('->', f' {ARROW} '))} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


CSS = """
table.retrieval { border-collapse: collapse; font-size: 14px; margin-bottom: 1em; }
table.retrieval th, table.retrieval td { padding: 4px 10px; text-align: center; border-bottom: 1px solid #ddd; }
table.retrieval thead th { border-bottom: 2px solid #333; }
table.retrieval th.block { text-align: left; font-style: italic; font-weight: normal; border-top: 2px solid #333; }
table.retrieval td.direction { text-align: left; white-space: nowrap; }
"""


def render_html(results: dict, heading: str = "h2") -> str:
    """An HTML fragment (one table per k, ``class="retrieval"``, each cell ``data-model`` and
    ``data-direction``; the best of a row in ``<b>``) that ``CSS`` styles."""
    esc = html.escape
    models = results["models"]
    sub = "h" + str(int(heading[1:]) + 1)
    out = [f"<{heading}>Cross-lingual retrieval (seed 002, Table 6)</{heading}>",
           f'<p class="notes">{esc(_notes(results))}</p>']
    for k in results["ks"]:
        out.append(f"<{sub}>Precision@{k} (%)</{sub}>")
        out.append(f'<table class="retrieval" data-k="{k}"><thead><tr><th></th>'
                   + "".join(f"<th>{esc(m)}</th>" for m in models) + "</tr></thead>")
        for title, rows in blocks(results):
            out.append(f'<tbody><tr><th class="block" colspan="{len(models) + 1}">{esc(title)}</th></tr>')
            for d in rows:
                values = row_values(results, k, d["name"])
                top = best(values)
                cells = "".join(
                    f'<td data-model="{esc(m)}" data-direction="{esc(d["name"])}">'
                    + (f"<b>{_cell(v)}</b>" if i in top else _cell(v)) + "</td>"
                    for i, (m, v) in enumerate(zip(models, values)))
                out.append(f'<tr><td class="direction">{esc(d["name"].replace("->", f" {ARROW} "))}</td>{cells}</tr>')
            out.append("</tbody>")
        out.append("</table>")
    return "\n".join(out) + "\n"


def render_section(results: dict) -> tuple[str, str]:
    """The tables as a (Markdown, HTML) section of a BLUE report page (the HTML with its ``CSS``)."""
    return render_markdown(results), f"<style>{CSS}</style>\n" + render_html(results)


def render_page(results: dict, title: str = "Cross-lingual retrieval") -> str:
    """A self-contained HTML page of the tables (inline CSS, no scripts)."""
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title><style>body {{ font-family: sans-serif; margin: 2em; }}"
            f"{CSS} p.notes {{ font-size: 12px; color: #555; max-width: 60em; }}</style></head><body>\n"
            + render_html(results, "h1") + "</body></html>\n")


def _notes(results: dict) -> str:
    s = results["settings"]
    pooling = ("sub-tokens only ([CLS]/[SEP] excluded)" if s["special_tokens"] == "exclude"
               else "every position but padding ([CLS]/[SEP] included)")
    long = ("units longer than a window are averaged over all their windows" if s["long_units"] == "window"
            else "units longer than a window are truncated")
    sets = "; ".join(f"{st['name']}: {', '.join(f'{lang}={f}' for lang, f in st['files'].items())}"
                     for st in results["sets"])
    return (f"Each unit is the mean of the encoder's last layer over its {pooling}; windows of "
            f"{s['max_seq_length']} sub-tokens, {long}. A source unit counts at k when its translation is among "
            f"the k target units nearest by cosine. Rows: X {ARROW} {results['pivot']} retrieves the "
            f"{results['pivot']} translation of each X unit. Text: {sets}.")


def _md(text: str) -> str:
    return text.replace("|", "\\|")


__all__ = ["CSS", "RESULTS", "blocks", "best", "direction", "metric_name", "render_html", "render_markdown",
           "render_page", "render_section", "render_text", "section_of"]
