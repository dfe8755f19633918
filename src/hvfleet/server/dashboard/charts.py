"""Time-series charts of the dashboard's history, drawn by the server as SVG
(templates/history_chart.html, Jinja2, autoescaped): per resource, what is
allocated (filled), what reservations hold on top of it (hatched), and the
effective capacity (a dashed line), as steps (a point holds until the next),
over a time axis in UTC with its scale, a value axis in the resource's unit,
a legend, and the same figures as a data table for anyone who does not read
the picture. Nothing is fetched from elsewhere and no script draws it, so it
runs under the pages' CSP as it is.

This module only computes geometry from history.chart_document; every
figure shown as text is the core's own string (model.views.human).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from fractions import Fraction
from typing import Any

from hvfleet.model.quantity import Quantity
from hvfleet.model.readable import human
from hvfleet.model.resources import ResourceName
from hvfleet.server.dashboard.html import render as render_template

WIDTH, HEIGHT = 640, 220
LEFT, RIGHT, TOP, BOTTOM = 64, 12, 12, 36  # the plot area's margins
RANGE_LABELS = {"hour": "last hour", "day": "last day", "week": "last week"}
# Time ticks per range: seconds between ticks, and how a tick is written.
_TIME_TICKS = {"hour": (600, "%H:%M"), "day": (3 * 3600, "%H:%M"), "week": (86_400, "%a %d")}


@dataclass(frozen=True)
class Tick:
    at: float  # pixel position along its axis
    text: str


@dataclass(frozen=True)
class Chart:
    resource: str
    title: str
    unit: str
    allocated: str  # SVG path of the filled allocated area
    held: str  # the area between allocated and allocated + held
    effective: str  # the effective capacity's line
    x_ticks: list[Tick]
    y_ticks: list[Tick]
    rows: list[list[str]]  # the data table: time, allocated, held, effective
    latest: list[str]  # the newest figures: allocated, held, effective
    empty: bool


def _nice_step(top: float, counts_bytes: bool) -> float:
    """A tick step giving at most 5 ticks up to `top`: 1, 2, 5 × 10^k, or a
    power of two for bytes (so they read as whole Gi/Mi)."""
    raw = top / 5 if top > 0 else 1.0
    if counts_bytes:
        # The least power of two at least `raw`, however large: a host at the
        # model's bounds holds 10**30 bytes of huge pages.
        return float(2 ** max(0, math.ceil(math.log2(raw))))
    magnitude = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    for m in (1, 2, 5, 10):
        if m * magnitude >= raw:
            return float(m * magnitude)
    return float(10 * magnitude)


Point = tuple[float, float]


def _step_path(ts: list[int], values: list[float | None], x: Callable[[float], float],
               y: Callable[[float], float], end: int) -> list[Point]:
    """The points of a step line: each value held until the next point's time, the last until `end`."""
    out: list[tuple[float, float]] = []
    for i, (t, v) in enumerate(zip(ts, values, strict=True)):
        if v is None:
            continue
        t_next = ts[i + 1] if i + 1 < len(ts) else end
        out += [(x(t), y(v)), (x(t_next), y(v))]
    return out


def _line(points: list[tuple[float, float]]) -> str:
    return " ".join(f"{'M' if i == 0 else 'L'}{px:.1f},{py:.1f}" for i, (px, py) in enumerate(points))


def _area(upper: list[tuple[float, float]], lower: list[tuple[float, float]]) -> str:
    if not upper:
        return ""
    back = list(reversed(lower))
    return _line(upper + back) + " Z"


def build(doc: dict[str, Any]) -> list[Chart]:
    """One chart per resource of a history.chart_document."""
    start: int = doc["start"]
    end: int = doc["end"]
    ts: list[int] = doc["t"]
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(t: float) -> float:
        return LEFT + (max(t, start) - start) / max(end - start, 1) * plot_w

    every, fmt = _TIME_TICKS.get(doc["range"], (600, "%H:%M"))
    first = (start // every + 1) * every
    x_ticks = [Tick(x(t), datetime.fromtimestamp(t, UTC).strftime(fmt)) for t in range(first, end + 1, every)]
    charts = []
    for r, lines in doc["resources"].items():
        name = ResourceName.parse(r, where="resource")
        alloc = lines["allocated"]["values"]
        held = lines["held"]["values"]
        eff = lines["effective"]["values"]
        used = [a + h if a is not None and h is not None else None for a, h in zip(alloc, held, strict=True)]
        top = max([v for v in [*used, *eff] if v is not None] or [1.0]) * 1.1 or 1.0
        step = _nice_step(top, name.counts_bytes)
        top = math.ceil(top / step) * step

        def y(v: float, top: float = top) -> float:
            return TOP + plot_h - (v / top) * plot_h if top else TOP + plot_h

        y_ticks = [Tick(y(k * step), human(name, Quantity(Fraction(k * step).limit_denominator(1000))))
                   for k in range(int(top / step) + 1)]
        zero = [0.0 if v is not None else None for v in alloc]
        alloc_line = _step_path(ts, alloc, x, y, end)
        used_line = _step_path(ts, used, x, y, end)
        base_line = _step_path(ts, zero, x, y, end)
        rows = [[datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S"),
                 lines["allocated"]["text"][i], lines["held"]["text"][i], lines["effective"]["text"][i]]
                for i, t in enumerate(ts)]
        unit = "bytes, binary units" if name.counts_bytes else ("cores" if r == "cpu" else "units")
        charts.append(Chart(
            resource=r, title=f"{r} ({unit})", unit=unit,
            allocated=_area(alloc_line, base_line), held=_area(used_line, alloc_line),
            effective=_line(_step_path(ts, eff, x, y, end)), x_ticks=x_ticks, y_ticks=y_ticks,
            rows=list(reversed(rows)), empty=not ts,
            latest=[lines[k]["text"][-1] if ts else "-" for k in ("allocated", "held", "effective")]))
    return charts


def render(doc: dict[str, Any], heading: str, link: Callable[[str], str], prefix: str, level: int = 3) -> str:
    """The history section of one series (doc: history.chart_document) as HTML;
    `link(range)` is the URL that shows another range, `prefix` keeps its ids
    apart from other charts on the page."""
    return render_template(
        "history_chart.html",
        doc=doc, charts=build(doc), heading=heading, link=link, prefix=prefix, level=level,
        range_label=RANGE_LABELS.get(doc["range"], doc["range"]), ranges=list(RANGE_LABELS.items()),
        width=WIDTH, height=HEIGHT, left=LEFT, right=RIGHT, bottom=BOTTOM)
