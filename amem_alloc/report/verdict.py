"""The verdict panel that opens the predict report: per policy, a bar of the peak reserved memory
against the card's usable memory, split into what fills it.

Design note
-----------
The data is predict/analysis/verdict.py's `verdict(p)` (the JSON's "verdict": per policy its parts, peak
reserved and what it says) and the what-if JSON (`what_if`, `cheapest_change`: predict/whatif/
answers.py's to_json); nothing here reads a prediction object. Which categories each group holds is
amem_alloc/categories.py's (predict/analysis/verdict.py sums them); each group's colour and its
letter in the text bar are here (STYLE). The bars are inline SVG (no script needed, so the panel
reads the same in a browser and in a test); `text_lines` is the verdict as text, the last lines of
`amem predict`'s output (report/prediction_text.py adds the next step after them). Above the
policies' lines (and under the bars in the panel), both say what the device total is made of
beyond the policy's peak reserved: what the process holds outside the caching allocator (the
verdict's "outside_allocator": predict/context.py's lines), each with its label (measured,
documented, estimated, given) and source.
"""
from __future__ import annotations

from .. import categories
from ..introspection import format_bytes
from .html import esc
from .what_if_cost import cost_text

# Each group of the verdict (amem_alloc/categories.py says which categories it holds): its colour
# here and its letter in the text bar.
STYLE = {"parameters": ("#4e79a7", "P"), "gradients": ("#f28e2b", "G"), "optimizer state": ("#e15759", "O"),
         "activations": ("#76b7b2", "A"), "KV cache": ("#9c755f", "K"),
         "autocast copies": ("#59a14f", "C"), "temporaries": ("#edc948", "T"),
         "workspaces": ("#b07aa1", "W"), "cached but free": ("#bab0ac", ".")}
GROUPS = tuple((label, STYLE[label][0], cats, STYLE[label][1]) for label, cats in categories.GROUPS)
BAR_WIDTH = 600     # px of the usable memory in the panel
WHOLE_CARD = ("nvidia-smi lists this device total for the process; its memory.used for the whole card adds the "
              "driver's own reserve, which torch's total leaves out too (618 MiB on an H200 with driver 580)")


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


def answer(v: dict, next_step: list[str] = ()) -> str:
    """The answer, first on the page: per policy whether it fits the card and the one "needs"
    figure (the text's last lines say the same), then the next step when one does not fit."""
    lines = "".join(f'<li class="{"fits" if r["fits"] else "nofit"}"><b>{esc(r["policy"])}</b> on {esc(v["card"])}: '
                    f"{esc(r['says'])}</li>" for r in v["policies"])
    step = "".join(f'<p class="next-step">{esc(line)}</p>' for line in next_step)
    return f'<ul class="answer">{lines}</ul>{step}'


def html_panel(v: dict, what_if: dict | None = None, next_step: list[str] = ()) -> str:
    """The panel from verdict(p)'s dict and the what-if JSON ({"what_if": [...], "cheapest_change": {...}}),
    led by the answer (`next_step`: its lines, report/prediction_text.py's)."""
    rows = []
    for r in v["policies"]:
        cls = "fits" if r["fits"] else "nofit"
        rows.append(f'<tr class="{cls}"><td>{esc(r["policy"])}</td><td>{_svg_bar(r["parts"], v["usable_bytes"], r["peak_reserved"])}'
                    f'</td><td>{esc(format_bytes(r["peak_reserved"]))}</td><td class="says">{esc(r["says"])}</td></tr>')
    legend = "".join(f'<span class="key"><i style="background:{c}"></i>{esc(label)}</span>' for label, c, *_ in GROUPS)
    return (f'<section id="verdict"><h2>Verdict: {esc(v["card"])}, usable {esc(format_bytes(v["usable_bytes"]))}</h2>'
            f'{answer(v, next_step)}<table class="verdict"><tr><th>policy</th><th>peak reserved against usable (the black line)</th>'
            f'<th>peak reserved</th><th></th></tr>{"".join(rows)}</table><p class="legend">{legend}</p>'
            f'<p class="note">Parts as live at the peak of allocated memory; cached but free is the policy\'s peak '
            f'reserved less that. Autocast copies: the casts autocast made.</p>{_outside_table(v.get("outside_allocator"))}'
            f'{_what_if_table(what_if or {})}</section>'
            '<style>#verdict .key{margin-right:1em}#verdict .key i{display:inline-block;width:.8em;height:.8em;'
            'margin-right:.3em}#verdict tr.nofit .says{color:#b00;font-weight:bold}#verdict td{padding:2px 6px}'
            '#verdict ul.answer{font-size:16px;list-style:none;padding:0;margin:6px 0}#verdict li.fits{color:#276749}'
            '#verdict li.nofit{color:#b00;font-weight:600}#verdict .next-step{font-weight:600}</style>')


