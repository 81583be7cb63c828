"""The experiment page's figures as inline SVG, from plain numbers: line plots (loss and per-epoch
curves) and interval panels (paired differences with their confidence intervals). Rendering only:
what is plotted is chosen by ``dashboards.experiment_page``."""
from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass

LABEL_CHARS = 40  # an interval panel's arm names are cut beyond this (the whole name in a tooltip)
MAX_POINTS = 1500  # per plotted loss series: longer runs are thinned evenly (the last point kept)


def signed(value: float) -> str:
    text = f"{abs(value):.1f}"
    return text if float(text) == 0 else ("+" if value > 0 else "\u2212") + text


def interval_panel(column: dict, entries: list[tuple[str, dict | None]], scale: float) -> str:
    """One column's differences: a row per arm, the mean difference and its interval, zero marked."""
    esc = html.escape
    # the arms' names set the left margin (font-size 11: about 6.5 px a character), up to LABEL_CHARS characters;
    # a longer name is cut with an ellipsis, its whole text in the label's tooltip
    labels = [(arm, arm if len(arm) <= LABEL_CHARS else arm[:LABEL_CHARS - 1] + "\u2026") for arm, _ in entries]
    left = max(90, 12 + math.ceil(6.5 * max((len(shown) for _, shown in labels), default=0)))
    row_h, right, top, bottom = 26, 30, 26, 30
    width = left + 230
    height = top + bottom + row_h * len(entries)
    values = [0.0]
    for _, e in entries:
        if e and e["mean_diff"] is not None:
            values.append(e["mean_diff"] * scale)
            values += [v * scale for v in (e["ci"] or [])]
    lo, hi = min(values), max(values)
    ticks = nice_ticks(lo, hi, 4)
    lo, hi = min(lo, ticks[0]), max(hi, ticks[-1])
    if hi - lo < 1e-9:
        lo, hi = lo - 1, hi + 1

    def x(v: float) -> float:
        return left + (v - lo) / (hi - lo) * (width - left - right)

    arrow = "" if column["higher_is_better"] else " \u2193"
    out = [f'<svg class="interval-plot" data-column="{esc(column["key"])}" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg" role="img">',
           f'<text x="{width / 2}" y="16" text-anchor="middle" font-size="13" font-weight="bold">'
           f"{esc(column['label'])}{arrow}</text>"]
    axis_y = height - bottom
    for t in ticks:
        out.append(f'<line x1="{x(t):.1f}" y1="{top}" x2="{x(t):.1f}" y2="{axis_y}" stroke="#eee"/>'
                   f'<text x="{x(t):.1f}" y="{axis_y + 14}" text-anchor="middle" font-size="10">{tick(t)}</text>')
    out.append(f'<line x1="{x(0):.1f}" y1="{top - 4}" x2="{x(0):.1f}" y2="{axis_y}" stroke="#444" '
               'stroke-dasharray="3,3"/>')
    out.append(f'<line x1="{left}" y1="{axis_y}" x2="{width - right}" y2="{axis_y}" stroke="#888"/>'
               f'<text x="{(left + width - right) / 2}" y="{height - 4}" text-anchor="middle" font-size="10" '
               'fill="#555">difference (points)</text>')
    for i, (arm, e) in enumerate(entries):
        y = top + row_h * i + row_h / 2
        shown = labels[i][1]
        tip = f"<title>{esc(arm)}</title>" if shown != arm else ""
        out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11">{tip}{esc(shown)}</text>')
        if not e or e["mean_diff"] is None:
            out.append(f'<text x="{left + 4}" y="{y + 4:.1f}" font-size="10" fill="#999">no pairs</text>')
            continue
        colour = "#777" if not e["significant"] else ("#1a7f37" if e["better"] else "#c62828")
        d = e["mean_diff"] * scale
        p = "" if e["p"] is None else f", p = {e['p']:.3g}"
        ci = "" if not e["ci"] else f", {signed(e['ci'][0] * scale)} to {signed(e['ci'][1] * scale)}"
        g = [f'<g class="interval" data-arm="{esc(arm)}" data-significant="{str(e["significant"]).lower()}">',
             f"<title>{esc(arm)}: {signed(d)}{ci}{p} (n = {e['n']})</title>"]
        if e["ci"]:
            a, b = x(e["ci"][0] * scale), x(e["ci"][1] * scale)
            g.append(f'<line x1="{a:.1f}" y1="{y:.1f}" x2="{b:.1f}" y2="{y:.1f}" stroke="{colour}" stroke-width="2"/>'
                     f'<line x1="{a:.1f}" y1="{y - 5:.1f}" x2="{a:.1f}" y2="{y + 5:.1f}" stroke="{colour}"/>'
                     f'<line x1="{b:.1f}" y1="{y - 5:.1f}" x2="{b:.1f}" y2="{y + 5:.1f}" stroke="{colour}"/>')
        g.append(f'<circle cx="{x(d):.1f}" cy="{y:.1f}" r="4" fill="{colour}"/>')
        if e["significant"]:
            g.append(f'<text x="{width - right + 4}" y="{y + 5:.1f}" font-size="14" fill="{colour}">*</text>')
        out.append("".join(g) + "</g>")
    out.append("</svg>")
    return "\n".join(out)


@dataclass(frozen=True)
class Series:
    label: str
    colour: str
    points: Sequence[tuple[float, float]]
    dashed: bool = False
    kind: str = ""  # data-split of the group (dev / test), "" for none
    mark: float | None = None  # an x to ring (the epoch selected on dev)


