"""`amem compare`'s page (compare.html), built from the data compare/table.py hands over.

The data is JSON-able: the title and subtitle, the lines that say what was run (`preamble`), the
table's `columns` and `rows` (the cells, already text: replay/evaluation.py names them), the
`footnotes`, and the timelines to plot (`plot`: compare/table.py's plot_data). The page is the
report's own template (offline, strict Content-Security-Policy); the plot is inline SVG
(report/line_chart.py), so it needs no matplotlib.
"""
from __future__ import annotations

from pathlib import Path

from .. import atomic_write
from ..timeline import downsample
from ..version import __version__
from . import html as _html
from . import line_chart


def _table(columns: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{_html.esc(h)}</th>" for h in columns)
    body = "".join("<tr>" + "".join(f"<td>{_html.esc(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


MAX_POINTS = 600  # per configuration and series in the SVG


def _plot(plot: dict | None) -> list[str]:
    """Allocated (dashed) and reserved (solid) over time, one colour per configuration, as inline SVG."""
    series = [s for s in (plot or {}).get("series", []) if s["timeline"]]
    if not series:
        return []
    lines = []
    for i, s in enumerate(series):
        points = s["timeline"]
        known = all(p[1] is not None for p in points)  # a native trace knows reserved only
        keep = downsample(len(points), MAX_POINTS, [[p[2] for p in points]] + ([[p[1] for p in points]] if known else []))
        xs, reserved = [points[k][0] for k in keep], [points[k][2] for k in keep]
        lines.append(line_chart.Line(f"{s['policy']}: reserved", line_chart.colour(i), xs, reserved))
        if known:
            lines.append(line_chart.Line(f"{s['policy']}: allocated", line_chart.colour(i), xs,
                                         [points[k][1] for k in keep], dashed=True))
    end = f"{max(s['timeline'][-1][0] for s in series):,} ({plot['unit']})"
    steps = plot.get("steps") or []
    return ["<h2>Allocated and reserved over time</h2>",
            line_chart.chart(lines, end, "compare-plot", "allocated and reserved memory over time, one colour "
                             "per configuration", marks=steps),
            f"<p class='legend'>{line_chart.legend([s['policy'] for s in series])}<br>solid: reserved, dashed: "
            f"allocated; x axis: {_html.esc(plot['unit'])}" + ("; grey rules: optimizer steps" if steps else "")
            + "</p>"]


def section(data: dict) -> str:
    parts = ['<section class="compare"><h2>Configurations</h2>']
    parts += [f"<p>{_html.esc(line)}</p>" for line in data["preamble"]]
    parts.append(_table(data["columns"], data["rows"]))
    parts.append("<ul>" + "".join(f"<li>{_html.esc(n)}</li>" for n in data["footnotes"]) + "</ul>")
    parts += _plot(data.get("plot"))
    return "\n".join(parts + ["</section>"])


def page(data: dict) -> str:
    return _html.page(data["title"], data["subtitle"], section(data), {"devices": []}, __version__)


def write_page(data: dict, path: str | Path) -> Path:
    return atomic_write.write_text(path, page(data))