def _outside_table(o: dict | None) -> str:
    """The device total's parts beyond the peak reserved: what the process holds outside the allocator."""
    if not o:
        return ""
    rows = "".join(f'<tr class="outside-part"><td>{esc(p["part"])}</td><td>{esc(format_bytes(p["bytes"]))}</td>'
                   f'<td>{esc(p["label"])}</td><td>{esc(p["source"])}</td></tr>' for p in o["parts"])
    rows += (f'<tr class="outside-total"><th>outside the caching allocator</th><th>{esc(format_bytes(o["bytes"]))}'
             f' ± {esc(format_bytes(o["uncertainty"]))}</th><th>{esc(o["label"])}</th><th>{esc(o["basis"])}</th></tr>')
    missing = "".join(f"<li>{esc(n)}</li>" for n in o.get("not_counted") or [])
    return ('<h3>Device total: each policy\'s peak reserved plus what the process holds outside the caching '
            f'allocator</h3><table class="outside"><tr><th>part</th><th>bytes</th><th>figure</th><th>source</th></tr>'
            f'{rows}</table>' + (f"<p>Not counted:</p><ul>{missing}</ul>" if missing else "")
            + f'<p class="note">{esc(WHOLE_CARD)}.</p>')


def _what_if_table(what_if: dict) -> str:
    results = what_if.get("what_if") or []
    if not results:
        return ""
    picks = what_if.get("cheapest_change") or {}
    body = []
    for w in results:
        if w["failed"]:
            body.append(f"<tr><td>{esc(w['change'])}</td><td colspan=6>could not be predicted: {esc(w['failed'])}</td></tr>")
        cost = cost_text(w) if w.get("applied") else ""
        for r in w["policies"]:
            saving = r["saving_reserved"]
            body.append(f"<tr><td>{esc(w['change'])}</td><td>{esc(r['policy'])}</td><td>{esc(format_bytes(r['peak_allocated']))}"
                        f"</td><td>{esc(format_bytes(r['peak_reserved']))}</td><td>{'yes' if r['fits'] else 'NO'}</td>"
                        f"<td>{esc(('' if saving >= 0 else '-') + format_bytes(abs(saving)))}</td>"
                        f"<td class=\"cost\">{esc(cost)}</td></tr>")
    by_change = {w["change"]: w for w in results}
    cheapest = "".join(f"<li>{esc(pol)}: {esc(ch + ' (' + cost_text(by_change[ch]) + ')' if ch else 'none of these changes makes it fit')}</li>"
                       for pol, ch in picks.items())
    return ("<h3>What if (each change applied by amem, the code predicted again)</h3><table class=\"whatif\"><tr>"
            "<th>change</th><th>policy</th><th>peak allocated</th><th>peak reserved</th><th>fits</th>"
            f"<th>saving (reserved)</th><th>cost at run time</th></tr>{''.join(body)}</table>"
            + (f"<p>Cheapest change that makes it fit:</p><ul>{cheapest}</ul>" if picks else ""))


# ============================================================================ text
def _bar(split: dict[str, int], usable: int, top: int, width: int = 50) -> str:
    """The text bar: `width` characters for `top` bytes (the usable memory, or the largest peak when
    that is more, so a run far over the card stays one line), '|' where usable memory ends."""
    scale = width / max(top, usable, 1)
    cells = "".join(letter * round(split.get(label, 0) * scale) for label, _, _, letter in GROUPS)
    mark = round(usable * scale)
    cells = cells.ljust(mark)
    return cells[:mark] + "|" + cells[mark:]


