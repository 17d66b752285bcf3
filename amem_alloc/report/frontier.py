"""amem fit --across's page: the frontier of what fits over two arguments, as a table and a plot
(inline SVG, static: no script), from the Frontier's JSON (predict/fit.py)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from .. import atomic_write
from ..version import __version__
from .html import esc, page

WIDTH, HEIGHT, PAD = 520, 280, 48
COLOURS = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1")


def _series(d: dict) -> dict[str, list[tuple[int, int | None]]]:
    """policy -> [(value of the second argument, largest first argument that fits, or None)]."""
    out: dict[str, list] = {}
    for row in d["frontier"]:
        for p in (row["fit"] or {}).get("policies", []):
            out.setdefault(p["policy"], [])
    for row in d["frontier"]:
        largest = {p["policy"]: p["largest"] for p in (row["fit"] or {}).get("policies", [])}
        for policy in out:
            out[policy].append((row["value"], largest.get(policy)))
    return out


def _svg(d: dict) -> str:
    series = _series(d)
    xs = [r["value"] for r in d["frontier"]]
    top = max([y for s in series.values() for _, y in s if y is not None] or [1])
    x_of = {x: PAD + (WIDTH - 2 * PAD) * (i / max(len(xs) - 1, 1)) for i, x in enumerate(xs)}   # even steps
    y_of = lambda y: HEIGHT - PAD - (HEIGHT - 2 * PAD) * (y / top)                               # noqa: E731
    parts = [f'<line x1="{PAD}" y1="{HEIGHT - PAD}" x2="{WIDTH - PAD}" y2="{HEIGHT - PAD}" stroke="#000"/>',
             f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{HEIGHT - PAD}" stroke="#000"/>']
    parts += [f'<text x="{x_of[x]:.0f}" y="{HEIGHT - PAD + 16}" text-anchor="middle" font-size="11">{x}</text>' for x in xs]
    parts.append(f'<text x="{WIDTH / 2:.0f}" y="{HEIGHT - 8}" text-anchor="middle" font-size="12">--{esc(d["across"])}</text>')
    parts.append(f'<text x="12" y="{PAD - 12}" font-size="12">largest --{esc(d["arg"])} that fits (0 to {top})</text>')
    for i, (policy, points) in enumerate(series.items()):
        colour = COLOURS[i % len(COLOURS)]
        pts = " ".join(f"{x_of[x]:.1f},{y_of(y):.1f}" for x, y in points if y is not None)
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{pts}"><title>{esc(policy)}'
                     "</title></polyline>")
        parts += [f'<circle cx="{x_of[x]:.1f}" cy="{y_of(y):.1f}" r="3" fill="{colour}"><title>{esc(policy)}: '
                  f'--{esc(d["arg"])} {y} at --{esc(d["across"])} {x}</title></circle>' for x, y in points if y is not None]
        parts.append(f'<text x="{WIDTH - PAD + 4}" y="{PAD + 14 * i}" font-size="11" fill="{colour}">{esc(policy)}</text>')
    return f'<svg class="frontier" width="{WIDTH + 60}" height="{HEIGHT}">{"".join(parts)}</svg>'


def _table(d: dict) -> str:
    series = _series(d)
    head = "".join(f"<th>{esc(p)}</th>" for p in series)
    rows = []
    for i, row in enumerate(d["frontier"]):
        cells = "".join(f"<td>{'-' if s[i][1] is None else s[i][1]}</td>" for s in series.values())
        why = f"<td>{esc(row['why'])}</td>" if row["why"] else "<td></td>"
        rows.append(f"<tr><td>{row['value']}</td>{cells}{why}</tr>")
    return (f'<table><tr><th>--{esc(d["across"])}</th>{head}<th></th></tr>{"".join(rows)}</table>')


def html(d: dict) -> str:
    body = (f"<section><h2>The largest --{esc(d['arg'])} that fits, per policy</h2>{_svg(d)}{_table(d)}"
            f"<p>{sum(len(r['fit']['trials']) for r in d['frontier'] if r['fit'])} predictions in "
            f"{d['seconds']:.1f} s; each cell fits and the next value was predicted and does not.</p></section>")
    return page(f"amem fit: --{d['arg']} x --{d['across']}", "the frontier of what fits", body, None, __version__)


def write(path: Any, data: dict) -> Path:
    return atomic_write.write_text(path, html(data))
