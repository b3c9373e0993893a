"""Inline SVG charts for the static report: real axes, units and a legend, no scripts, no fonts."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape

FONT = "font-family=\"system-ui, sans-serif\""
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b")


@dataclass
class Series:
    name: str
    points: list[tuple[float, float]]  # (x, y); None-valued points are dropped by the caller
    colour: str = ""
    dashed: bool = False


@dataclass
class Marker:
    """A vertical event line (a promotion, a revert) at x, with a short label."""

    x: float
    label: str
    kind: str  # "promote" | "revert"


@dataclass
class _Frame:
    width: int = 640
    height: int = 300
    left: int = 56
    right: int = 16
    top: int = 16
    bottom: int = 64
    parts: list[str] = field(default_factory=list)

    @property
    def plot_w(self) -> float:
        return self.width - self.left - self.right

    @property
    def plot_h(self) -> float:
        return self.height - self.top - self.bottom


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About n round-numbered ticks covering [lo, hi]."""
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / max(1, n)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    ticks, t = [start], start
    while t < hi - step * 1e-6:  # until a tick covers hi
        t += step
        ticks.append(round(t, 10))
    return ticks


def _fmt(v: float) -> str:
    return f"{v:g}" if abs(v) >= 0.01 or v == 0 else f"{v:.2g}"


def _svg(frame: _Frame, title: str, body: list[str]) -> str:
    return (f'<svg class="chart" role="img" viewBox="0 0 {frame.width} {frame.height}" '
            f'preserveAspectRatio="xMidYMid meet" xmlns="http://www.w3.org/2000/svg">'
            f"<title>{escape(title)}</title>{''.join(body)}</svg>")


def _y_axis(frame: _Frame, lo: float, hi: float, ticks: list[float], label: str) -> list[str]:
    out = []
    for t in ticks:
        y = frame.top + frame.plot_h * (1 - (t - lo) / (hi - lo))
        out.append(f'<line class="grid" x1="{frame.left}" x2="{frame.left + frame.plot_w}" y1="{y:.1f}" '
                   f'y2="{y:.1f}" stroke="#ddd"/>'
                   f'<text x="{frame.left - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11" {FONT}>'
                   f"{_fmt(t)}</text>")
    cy = frame.top + frame.plot_h / 2
    out.append(f'<text x="14" y="{cy:.1f}" transform="rotate(-90 14 {cy:.1f})" text-anchor="middle" '
               f'font-size="12" {FONT}>{escape(label)}</text>')
    out.append(f'<line x1="{frame.left}" x2="{frame.left}" y1="{frame.top}" y2="{frame.top + frame.plot_h}" '
               f'stroke="#333"/>')
    return out


def _legend(frame: _Frame, entries: list[tuple[str, str, str]]) -> list[str]:
    """entries: (label, colour, shape: line|dash|dot|promote|revert), laid out along the bottom."""
    out, x = [], frame.left
    y = frame.height - 12 - 18 * (_legend_rows(frame, entries) - 1)
    for label, colour, shape in entries:
        if x + 30 + 6.5 * len(label) > frame.width and x > frame.left:
            x, y = frame.left, y + 18
        if shape in ("line", "dash"):
            dash = ' stroke-dasharray="5 3"' if shape == "dash" else ""
            out.append(f'<line x1="{x}" x2="{x + 18}" y1="{y - 4}" y2="{y - 4}" stroke="{colour}" '
                       f'stroke-width="2.5"{dash}/>')
        elif shape in ("promote", "revert"):
            dash = ' stroke-dasharray="4 3"' if shape == "revert" else ""
            out.append(f'<line x1="{x + 9}" x2="{x + 9}" y1="{y - 12}" y2="{y + 3}" stroke="{colour}" '
                       f'stroke-width="2"{dash}/>')
        else:
            out.append(f'<circle cx="{x + 9}" cy="{y - 4}" r="4" fill="{colour}"/>')
        out.append(f'<text x="{x + 24}" y="{y}" font-size="11" {FONT}>{escape(label)}</text>')
        x += 34 + 6.5 * len(label)
    return out