def text_lines(v: dict) -> list[str]:
    """The verdict as the lines that end `amem predict`'s text, from its data (the JSON's "verdict"):
    the card, the bars' legend, then one line per policy, last."""
    legend = ", ".join(f"{letter} {label}" for label, _, _, letter in GROUPS)
    lines = [f"Verdict for {v['card']} (usable {format_bytes(v['usable_bytes'])}; '|' marks it):",
             f"  ({legend}; parts as live at the peak of allocated memory)"]
    lines += outside_lines(v.get("outside_allocator"))
    if any(r.get("borderline") for r in v["policies"]):
        lines.append(f"  (borderline: within the device total's uncertainty: {v['uncertainty']}; --context-mb with "
                     "what your process holds outside the allocator, or amem doctor --calibrate on the card, narrows it)")
    width = max(len(r["policy"]) for r in v["policies"]) if v["policies"] else 0
    top = max([v["usable_bytes"]] + [sum(r["parts"].values()) for r in v["policies"]])  # one scale for every bar
    for r in v["policies"]:
        lines.append(f"  {r['policy'].ljust(width)}  [{_bar(r['parts'], v['usable_bytes'], top)}] {r['says']}")
    return lines + growth_lines(v) + batch_search_lines(v)


def batch_search_lines(v: dict) -> list[str]:
    """A script that chooses its batch by running out of memory (predict/batch_search.py): the
    verdict is for the batch it held, which the real run may not keep (a search that shrinks the
    batch only where a policy does not fit; the notes say it either way)."""
    said = v.get("batch_search")
    if not said or not (said["grows"] or any(not r["fits"] for r in v["policies"])):
        return []
    return [f"  not modelled: {said['what']} ({said['where']})"]


def growth_lines(v: dict) -> list[str]:
    """Where allocated memory grows every step (predict/analysis/growth.py): by how much, what keeps
    it, and how many more steps each policy's spare lasts; the verdict holds only for the steps run."""
    g = v.get("growth")
    if not g:
        return []
    first, last = g["steps"]
    kept = "; ".join(f"{s['where']} {format_bytes(s['bytes_per_step'])} a step" for s in g["sites"])
    row = next((r for r in v["policies"] if r.get("steps_left") is not None), None)
    lasts = (f": at this rate {row['policy']}'s {format_bytes(row['spare'])} to spare is gone after about "
             f"{row['steps_left']:,} more steps") if row else ""
    return [f"  grows every step: +{format_bytes(g['bytes_per_step'])} a step, steps {first} to {last} "
            f"(allocated at their ends {format_bytes(g['allocated'][0])} to {format_bytes(g['allocated'][-1])}), "
            f"kept by {kept or 'storages made with no frame of the script'}; the verdict covers the {last} steps "
            f"run{lasts}"]


def outside_lines(o: dict | None) -> list[str]:
    """The device total's breakdown beyond the peak reserved, as text (none where nothing is held
    outside the allocator: --capacity-gb's device, or --context-mb 0)."""
    if not o or not o["bytes"]:
        return []
    body = [[p["part"], format_bytes(p["bytes"]), p["label"], p["source"]] for p in o["parts"]]
    body.append(["outside the caching allocator", format_bytes(o["bytes"]), f"± {format_bytes(o['uncertainty'])}", ""])
    width = [max(len(row[i]) for row in body) for i in range(3)]
    lines = ["  Device total = the policy's peak reserved + what the process holds outside the caching allocator:"]
    lines += [f"    {a.ljust(width[0])}  {b.rjust(width[1])}  {c.ljust(width[2])}  {d}".rstrip() for a, b, c, d in body]
    lines.append(f"    figures: {o['basis']}")
    lines += [f"    not counted: {n}" for n in o.get("not_counted") or []]
    return lines + [f"    {WHOLE_CARD}"]
