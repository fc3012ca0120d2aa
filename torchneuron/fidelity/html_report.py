"""Self-contained HTML reports with inline SVG bars (no scripts, no external files)."""

from __future__ import annotations

import html
from collections.abc import Sequence

PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#9c755f")


def gib(nbytes: float) -> str:
    return f"{nbytes / (1 << 30):.2f} GiB"


def stacked_bars(
    rows: Sequence[tuple[str, Sequence[tuple[str, float]], float]],
    unit: str = "GiB",
    scale: float = 1 << 30,
    width: int = 720,
) -> str:
    """One horizontal stacked bar per row: (label, [(part, value)], limit); the limit is a line."""
    label_w, bar_w, row_h = 190, width - 300, 26
    top = max([max(sum(v for _, v in parts), limit) for _, parts, limit in rows] + [1e-9])
    names = list(dict.fromkeys(name for _, parts, _ in rows for name, _ in parts))
    colour = {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(names)}
    height = row_h * len(rows) + 40
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        'font-family="sans-serif" font-size="12">'
    ]
    for i, (label, parts, limit) in enumerate(rows):
        y = 10 + i * row_h
        out.append(f'<text x="0" y="{y + 14}">{html.escape(label)}</text>')
        x = float(label_w)
        for name, value in parts:
            w = bar_w * value / top
            if w <= 0:
                continue
            out.append(
                f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="18" fill="{colour[name]}">'
                f"<title>{html.escape(name)}: {value / scale:.3f} {unit}</title></rect>"
            )
            x += w
        total = sum(v for _, v in parts)
        out.append(
            f'<text x="{label_w + bar_w + 8}" y="{y + 14}">{total / scale:.2f} / '
            f"{limit / scale:.2f} {unit}</text>"
        )
        if limit > 0:
            lx = label_w + bar_w * limit / top
            out.append(
                f'<line x1="{lx:.1f}" y1="{y - 2}" x2="{lx:.1f}" y2="{y + 20}" '
                'stroke="black" stroke-width="2"/>'
            )
    y = 10 + len(rows) * row_h + 8
    x = 0.0
    for name in names:
        out.append(
            f'<rect x="{x}" y="{y}" width="10" height="10" fill="{colour[name]}"/>'
            f'<text x="{x + 14}" y="{y + 10}">{html.escape(name)}</text>'
        )
        x += 20 + 7 * len(name)
    out.append("</svg>")
    return "".join(out)


def polyline(
    points: Sequence[tuple[float, float]], width: int = 720, height: int = 160, y_label: str = ""
) -> str:
    """A line chart of (x, y) points, y from 0."""
    if not points:
        return ""
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    x0, x1 = min(xs), max(xs) or 1
    y1 = max(ys) or 1
    span = (x1 - x0) or 1
    coords = " ".join(
        f"{40 + (x - x0) / span * (width - 50):.1f},{height - 20 - y / y1 * (height - 30):.1f}"
        for x, y in points
    )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        'font-family="sans-serif" font-size="11">'
        f'<polyline fill="none" stroke="#4e79a7" stroke-width="1.5" points="{coords}"/>'
        f'<text x="0" y="12">{html.escape(y_label)} (max {y1:.3g})</text></svg>'
    )


def log_scatter(
    points: Sequence[tuple[float, float, str, str]],
    band: float = 0.35,
    x_label: str = "published",
    y_label: str = "projected",
    size: int = 420,
) -> str:
    """(x, y, tooltip, series) points on log-log axes with the line y = x and the band
    y = x (1 +- band); one colour per series, named in a legend."""
    if not points:
        return ""
    import math

    values = [v for x, y, _, _ in points for v in (x, y) if v > 0]
    lo, hi = math.log10(min(values) / 1.5), math.log10(max(values) * 1.5)
    margin, span = 50, size - 60

    def at(x: float, y: float) -> tuple[float, float]:
        fx = (math.log10(x) - lo) / (hi - lo)
        fy = (math.log10(y) - lo) / (hi - lo)
        return margin + fx * span, size - margin + 30 - fy * span

    series = list(dict.fromkeys(s for _, _, _, s in points))
    colour = {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(series)}
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{size + 160}" height="{size}" '
        'font-family="sans-serif" font-size="11">',
        f'<rect x="{margin}" y="{size - margin + 30 - span}" width="{span}" height="{span}" '
        'fill="none" stroke="#999"/>',
    ]
    for factor in (1.0, 1 + band, 1 - band):
        (x0, y0), (x1, y1) = at(10**lo, 10**lo * factor), at(10**hi, 10**hi * factor)
        dash = ' stroke-dasharray="4 3"' if factor != 1.0 else ""
        out.append(
            f'<line x1="{x0:.1f}" y1="{y0:.1f}" x2="{x1:.1f}" y2="{y1:.1f}" stroke="#888"{dash}/>'
        )
    for decade in range(math.ceil(lo), math.floor(hi) + 1):
        x, y = at(10**decade, 10**decade)
        out.append(f'<text x="{x:.1f}" y="{size - 5}" text-anchor="middle">{10**decade:g}</text>')
        out.append(f'<text x="{margin - 4}" y="{y:.1f}" text-anchor="end">{10**decade:g}</text>')
    for x, y, tip, name in points:
        if x <= 0 or y <= 0:
            continue
        cx, cy = at(x, y)
        out.append(
            f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="3.5" fill="{colour[name]}" '
            f'fill-opacity="0.75"><title>{html.escape(tip)}</title></circle>'
        )
    for i, name in enumerate(series):
        out.append(
            f'<rect x="{size + 10}" y="{20 + 18 * i}" width="10" height="10" '
            f'fill="{colour[name]}"/><text x="{size + 26}" y="{29 + 18 * i}">'
            f"{html.escape(name)}</text>"
        )
    out.append(
        f'<text x="{size + 10}" y="{40 + 18 * len(series)}">dashed: ±{band:.0%}</text>'
        f'<text x="{margin}" y="12">{html.escape(y_label)} (log) against '
        f"{html.escape(x_label)} (log)</text></svg>"
    )
    return "".join(out)


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def page(title: str, sections: Sequence[tuple[str, str]]) -> str:
    style = (
        "body{font-family:sans-serif;margin:2em;max-width:900px}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 8px;"
        "text-align:right}th{background:#eee}"
    )
    parts = [
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
        f"</title><style>{style}</style></head><body><h1>{html.escape(title)}</h1>"
    ]
    for heading, content in sections:
        parts.append(f"<h2>{html.escape(heading)}</h2>{content}")
    parts.append("</body></html>")
    return "".join(parts)
