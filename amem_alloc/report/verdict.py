"""The verdict panel that opens the predict report: per policy, a bar of the peak reserved memory
against the card's usable memory, split into what fills it.

Design note
-----------
The data is predict/verdict.py's `verdict(p)` (the JSON's "verdict": per policy its parts, peak
reserved and what it says) and the what-if JSON (`what_if`, `cheapest_change`: predict/whatif.py's
to_json); nothing here reads a prediction object. GROUPS is the one table of the verdict's groups:
which of the Tracer's categories each holds (predict/verdict.py sums them), its colour here and its
letter in the text bar. The bars are inline SVG (no script needed, so the panel reads the same in a
browser and in a test).
"""
from __future__ import annotations

from ..introspection import format_bytes
from .html import esc

GROUPS = (  # (label, colour, the Tracer's categories, the letter of the text bar)
    ("parameters", "#4e79a7", ("parameter", "parameter (gathered)", "buffer"), "P"),
    ("gradients", "#f28e2b", ("gradient",), "G"),
    ("optimizer state", "#e15759", ("optimizer_state",), "O"),
    ("activations", "#76b7b2", ("activation", "autograd_detail"), "A"),
    ("autocast copies", "#59a14f", (), "C"),
    ("temporaries", "#edc948", None, "T"),               # None: every category not named elsewhere
    ("workspaces", "#b07aa1", ("workspace",), "W"),
    ("cached but free", "#bab0ac", (), "."),
)
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
