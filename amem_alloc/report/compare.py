"""`amem compare`'s page (compare.html), built from the data compare/table.py hands over.

The data is JSON-able: the title and subtitle, the lines that say what was run (`preamble`), the
table's `columns` and `rows` (the cells, already text: replay/evaluation.py names them), the
`footnotes`, and the path of the plot (`plot_png`, report/plot.py's compare.png) or None. The page
is the report's own template (offline, strict Content-Security-Policy), the plot inlined.
"""
from __future__ import annotations

import base64
from pathlib import Path

from .. import atomic_write
from ..version import __version__
from . import html as _html


def _table(columns: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{_html.esc(h)}</th>" for h in columns)
    body = "".join("<tr>" + "".join(f"<td>{_html.esc(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _plot(png: str | None) -> list[str]:
    if png is None or not Path(png).exists():
        return []
    data = base64.b64encode(Path(png).read_bytes()).decode()
    return [f'<h2>Allocated and reserved over time</h2><img alt="allocated and reserved memory over '
            f'time, one colour per configuration" src="data:image/png;base64,{data}" style="max-width:100%">']


def section(data: dict) -> str:
    parts = ['<section class="compare"><h2>Configurations</h2>']
    parts += [f"<p>{_html.esc(line)}</p>" for line in data["preamble"]]
    parts.append(_table(data["columns"], data["rows"]))
    parts.append("<ul>" + "".join(f"<li>{_html.esc(n)}</li>" for n in data["footnotes"]) + "</ul>")
    parts += _plot(data.get("plot_png"))
    return "\n".join(parts + ["</section>"])


def page(data: dict) -> str:
    return _html.page(data["title"], data["subtitle"], section(data), {"devices": []}, __version__)


def write_page(data: dict, path: str | Path) -> Path:
    return atomic_write.write_text(path, page(data))
