"""The report page: static HTML for the tables and notes, plus the data and script for the plots.

Every string that comes from a trace (file names, tags, settings, provenance) is escaped here
or embedded in a JSON block the script reads with JSON.parse and writes with textContent.
"""
from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

from ..introspection import format_bytes

HERE = Path(__file__).resolve().parent
MAX_TEXT = 300  # characters of one provenance or settings value shown
MAX_SUMMARY_OOMS = 5  # out-of-memory errors named one by one at the top of the page


def _asset(name: str) -> str:
    return (HERE / name).read_text(encoding="utf-8")


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def short(value: Any, depth: int = 0) -> str:
    """A bounded one-line text for any plain value (no recursion past a few levels)."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        text = str(value)
    elif depth >= 2:
        text = f"<{type(value).__name__} of {len(value)}>" if hasattr(value, "__len__") else type(value).__name__
    elif isinstance(value, dict):
        items = list(value.items())[:12]
        text = "{" + ", ".join(f"{short(k, depth + 1)}: {short(v, depth + 1)}" for k, v in items)
        text += ", ...}" if len(value) > 12 else "}"
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = list(value)[:12]
        text = "[" + ", ".join(short(v, depth + 1) for v in items) + (", ...]" if len(value) > 12 else "]")
    else:
        text = type(value).__name__
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + "..."


def _json_for_script(data: Any) -> str:
    text = json.dumps(data, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _time(t: Any, unit: str) -> str:
    if t is None:
        return "—"
    if unit == "event":
        return f"event {int(t)}"
    if unit == "call":   # a predicted run: amem predict's "after allocator call N"
        return f"after allocator call {int(t):,}"
    return f"{t / 1e6:.3f} s" if t >= 1e6 else f"{t / 1e3:.1f} ms" if t >= 1e3 else f"{t:.0f} µs"


# ============================================================================ sections
def _cards(dev: dict) -> str:
    seg = dev["segmap"]
    cards = [("peak allocated", format_bytes(dev["peak"]["allocated"])),
             ("reserved at that peak", format_bytes(dev["peak"]["reserved"])),
             ("peak reserved", format_bytes(dev["peak"]["peak_reserved"])),
             ("largest free gap at peak", format_bytes(seg["largest_free"])),
             ("live before recording, at the peak", _share(dev["held"]["before"], dev["held"]["bytes"])),
             ("events", f"{dev['events']:,}"), ("streams", str(len(dev["streams"]))),
             ("out-of-memory errors", str(len(dev["ooms"])))]
    return '<div class="cards">' + "".join(f"<div class=\"card\"><b>{esc(v)}</b><span>{esc(k)}</span></div>"
                                           for k, v in cards) + "</div>"


def _share(part: int, whole: int) -> str:
    return f"{format_bytes(part)} ({part / whole:.0%})" if whole else format_bytes(part)


def _notes(notes: list) -> str:
    if not notes:
        return ""
    return '<ul class="notes">' + "".join(f"<li>{esc(n)}</li>" for n in notes) + "</ul>"


def _segmap_caption(dev: dict) -> str:
    seg = dev["segmap"]
    text = (f"At the peak ({_time(seg['t'], dev['time_unit'])}): {seg['segments']} segments, "
            f"{format_bytes(seg['reserved'])} reserved, {format_bytes(seg['allocated'])} in active blocks, "
            f"largest free gap {format_bytes(seg['largest_free'])}.")
    agg = seg["aggregated"]
    if agg["count"]:
        text += (f" Every segment is drawn: the {len(seg['rows']) - agg['count']} largest block by block, the other "
                 f"{agg['segments']} ({format_bytes(agg['bytes'])}) in {agg['count']} rows, one per stream and size "
                 "class, filled by the share of their bytes in each state.")
    if seg["unplaced"]["count"]:
        text += (f" {seg['unplaced']['count']} blocks ({format_bytes(seg['unplaced']['bytes'])}) fall in no "
                 "segment the trace knows of and are not drawn.")
    return f"<p>{esc(text)}</p>"


def _stack_cell(frames: list, site: str) -> str:
    """The call site (snapshot/callsite.py: the user's frame or the autograd node), with the whole stack
    (C++ frames too) behind a click."""
    if not frames:
        return f"<td><code>{esc(site)}</code></td>"
    first = f"<code class=\"site\">{esc(site)}</code>"
    if len(frames) == 1:
        return f"<td>{first}</td>"
    rest = "".join(f"<br><code>{esc(f)}</code>" for f in frames)
    return f"<td><details><summary>{first}</summary>{rest}</details></td>"


def _top_table(dev: dict) -> str:
    if not dev["top"]:
        return "<p>No allocations.</p>"
    unit = dev["time_unit"]
    head = ("<tr><th>#</th><th>block</th><th>requested</th><th>stream</th><th>allocated at</th>"
            "<th>freed at</th><th>tag</th><th>call site (click for the stack, innermost first)</th></tr>")
    rows = []
    for i, r in enumerate(dev["top"], 1):
        count = r.get("count", 1)
        start = "before the trace" if r["live_at_start"] else _time(r["start"], unit)
        end = "still live at the dump" if r["live_at_end"] else _time(r["end"], unit)
        if count > 1:   # a folded row: the first one's allocation, the last one's free
            start, end = f"{start} (the first)", f"{end} (the last)"
        times, css = (f' <span class="times">×{count:,}</span>', ' class="folded"') if count > 1 else ("", "")
        rows.append(f"<tr{css}><td class=\"num\">{i}</td>"
                    f"<td class=\"num\">{esc(format_bytes(r['block']))}{times}</td>"
                    f"<td class=\"num\">{esc(format_bytes(r['size']))}</td><td class=\"num\">{esc(r['stream'])}</td>"
                    f"<td>{esc(start)}</td><td>{esc(end)}</td><td>{esc(r['tag'] or '—')}</td>"
                    f"{_stack_cell(r['frames'], r['site'])}</tr>")
    return f'<table class="top-allocations">{head}{"".join(rows)}</table>'


LEGEND_TIMELINE = ('<div class="legend"><i style="background:#2b6cb0"></i>allocated<i style="background:#c05621">'
                   '</i>reserved<i style="background:#2f855a"></i>peak allocated (dashed)'
                   '<i style="background:#e53e3e"></i>out of memory</div>')
LEGEND_SEGMAP = ('<div class="legend"><i style="background:#2b6cb0"></i>active_allocated<i style="background:#dd6b20">'
                 '</i>active_pending_free<i style="background:#e2e8f0"></i>inactive (free)</div>')


REST = ' class="rest"'
GROUPINGS = (("by_site", "call site"), ("by_category", "category"), ("by_module", "module"), ("by_tag", "tag"))


def _group_table(rows: list, what: str, css: str) -> str:
    head = (f"<tr><th>{esc(what)}</th><th>bytes</th><th>share</th><th>blocks</th>"
            "<th>of which live before recording</th></tr>")
    body = "".join(
        f"<tr{REST if r.get('rest') else ''}><td><code>{esc(r['key'])}</code></td>"
        f"<td class=\"num\">{esc(format_bytes(r['bytes']))}</td><td class=\"num\">{r['share']:.1%}</td>"
        f"<td class=\"num\">{r['blocks']:,}</td><td class=\"num\">{esc(format_bytes(r['before']) if r['before'] else '—')}</td></tr>"
        for r in rows)
    return f'<table class="held {css}">{head}{body}</table>'


def held_tables(held: dict) -> str:
    """What held memory at one point: a table per grouping the data carries."""
    parts = []
    for key, what in GROUPINGS:
        if held.get(key):
            parts.append(f"<h4>By {esc(what)}</h4>{_group_table(held[key], what, key.replace('_', '-'))}")
    if held.get("joined"):
        j = held["joined"]
        parts.append(f"<p class=\"muted\">Category and module come from the Tracer's JSON: {j['seq']} blocks joined by "
                     f"amem's allocation number, {j['address']} by address and size (a guess), {j['none']} not traced.</p>")
    return "".join(parts)


def _held_section(dev: dict) -> str:
    held, unit = dev["held"], dev["time_unit"]
    text = (f"At the peak ({_time(held['t'], unit)}), {format_bytes(held['bytes'])} in {held['blocks']:,} blocks. "
            f"Each block is counted at its call site: the first frame of its stack that is the user's, or the "
            f"autograd node for memory made in the backward pass.")
    if held["before"]:
        text += (f" {_share(held['before'], held['bytes'])} of it was live before recording began: the trace "
                 "does not say when it was allocated.")
    return (f'<div class="held-at-peak" id="held-{dev["device"]}"><h3>What holds memory at the peak</h3>'
            f"<p>{esc(text)}</p>{held_tables(held)}</div>")


def _replay_table(replay: dict) -> str:
    rows = replay.get("rows") or []
    if not rows:
        return f"<p>{esc(replay.get('note') or 'Not replayed.')}</p>"
    fits = [r for r in rows if r.get("fits")]
    lead = ("Would another setting have avoided it? Replayed under each policy, on a device of "
            f"{format_bytes(replay['capacity'])} (reserved + free at the error): "
            + ("; ".join(r["text"] for r in fits) + "." if fits else "no policy avoids it: the memory was in use."))
    body = "".join(
        f"<tr class=\"{'fits' if r.get('fits') else 'fails'}\"><td><code>{esc(r['policy'])}</code></td>"
        f"<td>{esc('fits' if r.get('fits') else 'out of memory' if r.get('fits') is False else 'not replayed')}</td>"
        f"<td class=\"num\">{esc(r.get('peak_text') or (format_bytes(r['peak_reserved']) if 'peak_reserved' in r else '—'))}</td>"
        f"<td class=\"num\">{esc(format_bytes(r['spare']) if r.get('fits') else '—')}</td><td>{esc(r['text'])}</td></tr>"
        for r in collapsed(rows))
    note = f"<p class=\"muted\">{esc(replay['note'])}</p>" if replay.get("note") else ""
    return (f"<p>{esc(lead)}</p><table class=\"oom-replay\"><tr><th>policy</th><th>result</th><th>peak reserved</th>"
            f"<th>spare</th><th></th></tr>{body}</table>{note}")


def collapsed(rows: list) -> list:
    """The replay's rows with the policies that fail alike (as many requests refused) in one row,
    its peak reserved as their range, so sixteen "fails too" read as a line or two."""
    out, alike = [], {}
    for r in rows:
        if r.get("fits") is not False:
            out.append(r)
        elif r.get("failed") in alike:
            alike[r.get("failed")].append(r)
        else:
            alike[r.get("failed")] = [r]
            out.append(r)
    return [_one_row(alike[r.get("failed")]) if r.get("fits") is False else r for r in out]


def _one_row(group: list) -> dict:
    if len(group) == 1:
        return group[0]
    n, peaks = group[0].get("failed"), [r["peak_reserved"] for r in group if "peak_reserved" in r]
    row = dict(group[0], policy=", ".join(r["policy"] for r in group),
               text=f"all {len(group)} fail too ({n} request{'s' if n != 1 else ''} refused each)")
    if peaks and min(peaks) != max(peaks):
        row["peak_text"] = f"{format_bytes(min(peaks))} – {format_bytes(max(peaks))}"
    return row


def oom_panel(dev: dict, panel: dict) -> str:
    """The forensics of one out-of-memory error (oom.py)."""
    unit = dev["time_unit"]
    facts = [("requested", format_bytes(panel["size"])), ("free on the device", format_bytes(panel["device_free"])),
             ("reserved", format_bytes(panel["reserved"])), ("allocated", format_bytes(panel["allocated"])),
             ("free in the cache", format_bytes(panel["cache_free"])),
             ("largest free block", format_bytes(panel["largest_free"])), ("stream", str(panel["stream"]))]
    cards = "".join(f"<div class=\"card\"><b>{esc(v)}</b><span>{esc(k)}</span></div>" for k, v in facts)
    verdict_css = "verdict fragmentation" if panel["fragmentation"] else "verdict in-use"
    return (f'<div class="oom-panel" id="oom-{dev["device"]}-{panel["index"]}">'
            f"<h3>Out of memory at {esc(_time(panel['t'], unit))}</h3><div class=\"cards\">{cards}</div>"
            f"<p class=\"{verdict_css}\">{esc(panel['verdict'])}</p>"
            f"{_replay_table(panel.get('replay') or {})}"
            f"<h4>What held memory at that moment ({esc(format_bytes(panel['held']['bytes']))})</h4>"
            f"{held_tables(panel['held'])}</div>")


def _more_ooms(dev: dict) -> str:
    more = len(dev["ooms"]) - len(dev["oom_panels"])
    return f"<p>{more} more out-of-memory errors are marked on the timeline, without a panel.</p>" if more > 0 else ""


def device_section(dev: dict) -> str:
    d = dev["device"]
    return "\n".join([
        f'<section class="device" id="device-{d}"><h2>Device {d}</h2>', _cards(dev), _notes(dev["notes"]),
        *[oom_panel(dev, p) for p in dev["oom_panels"]], _more_ooms(dev),
        "<h3>Allocated vs reserved over time</h3>", LEGEND_TIMELINE,
        f'<div class="plot timeline" id="timeline-{d}"></div>',
        "<h3>Allocated memory by call site over time</h3>",
        '<p class="muted">Stacked: the blocks live since before recording, then the call sites holding the most '
        "at the peak, then everything else; the bands add up to the allocated line above.</p>",
        f'<div class="legend stacked-legend" id="stacked-legend-{d}"></div>',
        f'<div class="plot stacked" id="stacked-{d}"></div>',
        *(["<h3>Allocated memory by category over time</h3>",
            '<p class="muted">The profiler\'s categories, from the Tracer\'s JSON (blocks it did not see: '
            '"(not traced)").</p>', f'<div class="legend stacked-legend" id="stacked-cat-legend-{d}"></div>',
            f'<div class="plot stacked" id="stacked-cat-{d}"></div>'] if dev.get("stacked_categories") else []),
        _held_section(dev),
        "<h3>Fragmentation over time (1 − allocated / reserved)</h3>",
        f'<div class="plot fragmentation" id="fragmentation-{d}"></div>',
        "<h3>Segment map at the peak</h3>", _segmap_caption(dev), LEGEND_SEGMAP,
        f'<div class="plot segmap" id="segmap-{d}"></div>',
        f"<h3>{esc(_top_heading(dev['top']))}</h3>", _top_table(dev), "</section>"])


def _top_heading(top: list) -> str:
    blocks = sum(r.get("count", 1) for r in top)
    if blocks == len(top):
        return f"The {len(top)} largest allocations"
    return (f"The largest allocations: {blocks:,} in {len(top)} rows (repeats folded: one size, stream, tag and "
            "call site a row)")


def summary_section(devices: list) -> str:
    """What the trace page opens with: each out-of-memory error first (linked to its panel), then
    per device its peaks (linked to its section), so the answer is on the first screen."""
    if not devices:
        return ""
    ooms = []
    for dev in devices:
        for k, o in enumerate(dev["ooms"]):
            where = f' <a href="#oom-{dev["device"]}-{k}">the forensics</a>' if k < len(dev["oom_panels"]) else ""
            ooms.append(f'<li>Device {dev["device"]}: out of memory at {esc(_time(o["t"], dev["time_unit"]))}, '
                        f'{esc(format_bytes(o["size"]))} requested with {esc(format_bytes(o["free"]))} free on the '
                        f"device;{where}</li>")
    more = f"<li>{len(ooms) - MAX_SUMMARY_OOMS} more, on the timelines</li>" if len(ooms) > MAX_SUMMARY_OOMS else ""
    lead = f'<ul class="oom-first">{"".join(ooms[:MAX_SUMMARY_OOMS])}{more}</ul>' if ooms else ""
    rows = "".join(
        f'<tr><td><a href="#device-{d["device"]}">device {d["device"]}</a></td>'
        f'<td class="num">{esc(format_bytes(d["peak"]["allocated"]))}</td>'
        f'<td class="num">{esc(format_bytes(d["peak"]["peak_reserved"]))}</td><td class="num">{d["events"]:,}</td>'
        f'<td class="num">{len(d["ooms"])}</td></tr>' for d in devices)
    return (f'<section id="summary"><h2>Summary</h2>{lead}<table class="summary"><tr><th>device</th>'
            f"<th>peak allocated</th><th>peak reserved</th><th>events</th><th>out-of-memory errors</th></tr>"
            f"{rows}</table></section>")


def key_value_section(title: str, css: str, mapping: Any) -> str:
    if not isinstance(mapping, dict):
        mapping = {"value": mapping}
    rows = "".join(f"<tr><th>{esc(short(k))}</th><td><code>{esc(short(v))}</code></td></tr>"
                   for k, v in list(mapping.items())[:200])
    more = f"<p>{len(mapping) - 200} more entries not shown.</p>" if len(mapping) > 200 else ""
    return f'<section class="{css}"><h2>{esc(title)}</h2><table>{rows}</table>{more}</section>'


# ============================================================================ the page
def page(title: str, subtitle: str, body: str, data: Any, version: str) -> str:
    """Fills the template in one pass, so no inserted text is ever read as a placeholder. With
    data=None the page is static: no script at all (report/provenance.py's provenance_html)."""
    scripts = "" if data is None else (f'<script type="application/json" id="amem-data">{_json_for_script(data)}'
                                       f"</script>\n<script>\n{_asset('report.js')}\n</script>")
    parts = {"TITLE": esc(title), "SUBTITLE": esc(subtitle), "BODY": body, "SCRIPTS": scripts,
             "FOOTER": "" if data is None else ": the plots are drawn by the script below",
             "CSS": _asset("report.css"), "VERSION": esc(version)}
    return re.sub(r"@@([A-Z]+)@@", lambda m: parts[m.group(1)], _asset("template.html"))
