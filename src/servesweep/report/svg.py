"""Hand-written inline SVG charts for the HTML report (no plotting library, no
network): an x/y chart (scatter or lines, numeric or categorical x, an optional
front line) and a horizontal timeline. Every text is escaped here."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape

__all__ = ["PALETTE", "Bar", "Point", "Series", "nice_ticks", "timeline_chart", "xy_chart"]

PALETTE: tuple[str, ...] = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#bcbd22",
    "#7f7f7f",
    "#d62728",
)

_W, _H = 560, 320
_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 16, 28, 48


def _e(text: object) -> str:
    return escape(str(text), quote=True)


def _num(value: float) -> str:
    return f"{value:.1f}"


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return [0.0]
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / max(count, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    ticks: list[float] = []
    value = start
    while value <= hi + step * 1e-9 and len(ticks) < 50:
        ticks.append(round(value, 12))
        value += step
    if ticks[-1] < hi:
        ticks.append(round(value, 12))
    return ticks


def _tick_label(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 10_000:
        return f"{value / 1000:g}k"
    return f"{value:g}"


@dataclass(frozen=True)
class Point:
    x: float | str
    """A number, or a category label on a categorical axis."""
    y: float
    tip: str = ""
    marker: str = "dot"
    """``dot``, ``ring`` (hollow), ``cross`` (failed) or ``star`` (best)."""


@dataclass(frozen=True)
class Series:
    name: str
    points: Sequence[Point]
    color: str = PALETTE[0]
    line: bool = False
    markers: bool = True


@dataclass
class _Axis:
    lo: float
    hi: float
    ticks: list[float] = field(default_factory=list)


def _marker(cx: float, cy: float, point: Point, color: str) -> str:
    tip = f"<title>{_e(point.tip)}</title>" if point.tip else ""
    x, y = _num(cx), _num(cy)
    if point.marker == "cross":
        a, b, c, e = _num(cx - 5), _num(cx + 5), _num(cy - 5), _num(cy + 5)
        d = f"M{a},{c}L{b},{e}M{a},{e}L{b},{c}"
        return f'<g class="pt"><path d="{d}" stroke="#d62728" stroke-width="2.5"/>{tip}</g>'
    if point.marker == "ring":
        return (
            f'<circle class="pt" cx="{x}" cy="{y}" r="5" fill="#fff" stroke="{color}" '
            f'stroke-width="2">{tip}</circle>'
        )
    if point.marker == "star":
        return (
            f'<g class="pt"><circle cx="{x}" cy="{y}" r="10" fill="none" stroke="#111" '
            f'stroke-width="2"/><circle cx="{x}" cy="{y}" r="6" fill="{color}"/>{tip}</g>'
        )
    return f'<circle class="pt" cx="{x}" cy="{y}" r="5" fill="{color}">{tip}</circle>'


def xy_chart(
    title: str,
    x_label: str,
    y_label: str,
    series: Sequence[Series],
    *,
    categories: Sequence[str] | None = None,
    front: Sequence[tuple[float, float]] = (),
    front_label: str = "Pareto front",
    width: int = _W,
    height: int = _H,
    element_id: str = "",
    legend: bool = False,
) -> str:
    """An x/y chart. With ``categories`` the x values are labels placed evenly;
    ``front`` draws a dashed line through the given points (e.g. a Pareto front);
    ``legend`` lists the series under the chart."""
    per_row = max(width // 180, 1)
    legend_rows = math.ceil(len(series) / per_row) if legend else 0
    plot_w, plot_h = width - _LEFT - _RIGHT, height - _TOP - _BOTTOM
    height += legend_rows * 16 + (10 if legend_rows else 0)
    pts = [p for s in series for p in s.points]
    ys = [p.y for p in pts if math.isfinite(p.y)] + [y for _, y in front]
    # a point without a value (a failed trial) is drawn on the x axis
    y_ticks = nice_ticks(min(ys, default=0.0), max(ys, default=1.0))
    if min(ys, default=0.0) >= 0 and y_ticks[0] > 0 and y_ticks[0] <= max(ys, default=1.0) / 2:
        y_ticks = nice_ticks(0.0, max(ys, default=1.0))
    ya = _Axis(y_ticks[0], y_ticks[-1], y_ticks)

    def sy(v: float) -> float:
        return _TOP + plot_h - (v - ya.lo) / ((ya.hi - ya.lo) or 1.0) * plot_h

    if categories is not None:
        slots = max(len(categories), 1)

        def sx(v: float | str) -> float:
            i = categories.index(str(v)) if str(v) in categories else 0
            return _LEFT + (i + 0.5) * plot_w / slots

        x_ticks_svg = "".join(
            f'<text x="{_num(sx(c))}" y="{_TOP + plot_h + 16}" text-anchor="middle">{_e(c)}</text>'
            for c in categories
        )
    else:
        xs = [float(p.x) for p in pts if not isinstance(p.x, str)] + [x for x, _ in front]
        x_ticks = nice_ticks(min(xs, default=0.0), max(xs, default=1.0))
        xa = _Axis(x_ticks[0], x_ticks[-1], x_ticks)

        def sx(v: float | str) -> float:
            value = 0.0 if isinstance(v, str) else v
            return _LEFT + (value - xa.lo) / ((xa.hi - xa.lo) or 1.0) * plot_w

        x_ticks_svg = "".join(
            f'<line x1="{_num(sx(t))}" x2="{_num(sx(t))}" y1="{_TOP}" y2="{_TOP + plot_h}" '
            f'class="grid"/><text x="{_num(sx(t))}" y="{_TOP + plot_h + 16}" '
            f'text-anchor="middle">{_e(_tick_label(t))}</text>'
            for t in xa.ticks
        )
    parts = [
        f'<svg class="plot" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" role="img"'
        + (f' id="{_e(element_id)}"' if element_id else "")
        + f' aria-label="{_e(title)}">',
        f'<text class="title" x="{_LEFT}" y="18">{_e(title)}</text>',
        f'<rect x="{_LEFT}" y="{_TOP}" width="{plot_w}" height="{plot_h}" class="frame"/>',
    ]
    for t in ya.ticks:
        y = _num(sy(t))
        parts.append(
            f'<line x1="{_LEFT}" x2="{_LEFT + plot_w}" y1="{y}" y2="{y}" class="grid"/>'
            f'<text x="{_LEFT - 6}" y="{y}" text-anchor="end" dominant-baseline="middle">'
            f"{_e(_tick_label(t))}</text>"
        )
    parts.append(x_ticks_svg)
    parts.append(
        f'<text class="label" x="{_LEFT + plot_w / 2:.1f}" y="{_TOP + plot_h + _BOTTOM - 12}" '
        f'text-anchor="middle">{_e(x_label)}</text>'
        f'<text class="label" transform="translate(14 {_TOP + plot_h / 2:.1f}) rotate(-90)" '
        f'text-anchor="middle">{_e(y_label)}</text>'
    )
    if front:
        d = "M" + "L".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in front)
        parts.append(
            f'<path d="{d}" class="front" fill="none" stroke="#111" stroke-width="1.5" '
            f'stroke-dasharray="5 4"><title>{_e(front_label)}</title></path>'
        )
    for s in series:
        finite_pts = [p for p in s.points if math.isfinite(p.y)]
        on_axis = [Point(p.x, ya.lo, p.tip, p.marker) for p in s.points if not math.isfinite(p.y)]
        if s.line and len(finite_pts) > 1:
            d = "M" + "L".join(f"{sx(p.x):.1f},{sy(p.y):.1f}" for p in finite_pts)
            parts.append(
                f'<path d="{d}" fill="none" stroke="{s.color}" stroke-width="2">'
                f"<title>{_e(s.name)}</title></path>"
            )
        if s.markers:
            parts.extend(_marker(sx(p.x), sy(p.y), p, s.color) for p in finite_pts + on_axis)
    for i, s in enumerate(series if legend else ()):
        lx = _LEFT + (i % per_row) * (plot_w / per_row)
        ly = _TOP + plot_h + _BOTTOM + 10 + (i // per_row) * 16
        name = s.name if len(s.name) <= 26 else s.name[:25] + "…"
        parts.append(
            f'<rect x="{_num(lx)}" y="{ly - 9}" width="10" height="10" fill="{s.color}"/>'
            f'<text x="{_num(lx + 14)}" y="{ly}">{_e(name)}<title>{_e(s.name)}</title></text>'
        )
    parts.append("</svg>")
    return "".join(parts)


@dataclass(frozen=True)
class Bar:
    row: str
    start: float
    """Seconds from the chart's origin."""
    seconds: float
    color: str
    tip: str = ""


