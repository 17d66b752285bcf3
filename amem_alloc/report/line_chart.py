"""Memory over time as inline SVG: the pages' line charts (the ranks side by side, amem compare's
configurations), drawn here so a page needs neither matplotlib nor a script to show them.

Each line is a label, a colour, x and y values (bytes) and solid or dashed; `marks` are x values
drawn as thin vertical rules (optimizer steps). The y axis starts at 0 and is labelled with its top.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..introspection import format_bytes
from .html import esc

COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
WIDTH, HEIGHT, PAD = 900, 300, 56


@dataclass
class Line:
    label: str
    colour: str
    xs: list
    ys: list
    dashed: bool = False


def colour(i: int) -> str:
    return COLOURS[i % len(COLOURS)]


def _polyline(line: Line, sx, sy) -> str:
    points = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in zip(line.xs, line.ys))
    dash = " stroke-dasharray='5,3'" if line.dashed else ""
    return (f"<polyline fill='none' stroke='{line.colour}' stroke-width='1.5'{dash} points='{points}'>"
            f"<title>{esc(line.label)}</title></polyline>")


def chart(lines: list[Line], x_end: str, css_class: str, aria: str, marks: list | None = None,
          standalone: bool = False) -> str:
    """The <svg> of `lines` on shared axes; `x_end` labels the x axis's right end. standalone: an
    .svg file of its own (its namespace declared, a white background)."""
    x_max = max((ln.xs[-1] for ln in lines if ln.xs), default=1) or 1
    y_max = max((max(ln.ys, default=0) for ln in lines), default=1) or 1
    sx = lambda x: PAD + (WIDTH - 2 * PAD) * x / x_max  # noqa: E731
    sy = lambda y: HEIGHT - PAD / 2 - (HEIGHT - PAD) * y / y_max  # noqa: E731
    rules = "".join(f"<line class='mark' x1='{sx(x):.1f}' x2='{sx(x):.1f}' y1='{sy(y_max):.1f}' y2='{sy(0):.1f}' "
                    "stroke='#ddd'/>" for x in marks or [])
    own = " xmlns='http://www.w3.org/2000/svg'" if standalone else ""
    back = f"<rect width='{WIDTH}' height='{HEIGHT}' fill='#fff'/>" if standalone else ""
    return (f"<svg{own} class='{css_class}' viewBox='0 0 {WIDTH} {HEIGHT}' width='{WIDTH}' height='{HEIGHT}' role='img' "
            f"aria-label='{esc(aria)}'>{back}{rules}"
            f"<line x1='{PAD}' y1='{sy(0):.1f}' x2='{WIDTH - PAD}' y2='{sy(0):.1f}' stroke='#888'/>"
            f"<text x='{PAD}' y='14' font-size='12'>{esc(format_bytes(y_max))}</text>"
            f"<text x='{WIDTH - PAD}' y='{HEIGHT - 4}' font-size='12' text-anchor='end'>{esc(x_end)}</text>"
            f"{''.join(_polyline(ln, sx, sy) for ln in lines)}</svg>")


def legend(labels: list[str]) -> str:
    """A coloured square and label per series, in the lines' colours (colour(i) for the i-th)."""
    return "".join(f"<span style='color:{colour(i)}'>&#9632; {esc(label)}</span> " for i, label in enumerate(labels))
