"""An experiment's "what each pretraining arm trained on" table: the rows (``training_data.json``) drawn as a
(Markdown, HTML) section of its report.

    md, html = render_section(rows)

A row is one arm and phase (``orchestrator.workflows.analyses.training_rows`` reads them from the arms'
instances manifests): ``arm``, ``phase``, ``max_seq_length``, ``masking``, ``instances``, ``tokens``,
``masked_tokens``, ``random_next``, ``pair_tokens_cut`` and ``pairs_cut`` (None: counted by none of the
instances stages of the time), ``pair_cut_share``, ``passes``, ``nsp`` (False: pretrained on MLM alone, the
pairs' labels unread; absent in rows written before it, as True); or, for an arm that did not pretrain here,
``arm`` and ``note`` alone. Arms that differ in these numbers differ in more than the setting they are named
for: the table shows it without counting by hand.
"""
from __future__ import annotations

import html
from collections.abc import Sequence

TITLE = "What each pretraining arm trained on"
FILE = "training_data.json"
INTRO = ("Per arm and phase, from its instances stage's manifest: the instances and tokens (special tokens "
         "included), the masked tokens, the pairs whose second segment is another document's (NSP's random "
         "next), the share of the pair tokens packed that truncation to the length cut, and the passes the "
         "phase makes over its instances at its steps (steps x global batch / instances).")
STATIC_REPEATS = ("Passes above 1 with static masks: the passes after the first see the same masks (BERT's remedy "
                  "is dupe_factor, more copies each masked anew).")
HEADER = ("arm", "phase", "length", "instances", "tokens", "masked tokens", "random next", "pair tokens cut",
          "passes")
UNAVAILABLE = f"{TITLE}: not available ({{why}})."
CSS = """
table.training-data { border-collapse: collapse; font-size: 14px; margin-bottom: 1em; }
table.training-data th, table.training-data td { padding: 4px 10px; border-bottom: 1px solid #ddd; }
table.training-data td:nth-child(n+3) { text-align: right; }
table.training-data thead th { border-bottom: 2px solid #333; }
"""


def _share(part: int | None, whole: int | None) -> str:
    return "unknown" if part is None or not whole else f"{part:,} ({part / whole:.1%})"


def cells(row: dict) -> list[str]:
    """A row's cells in ``HEADER``'s order; an arm with a note has it in the second cell and the rest empty."""
    if row.get("note"):
        return [row["arm"], row["note"], *[""] * (len(HEADER) - 2)]
    share = row.get("pair_cut_share")
    cut = "unknown" if share is None else f"{share:.1%} (in {row['pairs_cut'] / row['instances']:.0%} of instances)"
    passes = f"{row['passes']:.2f}" + (f" ({row['masking']} masks)" if row.get("masking") else "")
    return [row["arm"], row["phase"], str(row["max_seq_length"]), f"{row['instances']:,}", f"{row['tokens']:,}",
            _share(row.get("masked_tokens"), row["tokens"]),
            _share(row.get("random_next"), row["instances"]) + ("" if row.get("nsp", True) else " (no NSP: unread)"),
            cut, passes]


def _repeats(rows: Sequence[dict]) -> bool:
    return any(not r.get("note") and r.get("masking") == "static" and r["passes"] > 1 for r in rows)


def render_markdown(rows: Sequence[dict], heading: str = "##") -> str:
    lines = [f"{heading} {TITLE}", "", INTRO, "", "| " + " | ".join(HEADER) + " |",
             "|---|---|" + "---:|" * (len(HEADER) - 2)]
    lines += ["| " + " | ".join(cells(r)) + " |" for r in rows]
    if _repeats(rows):
        lines += ["", STATIC_REPEATS]
    return "\n".join(lines) + "\n"


def render_html(rows: Sequence[dict], heading: str = "h2") -> str:
    """An HTML fragment: ``class="training-data"``, each row ``data-arm`` (and ``data-phase``)."""
    esc = html.escape
    out = [f"<style>{CSS}</style>", f"<{heading}>{esc(TITLE)}</{heading}>", f'<p class="notes">{esc(INTRO)}</p>',
           '<table class="training-data"><thead><tr>' + "".join(f"<th>{esc(h)}</th>" for h in HEADER)
           + "</tr></thead><tbody>"]
    for row in rows:
        out.append(f'<tr data-arm="{esc(row["arm"])}" data-phase="{esc(row.get("phase", ""))}">'
                   + "".join(f"<td>{esc(c)}</td>" for c in cells(row)) + "</tr>")
    out.append("</tbody></table>")
    if _repeats(rows):
        out.append(f'<p class="notes">{esc(STATIC_REPEATS)}</p>')
    return "\n".join(out) + "\n"


def render_section(rows: Sequence[dict]) -> tuple[str, str]:
    """The table as a (Markdown, HTML) section of a report."""
    return render_markdown(rows), render_html(rows)