def timeline_chart(
    title: str, rows: Sequence[str], bars: Sequence[Bar], *, width: int = 1100, element_id: str = ""
) -> str:
    """Horizontal bars on a shared time axis (seconds, shown in minutes when long)."""
    row_h = 22
    left = 150
    plot_w = width - left - _RIGHT
    height = _TOP + row_h * max(len(rows), 1) + _BOTTOM
    end = max((b.start + b.seconds for b in bars), default=1.0)
    minutes = end > 600
    scale = 60.0 if minutes else 1.0
    ticks = nice_ticks(0.0, end / scale, 8)
    hi = ticks[-1] * scale or 1.0

    def sx(t: float) -> float:
        return left + t / hi * plot_w

    parts = [
        f'<svg class="plot timeline" xmlns="http://www.w3.org/2000/svg" '
        f'viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img"'
        + (f' id="{_e(element_id)}"' if element_id else "")
        + f' aria-label="{_e(title)}">',
        f'<text class="title" x="{left}" y="18">{_e(title)}</text>',
        f'<rect x="{left}" y="{_TOP}" width="{plot_w}" height="{row_h * len(rows)}" '
        f'class="frame"/>',
    ]
    for t in ticks:
        x = _num(sx(t * scale))
        parts.append(
            f'<line x1="{x}" x2="{x}" y1="{_TOP}" y2="{_TOP + row_h * len(rows)}" class="grid"/>'
            f'<text x="{x}" y="{_TOP + row_h * len(rows) + 16}" text-anchor="middle">'
            f"{_e(_tick_label(t))}</text>"
        )
    unit = "minutes" if minutes else "seconds"
    parts.append(
        f'<text class="label" x="{left + plot_w / 2:.1f}" y="{height - 8}" '
        f'text-anchor="middle">{_e(unit)} since the sweep started</text>'
    )
    for i, row in enumerate(rows):
        y = _TOP + i * row_h
        parts.append(
            f'<text x="{left - 6}" y="{y + row_h / 2:.1f}" text-anchor="end" '
            f'dominant-baseline="middle">{_e(row)}</text>'
        )
    index = {r: i for i, r in enumerate(rows)}
    for bar in bars:
        y = _TOP + index.get(bar.row, 0) * row_h + 3
        w = max(bar.seconds / hi * plot_w, 1.0)
        parts.append(
            f'<rect x="{_num(sx(bar.start))}" y="{y}" width="{w:.1f}" height="{row_h - 6}" '
            f'fill="{bar.color}"><title>{_e(bar.tip)}</title></rect>'
        )
    parts.append("</svg>")
    return "".join(parts)