def line_plot(series: list[Series], plot_id: str, title: str, x_label: str, y_label: str, *, width: int,
               height: int, integer_x: bool = False, data_task: str = "") -> str:
    """An SVG line plot: one polyline (with markers when short) per series, a legend per label."""
    esc = html.escape
    labels = list(dict.fromkeys(s.label for s in series))
    legend_w = min(160, 14 + 7 * max(len(label) for label in labels) + 10)
    left, right, top, bottom = 56, 12 + legend_w, 28, 40
    xs = [p[0] for s in series for p in s.points]
    ys = [p[1] for s in series for p in s.points]
    x_ticks = nice_ticks(min(xs), max(xs), 6, integer=integer_x)
    y_ticks = nice_ticks(min(ys), max(ys), 5)
    x0, x1 = x_ticks[0], x_ticks[-1]
    y0, y1 = y_ticks[0], y_ticks[-1]

    def px(v: float) -> float:
        return left + (v - x0) / (x1 - x0) * (width - left - right)

    def py(v: float) -> float:
        return height - bottom - (v - y0) / (y1 - y0) * (height - top - bottom)

    task = f' data-task="{esc(data_task)}"' if data_task else ""
    out = [f'<svg class="line-plot" id="{esc(plot_id)}"{task} width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg" role="img">',
           f'<text x="{(left + width - right) / 2}" y="17" text-anchor="middle" font-size="13" font-weight="bold">'
           f"{esc(title)}</text>"]
    for t in x_ticks:
        out.append(f'<line x1="{px(t):.1f}" y1="{top}" x2="{px(t):.1f}" y2="{height - bottom}" stroke="#eee"/>'
                   f'<text x="{px(t):.1f}" y="{height - bottom + 14}" text-anchor="middle" font-size="10">'
                   f"{tick(t)}</text>")
    for t in y_ticks:
        out.append(f'<line x1="{left}" y1="{py(t):.1f}" x2="{width - right}" y2="{py(t):.1f}" stroke="#eee"/>'
                   f'<text x="{left - 5}" y="{py(t) + 3:.1f}" text-anchor="end" font-size="10">{tick(t)}</text>')
    out.append(f'<rect x="{left}" y="{top}" width="{width - left - right}" height="{height - top - bottom}" '
               'fill="none" stroke="#888"/>'
               f'<text x="{(left + width - right) / 2}" y="{height - 6}" text-anchor="middle" font-size="11">'
               f"{esc(x_label)}</text>"
               f'<text x="14" y="{(top + height - bottom) / 2}" text-anchor="middle" font-size="11" '
               f'transform="rotate(-90 14 {(top + height - bottom) / 2})">{esc(y_label)}</text>')
    for s in series:
        split = f' data-split="{esc(s.kind)}"' if s.kind else ""
        dash = ' stroke-dasharray="5,3"' if s.dashed else ""
        pts = " ".join(f"{px(a):.1f},{py(b):.2f}" for a, b in s.points)
        g = [f'<g class="series" data-series="{esc(s.label)}"{split} data-points="{len(s.points)}">',
             f'<polyline fill="none" stroke="{s.colour}" stroke-width="1.6"{dash} points="{pts}"/>']
        if len(s.points) <= 40:
            fill = "#fff" if s.dashed else s.colour
            g += [f'<circle cx="{px(a):.1f}" cy="{py(b):.2f}" r="3" fill="{fill}" stroke="{s.colour}">'
                  f"<title>{esc(s.label)}{' ' + esc(s.kind) if s.kind else ''}: {x_label} {tick(a)}, {b:.4g}"
                  "</title></circle>" for a, b in s.points]
        g += [f'<circle class="selected" cx="{px(a):.1f}" cy="{py(b):.2f}" r="6.5" fill="none" stroke="{s.colour}" '
              'stroke-width="1.5"/>' for a, b in s.points if s.mark is not None and a == s.mark]
        out.append("".join(g) + "</g>")
    lx = width - right + 10
    for i, label in enumerate(labels):
        colour = next(s.colour for s in series if s.label == label)
        y = top + 8 + 16 * i
        out.append(f'<g class="legend" data-series="{esc(label)}"><line x1="{lx}" y1="{y}" x2="{lx + 16}" y2="{y}" '
                   f'stroke="{colour}" stroke-width="2.5"/><text x="{lx + 20}" y="{y + 4}" font-size="11">'
                   f"{esc(label)}</text></g>")
    out.append("</svg>")
    return "\n".join(out)


def thin(points: list[tuple[int, float]], limit: int = MAX_POINTS) -> list[tuple[int, float]]:
    if len(points) <= limit:
        return points
    stride = math.ceil(len(points) / limit)
    return points[::stride] + ([points[-1]] if (len(points) - 1) % stride else [])


def nice_ticks(lo: float, hi: float, count: int, integer: bool = False) -> list[float]:
    """Round tick values covering [lo, hi] (about ``count`` of them); integers only with ``integer``."""
    if hi - lo < 1e-12:
        pad = 1.0 if integer or lo == 0 else abs(lo) * 0.05
        lo, hi = lo - pad, hi + pad
    raw = (hi - lo) / max(count, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    if integer:
        step = max(1.0, round(step))
    start = math.floor(lo / step) * step
    ticks = []
    t = start
    while t < hi + step * 0.999:
        ticks.append(round(t, 10) + 0.0)  # + 0.0: -0.0 is 0 (a tick labelled "-0")
        t += step
    return ticks if len(ticks) >= 2 else [start, start + step]


def tick(v: float) -> str:
    return f"{v:g}" if abs(v) < 1e5 else f"{v:.3g}"
