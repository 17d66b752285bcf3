"""The verdict at a glance: does the predicted run fit the card, by how much, and what fills it.

Design note
-----------
For each policy, a bar of the peak reserved memory against the card's usable memory, split into
what the storages live at the peak of allocated memory are (the Tracer's categories, grouped:
parameters, gradients, optimizer state, activations, autocast copies, temporaries, workspaces) and
what the policy reserved beyond them (cached but free: fragmentation and the cache). Those parts
are measured at the peak of allocated memory, the same for every policy; the policy's peak
reserved may come at another moment, so "cached but free" is peak reserved less allocated at that
peak (never below 0). Autocast copies are the storages that autocast's casts made
(predict/autocast.py notes each cast it makes); the rest of a category is as the Tracer says.

`verdict(p)` is the data (also in the JSON as "verdict"); `text_lines` the text that opens
`amem predict`'s output; `html_panel` the section that opens the predict report, drawn as inline
SVG (no script needed, so it reads the same in a browser and in a test).
"""
from __future__ import annotations

from typing import Any

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


def _group_of(category: str) -> str:
    for label, _, cats, _ in GROUPS:
        if cats and category in cats:
            return label
    return "temporaries"


def parts_at_peak(p: Any) -> dict[str, int]:
    """Bytes live at the peak of allocated memory per group (cached but free left out)."""
    out = {label: 0 for label, *_ in GROUPS if label != "cached but free"}
    autocast = getattr(p, "autocast_keys", frozenset())
    for key, n in (p.at_peak.live or {}).items():
        if key in autocast:
            out["autocast copies"] += n
        else:
            info = p.infos.get(key)
            out[_group_of(getattr(info, "category", None) or "unknown")] += n
    return out


def verdict(p: Any) -> dict:
    g = p.gpu
    parts = parts_at_peak(p)
    rows = []
    for r in p.rows:
        split = dict(parts)
        split["cached but free"] = max(0, r.peak_reserved - p.at_peak.allocated)
        short = r.min_capacity - g.usable
        rows.append({"policy": r.policy, "fits": r.fits, "peak_reserved": r.peak_reserved,
                     "min_capacity": r.min_capacity, "headroom": r.headroom, "short_by": max(0, short),
                     "parts": split, "says": says(r, g.usable)})
    return {"card": g.name, "usable_bytes": g.usable, "capacity_bytes": g.total_memory, "policies": rows,
            "parts_measured_at": "the peak of allocated memory (cached but free: peak reserved less that)"}


def says(r: Any, usable: int) -> str:
    if not r.fits:
        return f"does not fit: needs {format_bytes(r.min_capacity)}, {format_bytes(r.min_capacity - usable)} more " \
               "than usable"
    if r.headroom < 0:
        return (f"fits only by emptying its cache when a cudaMalloc fails (needs {format_bytes(r.min_capacity)}; "
                f"peak reserved {format_bytes(r.peak_reserved)})")
    return f"fits, {format_bytes(r.headroom)} to spare"


# ============================================================================ text
def _bar(split: dict[str, int], usable: int, width: int = 50) -> str:
    scale = width / max(usable, 1)
    cells = ""
    for label, _, _, letter in GROUPS:
        cells += letter * round(split.get(label, 0) * scale)
    return cells[:width] + "|" + cells[width:] if len(cells) > width else cells.ljust(width) + "|"


def text_lines(p: Any) -> list[str]:
    v = verdict(p)
    lines = [f"Verdict for {v['card']} (usable {format_bytes(v['usable_bytes'])}; '|' marks it):"]
    width = max(len(r["policy"]) for r in v["policies"]) if v["policies"] else 0
    for r in v["policies"]:
        lines.append(f"  {r['policy'].ljust(width)}  [{_bar(r['parts'], v['usable_bytes'])}] {r['says']}")
    legend = ", ".join(f"{letter} {label}" for label, _, _, letter in GROUPS)
    lines.append(f"  ({legend}; parts as live at the peak of allocated memory)")
    return lines + [""]


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


def html_panel(p: Any, cheapest: dict | None = None) -> str:
    v = verdict(p)
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
            f'reserved less that. Autocast copies: the casts autocast made.</p>{_what_if_table(p, cheapest or {})}</section>'
            '<style>#verdict .key{margin-right:1em}#verdict .key i{display:inline-block;width:.8em;height:.8em;'
            'margin-right:.3em}#verdict tr.nofit .says{color:#b00;font-weight:bold}#verdict td{padding:2px 6px}</style>')


def _what_if_table(p: Any, picks: dict) -> str:
    results = getattr(p, "what_if", None) or []
    if not results:
        return ""
    body = []
    for w in results:
        if w.failed:
            body.append(f"<tr><td>{esc(w.change)}</td><td colspan=5>could not be predicted: {esc(w.failed)}</td></tr>")
        for r in w.rows:
            saving = p.row(r.policy).peak_reserved - r.peak_reserved
            body.append(f"<tr><td>{esc(w.change)}</td><td>{esc(r.policy)}</td><td>{esc(format_bytes(r.peak_allocated))}"
                        f"</td><td>{esc(format_bytes(r.peak_reserved))}</td><td>{'yes' if r.fits else 'NO'}</td>"
                        f"<td>{esc(('' if saving >= 0 else '-') + format_bytes(abs(saving)))}</td></tr>")
    cheapest = "".join(f"<li>{esc(pol)}: {esc(ch or 'none of these changes makes it fit')}</li>" for pol, ch in picks.items())
    return ("<h3>What if (each change applied by amem, the code predicted again)</h3><table class=\"whatif\"><tr>"
            "<th>change</th><th>policy</th><th>peak allocated</th><th>peak reserved</th><th>fits</th>"
            f"<th>saving (reserved)</th></tr>{''.join(body)}</table>"
            + (f"<p>Cheapest change that makes it fit:</p><ul>{cheapest}</ul>" if picks else ""))


# ============================================================================ the predicted run's trace, for reading
def display_path(filename: str, base: str | None) -> str:
    """A frame's file as a reader wants it: relative to the script's folder when inside it, a library
    file as package/path.py (site-packages dropped), anything else as it was."""
    import os

    from ..code_files import short_path

    if base and filename.startswith(base.rstrip(os.sep) + os.sep):
        return os.path.relpath(filename, base)
    return short_path(filename)


def script_folder(target: str) -> str | None:
    """The folder of a predicted script ("script train.py --x 1" -> its absolute folder)."""
    import os

    parts = target.split()
    if len(parts) >= 2 and parts[0] == "script" and parts[1].endswith(".py"):
        return os.path.dirname(os.path.abspath(parts[1]))
    return None


def readable_snapshot(snap: dict, base: str | None) -> dict:
    """The predicted snapshot for the report: no timestamps (the replay's clock is not the run's, so
    the x axis counts events: replay order) and frames' files as display_path shows them."""
    def frames(holder: dict) -> None:
        for f in holder.get("frames") or []:
            f["filename"] = display_path(str(f["filename"]), base)
    for trace in snap.get("device_traces") or []:
        for ev in trace:
            ev.pop("time_us", None)
            frames(ev)
    for seg in snap.get("segments") or []:
        for block in seg.get("blocks") or []:
            frames(block)
    return snap


REPLAY_ORDER = ("Predicted run: the x axis is replay order (the n-th allocator event of the predicted program), "
                "not time.")


def label_replay_order(data: dict) -> dict:
    for dev in data.get("devices") or []:
        notes = [n for n in dev.get("notes") or [] if "no timestamps" not in n]
        dev["notes"] = [REPLAY_ORDER] + notes
    return data