def _legend_rows(frame: _Frame, entries: list[tuple[str, str, str]]) -> int:
    rows, x = 1, frame.left
    for label, _, _ in entries:
        if x + 30 + 6.5 * len(label) > frame.width and x > frame.left:
            rows, x = rows + 1, frame.left
        x += 34 + 6.5 * len(label)
    return rows


def line_chart(series: Sequence[Series], *, x_label: str, y_label: str, title: str,
               markers: Sequence[Marker] = (), integer_x: bool = True) -> str:
    """Lines with dots over numeric x; vertical markers for events. Empty series are left out."""
    series = [s for s in series if s.points]
    frame = _Frame(height=320, bottom=84)
    xs = [x for s in series for x, _ in s.points] + [m.x for m in markers]
    ys = [y for s in series for _, y in s.points]
    if not ys:
        return ""
    x_lo, x_hi = min(xs), max(xs)
    if x_hi - x_lo < 1:
        x_lo, x_hi = x_lo - 0.5, x_hi + 0.5
    y_ticks = nice_ticks(min(0.0, min(ys)), max(ys) if max(ys) > 0 else 1.0)
    y_lo, y_hi = y_ticks[0], y_ticks[-1]
    pad = 0.04 * (x_hi - x_lo)
    x_lo, x_hi = x_lo - pad, x_hi + pad

    def px(x: float) -> float:
        return frame.left + frame.plot_w * (x - x_lo) / (x_hi - x_lo)

    def py(y: float) -> float:
        return frame.top + frame.plot_h * (1 - (y - y_lo) / (y_hi - y_lo))

    body = _y_axis(frame, y_lo, y_hi, y_ticks, y_label)
    base_y = frame.top + frame.plot_h
    body.append(f'<line x1="{frame.left}" x2="{frame.left + frame.plot_w}" y1="{base_y}" y2="{base_y}" stroke="#333"/>')
    x_ticks = (list(range(math.ceil(min(xs)), math.floor(max(xs)) + 1)) if integer_x
               else nice_ticks(min(xs), max(xs)))
    for t in x_ticks:
        body.append(f'<line x1="{px(t):.1f}" x2="{px(t):.1f}" y1="{base_y}" y2="{base_y + 4}" stroke="#333"/>'
                    f'<text x="{px(t):.1f}" y="{base_y + 16}" text-anchor="middle" font-size="11" {FONT}>'
                    f"{_fmt(t)}</text>")
    body.append(f'<text x="{frame.left + frame.plot_w / 2:.1f}" y="{base_y + 32}" text-anchor="middle" '
                f'font-size="12" {FONT}>{escape(x_label)}</text>')
    for m in markers:
        colour = "#2ca02c" if m.kind == "promote" else "#d62728"
        dash = ' stroke-dasharray="4 3"' if m.kind == "revert" else ""
        body.append(f'<g class="marker {m.kind}"><title>{escape(m.label)}</title>'
                    f'<line x1="{px(m.x):.1f}" x2="{px(m.x):.1f}" y1="{frame.top}" y2="{base_y}" '
                    f'stroke="{colour}" stroke-width="2"{dash}/></g>')
    legend = []
    for i, s in enumerate(series):
        colour = s.colour or PALETTE[i % len(PALETTE)]
        pts = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in sorted(s.points))
        dash = ' stroke-dasharray="6 4"' if s.dashed else ""
        body.append(f'<g class="series" data-points="{len(s.points)}"><polyline class="datum" points="{pts}" '
                    f'fill="none" stroke="{colour}" stroke-width="2.5"{dash}/>')
        for x, y in s.points:
            body.append(f'<circle class="datum" cx="{px(x):.1f}" cy="{py(y):.1f}" r="4" fill="{colour}">'
                        f"<title>{escape(s.name)}: {y:.4g} at {x_label} {_fmt(x)}</title></circle>")
        body.append("</g>")
        legend.append((s.name, colour, "dash" if s.dashed else "line"))
    kinds = {m.kind for m in markers}
    legend += [(k, "#2ca02c" if k == "promote" else "#d62728", k) for k in ("promote", "revert") if k in kinds]
    body += _legend(frame, legend)
    return _svg(frame, title, body)


