"""The verdict panel that opens the predict report: per policy, a bar of the peak reserved memory
against the card's usable memory, split into what fills it.

Design note
-----------
The data is predict/analysis/verdict.py's `verdict(p)` (the JSON's "verdict": per policy its parts, peak
reserved and what it says) and the what-if JSON (`what_if`, `cheapest_change`: predict/whatif/
answers.py's to_json); nothing here reads a prediction object. Which categories each group holds is
amem_alloc/categories.py's (predict/analysis/verdict.py sums them); each group's colour and its
letter in the text bar are here (STYLE). The bars are inline SVG (no script needed, so the panel
reads the same in a browser and in a test); `text_lines` is the verdict as text.
"""
from __future__ import annotations

from .. import categories
from ..introspection import format_bytes
from .html import esc

# Each group of the verdict (amem_alloc/categories.py says which categories it holds): its colour
# here and its letter in the text bar.
STYLE = {"parameters": ("#4e79a7", "P"), "gradients": ("#f28e2b", "G"), "optimizer state": ("#e15759", "O"),
         "activations": ("#76b7b2", "A"), "KV cache": ("#9c755f", "K"),
         "autocast copies": ("#59a14f", "C"), "temporaries": ("#edc948", "T"),
         "workspaces": ("#b07aa1", "W"), "cached but free": ("#bab0ac", ".")}
GROUPS = tuple((label, STYLE[label][0], cats, STYLE[label][1]) for label, cats in categories.GROUPS)
BAR_WIDTH = 600     # px of the usable memory in the panel


# ============================================================================ HTML
def _svg_bar(split: dict[str, int], usable: int, peak: int) -> str:
    scale = BAR_WIDTH / max(usable, peak, 1)
    x, rects = 0.0, []
    for label, colour, *_ in GROUPS:
        w = split.get(label, 0) * scale
        if w > 0:
            rects.append(f'<rect class="part" data-part="{esc(label)}" x="{x:.1f}" y="2" width="{w:.1f}" height="18" '
                         f'fill="{colour}"><title>{esc(label)}: {esc(format_bytes(split[label]))}</title></rect>')
            x += w
    line = usable * scale
    rects.append(f'<line class="usable" x1="{line:.1f}" x2="{line:.1f}" y1="0" y2="22" stroke="#000" stroke-width="2"/>')
    return f'<svg class="verdict-bar" width="{BAR_WIDTH + 4}" height="22">{"".join(rects)}</svg>'


def html_panel(v: dict, what_if: dict | None = None) -> str:
    """The panel from verdict(p)'s dict and the what-if JSON ({"what_if": [...], "cheapest_change": {...}})."""
    rows = []
    for r in v["policies"]:
        cls = "fits" if r["fits"] else "nofit"
        rows.append(f'<tr class="{cls}"><td>{esc(r["policy"])}</td><td>{_svg_bar(r["parts"], v["usable_bytes"], r["peak_reserved"])}'
                    f'</td><td>{esc(format_bytes(r["peak_reserved"]))}</td><td class="says">{esc(r["says"])}</td></tr>')
    legend = "".join(f'<span class="key"><i style="background:{c}"></i>{esc(label)}</span>' for label, c, *_ in GROUPS)
    return (f'<section id="verdict"><h2>Verdict: {esc(v["card"])}, usable {esc(format_bytes(v["usable_bytes"]))}</h2>'
            f'<table class="verdict"><tr><th>policy</th><th>peak reserved against usable (the black line)</th>'
            f'<th>peak reserved</th><th></th></tr>{"".join(rows)}</table><p class="legend">{legend}</p>'
            f'<p class="note">Parts as live at the peak of allocated memory; cached but free is the policy\'s peak '
            f'reserved less that. Autocast copies: the casts autocast made.</p>{_what_if_table(what_if or {})}</section>'
            '<style>#verdict .key{margin-right:1em}#verdict .key i{display:inline-block;width:.8em;height:.8em;'
            'margin-right:.3em}#verdict tr.nofit .says{color:#b00;font-weight:bold}#verdict td{padding:2px 6px}</style>')


def _what_if_table(what_if: dict) -> str:
    results = what_if.get("what_if") or []
    if not results:
        return ""
    picks = what_if.get("cheapest_change") or {}
    body = []
    for w in results:
        if w["failed"]:
            body.append(f"<tr><td>{esc(w['change'])}</td><td colspan=5>could not be predicted: {esc(w['failed'])}</td></tr>")
        for r in w["policies"]:
            saving = r["saving_reserved"]
            body.append(f"<tr><td>{esc(w['change'])}</td><td>{esc(r['policy'])}</td><td>{esc(format_bytes(r['peak_allocated']))}"
                        f"</td><td>{esc(format_bytes(r['peak_reserved']))}</td><td>{'yes' if r['fits'] else 'NO'}</td>"
                        f"<td>{esc(('' if saving >= 0 else '-') + format_bytes(abs(saving)))}</td></tr>")
    cheapest = "".join(f"<li>{esc(pol)}: {esc(ch or 'none of these changes makes it fit')}</li>" for pol, ch in picks.items())
    return ("<h3>What if (each change applied by amem, the code predicted again)</h3><table class=\"whatif\"><tr>"
            "<th>change</th><th>policy</th><th>peak allocated</th><th>peak reserved</th><th>fits</th>"
            f"<th>saving (reserved)</th></tr>{''.join(body)}</table>"
            + (f"<p>Cheapest change that makes it fit:</p><ul>{cheapest}</ul>" if picks else ""))


# ============================================================================ text
def _bar(split: dict[str, int], usable: int, width: int = 50) -> str:
    scale = width / max(usable, 1)
    cells = ""
    for label, _, _, letter in GROUPS:
        cells += letter * round(split.get(label, 0) * scale)
    return cells[:width] + "|" + cells[width:] if len(cells) > width else cells.ljust(width) + "|"


def text_lines(v: dict) -> list[str]:
    """The lines that open `amem predict`'s text, from the verdict's data (the JSON's "verdict")."""
    lines = [f"Verdict for {v['card']} (usable {format_bytes(v['usable_bytes'])}; '|' marks it):"]
    width = max(len(r["policy"]) for r in v["policies"]) if v["policies"] else 0
    for r in v["policies"]:
        lines.append(f"  {r['policy'].ljust(width)}  [{_bar(r['parts'], v['usable_bytes'])}] {r['says']}")
    legend = ", ".join(f"{letter} {label}" for label, _, _, letter in GROUPS)
    lines.append(f"  ({legend}; parts as live at the peak of allocated memory)")
    return lines + [""]
