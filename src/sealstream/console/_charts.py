"""Server-rendered SVG line charts: no JavaScript, no build step, no network.

:func:`line_chart` draws one or more series over a shared x axis (checkpoint ids).
Each data point is a ``<circle class="pt">`` with a ``<title>`` (its value on hover);
a missing value (None) breaks the line. The output is deterministic.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from html import escape

WIDTH, HEIGHT = 640, 220
LEFT, RIGHT, TOP, BOTTOM = 104, 16, 26, 30
PALETTE = ("#2f6fde", "#d9480f", "#2b8a3e", "#ae3ec9", "#e67700", "#0b7285", "#c2255c",
           "#5c940d")


def _num(v: float) -> str:
    return f"{v:.1f}"


def line_chart(title: str, x: Sequence[int], lines: Sequence[tuple[str, Sequence[int | None]]],
               fmt: Callable[[int], str] = str, chart_id: str = "") -> str:
    """An SVG chart of ``lines`` (name, one y per x, None for no value) over ``x``."""
    points = [(xi, y) for _, ys in lines for xi, y in zip(x, ys, strict=False) if y is not None]
    head = (f'<svg class="chart" id="{escape(chart_id)}" viewBox="0 0 {WIDTH} {HEIGHT}" '
            f'width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="{escape(title)}" '
            'xmlns="http://www.w3.org/2000/svg">'
            f'<text x="{LEFT}" y="16" class="ct">{escape(title)}</text>')
    if not points:
        return (head + f'<text x="{WIDTH // 2}" y="{HEIGHT // 2}" class="empty" '
                'text-anchor="middle">nothing recorded</text></svg>')
    x0, x1 = min(p[0] for p in points), max(p[0] for p in points)
    y0, y1 = min(p[1] for p in points), max(p[1] for p in points)
    if x0 == x1:
        x0, x1 = x0 - 1, x1 + 1
    if y0 == y1:
        y0, y1 = y0 - 1, y1 + 1
    w, h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def sx(v: int) -> float:
        return LEFT + (v - x0) * w / (x1 - x0)

    def sy(v: int) -> float:
        return TOP + h - (v - y0) * h / (y1 - y0)

    parts = [head,
             f'<rect x="{LEFT}" y="{TOP}" width="{w}" height="{h}" class="frame"/>']
    for v, anchor in ((y1, TOP + 4), (y0, TOP + h)):
        parts.append(f'<text x="{LEFT - 4}" y="{anchor}" class="ax" text-anchor="end">'
                     f'{escape(fmt(v))}</text>')
    for v in (x0, x1):
        parts.append(f'<text x="{_num(sx(v))}" y="{HEIGHT - 10}" class="ax" '
                     f'text-anchor="middle">{v}</text>')
    for n, (name, ys) in enumerate(lines):
        colour = PALETTE[n % len(PALETTE)]
        segs: list[list[str]] = [[]]
        dots = []
        for xi, y in zip(x, ys, strict=False):
            if y is None:
                segs.append([])
                continue
            px, py = _num(sx(xi)), _num(sy(y))
            segs[-1].append(f"{px},{py}")
            dots.append(f'<circle class="pt" cx="{px}" cy="{py}" r="2.5" fill="{colour}">'
                        f'<title>{escape(name)} @ {xi}: {escape(fmt(y))}</title></circle>')
        for seg in segs:
            if len(seg) > 1:
                parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" '
                             f'points="{" ".join(seg)}"/>')
        parts.extend(dots)
        if len(lines) > 1 and n < 8:
            lx = LEFT + 8 + (n % 4) * 140
            ly = TOP + 12 + (n // 4) * 12
            parts.append(f'<text x="{lx}" y="{ly}" class="lg" fill="{colour}">'
                         f'{escape(name[:22])}</text>')
    parts.append("</svg>")
    return "".join(parts)