@dataclass
class Histogram:
    """One category of a histogram-strip plot: counts at values (exact rewards or bin centres)."""

    label: str
    counts: list[tuple[float, int]]
    colour: str
    group: str = ""

    @property
    def n(self) -> int:
        return sum(c for _, c in self.counts)


def histogram_chart(strips: Sequence[Histogram], *, y_label: str, title: str, bin_width: float = 0.0) -> str:
    """Side-by-side horizontal histograms ("bean" strips): at each value a bar centred on the strip
    whose width is its count relative to the strip's largest count, plus a median bar. Sized by
    the number of values, never by the number of rollouts. `bin_width` > 0: bars span their bin."""
    values = [v for s in strips for v, c in s.counts if c]
    if not values:
        return ""
    frame = _Frame(height=320, bottom=84)
    # Pad the range so bars at the extremes are drawn whole, not cut by the frame.
    pad = max(bin_width / 2, 0.04 * ((max(values) - min(values)) or 1.0))
    ticks = nice_ticks(min(0.0, min(values) - pad), max(values) + pad if max(values) > 0 else 1.0)
    lo, hi = ticks[0], ticks[-1]

    def py(y: float) -> float:
        return frame.top + frame.plot_h * (1 - (y - lo) / (hi - lo))

    body = _y_axis(frame, lo, hi, ticks, y_label)
    base_y = frame.top + frame.plot_h
    body.append(f'<line x1="{frame.left}" x2="{frame.left + frame.plot_w}" y1="{base_y}" y2="{base_y}" stroke="#333"/>')
    band = frame.plot_w / max(1, len(strips))
    bar_h = max(2.0, frame.plot_h * bin_width / (hi - lo)) if bin_width > 0 else 3.0
    groups: dict[str, list[float]] = {}
    legend: dict[str, str] = {}
    for i, s in enumerate(strips):
        cx = frame.left + band * (i + 0.5)
        if s.group:
            groups.setdefault(s.group, []).append(cx)
        legend.setdefault(s.label, s.colour)
        top = max((c for _, c in s.counts), default=0)
        body.append(f'<g class="series" data-points="{s.n}">')
        if s.n:  # the median first, full band width: the bars cover it, its ends stay visible
            half_n, seen, med = (s.n - 1) // 2, 0, 0.0
            for v, c in sorted(s.counts):
                seen += c
                if seen > half_n:
                    med = v
                    break
            body.append(f'<line class="datum" x1="{cx - band * 0.48:.1f}" x2="{cx + band * 0.48:.1f}" '
                        f'y1="{py(med):.1f}" y2="{py(med):.1f}" stroke="#111" stroke-width="2">'
                        f"<title>median {med:.4g}</title></line>")
        for v, c in s.counts:
            if not c:
                continue
            half = max(1.0, band * 0.42 * c / top)
            body.append(f'<rect class="datum" x="{cx - half:.1f}" y="{py(v) - bar_h / 2:.1f}" width="{2 * half:.1f}" '
                        f'height="{bar_h:.1f}" fill="{s.colour}" fill-opacity="0.75">'
                        f"<title>{escape(s.group)} {escape(s.label)}: {c} at {v:.4g}</title></rect>")
        body.append("</g>")
        body.append(f'<text x="{cx:.1f}" y="{base_y + 15}" text-anchor="middle" font-size="11" {FONT}>'
                    f"{escape(s.label)} (n={s.n})</text>")
    for name, centres in groups.items():
        mid = sum(centres) / len(centres)
        body.append(f'<text x="{mid:.1f}" y="{base_y + 32}" text-anchor="middle" font-size="12" '
                    f'font-weight="bold" {FONT}>{escape(name)}</text>')
    body += _legend(frame, [(label, colour, "dot") for label, colour in legend.items()])
    return _svg(frame, title, body)


__all__ = ["Histogram", "Marker", "Series", "histogram_chart", "line_chart", "nice_ticks"]
