"""`amem predict --report`'s page, built from the prediction's data.

Design note
-----------
The data is JSON-able: the prediction's `to_dict()` (what `amem predict --json` writes: the card,
the policies' rows, what is live at the peak, the markers, the notes, the verdict and the what-ifs)
and its snapshot (torch's format, the prediction's `snapshot()`). The page opens with
the verdict panel (report/verdict.py), then the prediction's figures as key/value rows, then the
snapshot report's device sections. The replay's clock is not the run's, so the snapshot's
timestamps are dropped and the time axis is labelled replay order; its frames' files come as the
prediction shows them (code_files.display_path: the script's own relative to its folder,
libraries by package).
"""
from __future__ import annotations

from ..introspection import format_bytes
from ..version import __version__
from . import html as report_html
from .data import report_data
from .prediction_text import next_step_lines, note_line
from .verdict import html_panel

REPLAY_ORDER = ("Predicted run: the x axis counts the predicted program's allocator calls (each malloc and free, "
                "numbered as amem predict's text numbers them: after allocator call N), not time.")
PHASE_COLOURS = {"setup": "#a0aec0", "train": "#38a169", "eval": "#d69e2e", "optimizer": "#805ad5"}


def write(path, prediction: dict, snapshot: dict, ranks: list[tuple[int, dict]] | None = None):
    """Writes the page (render's) to `path`, whole or not at all; returns the path."""
    from ..atomic_write import write_text

    return write_text(path, render(prediction, snapshot, ranks))


def render(prediction: dict, snapshot: dict, ranks: list[tuple[int, dict]] | None = None) -> str:
    """The page for a prediction's to_dict() and its snapshot; with `ranks` ((rank, snapshot) of
    every rank of a distributed job, this prediction being one of them) the ranks side by side
    first (report/ranks.py)."""
    from ..snapshot import parse_snapshot

    snap = parse_snapshot(readable_snapshot(snapshot), "<prediction>")
    data = label_calls(report_data(snap, peak_time=prediction["at_peak_op"] + 1), prediction["program"])
    what_if = {k: prediction[k] for k in ("what_if", "cheapest_change") if k in prediction}
    body = [html_panel(prediction["verdict"], what_if, _next_step(prediction))]
    if ranks:
        body.append(_ranks_section(ranks))
    body.append(report_html.key_value_section("Prediction (no GPU)", "provenance", summary(prediction)))
    body.append(phases_legend(prediction["program"]))
    body += [report_html.device_section(dev) for dev in data["devices"]]
    g = prediction["gpu"]
    title = f"Predicted memory: {prediction['target']}"
    return report_html.page(title, f"predicted without a GPU for {g['name']}", "\n".join(body), data, __version__)


def _next_step(prediction: dict) -> list[str]:
    return next_step_lines(prediction)


def phases_legend(program: dict) -> str:
    """What the time axis marks: each phase's colour, and the optimizer steps."""
    seen = {p for _, _, p in program.get("phases") or []}
    keys = "".join(f'<i style="background:{c}"></i>{name}' for name, c in PHASE_COLOURS.items() if name in seen)
    steps = len(program.get("steps") or [])
    if not keys and not steps:
        return ""
    said = f"; dashed grey lines: the end of each of the {steps} optimizer steps" if steps else ""
    return (f'<div class="legend phases-legend">Phases on the time axis (the strip under each plot){":" if keys else ""}'
            f"{keys}{report_html.esc(said)}</div>{phase_list(program)}")


def phase_list(program: dict) -> str:
    """The run's phases in order, one item each, the optimizer steps among them; an eval loop whose
    batches allocate alike is one item, "×N" (predict/analysis/phases.py's repeats). The plots keep
    every call on their axis: the loop's strip is one bar labelled ×N."""
    spans, marks = program.get("phases") or [], list(program.get("steps") or [])
    if len(spans) < 2 and not marks:
        return ""
    reps = {(r[0], r[1]): r[2:] for r in program.get("repeats") or []}
    items = []
    for a, b, p in spans:
        rep = reps.get((a, b))
        times = (f' <span class="times">×{rep[0]:,}</span> <span class="muted">({rep[1]:,} calls each, '
                 "allocating alike: shown once)</span>") if rep else ""
        items.append(f'<li class="phase-item{" folded" if rep else ""}" data-phase="{report_html.esc(p)}">'
                     f"<i style=\"background:{PHASE_COLOURS.get(p, '#a0aec0')}\"></i>{report_html.esc(p)}{times} "
                     f'<span class="muted">calls {a:,}–{b:,}</span>'
                     f"{_steps_in(marks, a, b)}</li>")
    return f'<details class="phase-list"><summary>The run, phase by phase ({len(items)})</summary><ol>{"".join(items)}</ol></details>'


def _steps_in(marks: list, a: int, b: int) -> str:
    ended = [m for m in marks if a <= m <= b]
    return "".join(f' <span class="step-end">(optimizer step ends after call {m:,})</span>' for m in ended)


def _ranks_section(ranks: list[tuple[int, dict]]) -> str:
    from ..snapshot import parse_snapshot
    from .ranks import load_ranks, rank_data, ranks_section

    snapshots = [(f"rank{rank}", parse_snapshot(readable_snapshot(snap), f"<rank {rank}>")) for rank, snap in ranks]
    return ranks_section(rank_data(load_ranks(snapshots)))


def summary(p: dict) -> dict[str, str]:
    """The prediction's figures as the page's key/value rows."""
    g = p["gpu"]
    out = {"note": p["note"], "gpu": f"{g['name']} ({format_bytes(g['capacity_bytes'])}, usable "
                                     f"{format_bytes(g['usable_bytes'])})"}
    for r in p["policies"]:
        total = f", device total {format_bytes(r['device_total'])}" if "device_total" in r else ""
        out[f"policy {r['policy']}"] = (f"peak allocated {format_bytes(r['peak_allocated'])}, peak reserved "
                                        f"{format_bytes(r['peak_reserved'])}{total}, min capacity "
                                        f"{format_bytes(r['min_capacity'])}, fits: {'yes' if r['fits'] else 'no'}")
    if p["at_peak_phase"]:
        out["at peak: phase"] = p["at_peak_phase"]
    for k, v in p["at_peak"].items():
        out[f"at peak: {k}"] = format_bytes(v)
    for k, v in p["category_peaks"].items():
        out[f"largest in the run: {k}"] = format_bytes(v)
    for mk in p["at_markers"]:
        out[f"at marker {mk['marker']} (call {mk['op']})"] = format_bytes(mk["allocated"])
    for k, v in list(p["at_peak_modules"].items())[:10]:
        out[f"at peak, module {k}"] = format_bytes(v)
    if p["stopped_after"]:
        out["stopped"] = p["stopped_after"]
    for i, n in enumerate(p["notes"], 1):
        out[f"note {i}: {n['kind']}"] = note_line(n)
    return out


# ============================================================================ the predicted run's trace, for reading
def readable_snapshot(snap: dict) -> dict:
    """The predicted snapshot for the page: each event's time is the allocator call that made it
    (the trace's "op" column, predict/analysis/prediction.py's OP_COLUMN, plus one; the replay's
    clock is not the run's), or no time at all (the x axis counts events) without that column."""
    extras = (snap.get("amem") or {}).get("devices") or []
    for device, trace in enumerate(snap.get("device_traces") or []):
        ops = ((extras[device] or {}).get("columns") or {}).get("op") if device < len(extras) else None
        for i, ev in enumerate(trace):
            ev.pop("time_us", None)
            if ops is not None and len(ops) == len(trace):
                ev["time_us"] = ops[i] + 1
    return snap


def label_calls(data: dict, program: dict) -> dict:
    """Times as allocator calls (the page's x axis: absolute call numbers, not since the first event),
    with the program's phases and optimizer steps for the script to draw."""
    for dev in data.get("devices") or []:
        notes = [n for n in dev.get("notes") or [] if "no timestamps" not in n]
        dev["notes"] = [REPLAY_ORDER] + notes
        if dev["time_unit"] != "us":
            continue
        _shift(dev, dev["start_time_us"])
        dev["time_unit"] = "call"
        reps = {(r[0], r[1]): r[2:] for r in program.get("repeats") or []}
        dev["phases"] = [[a, b, p, PHASE_COLOURS.get(p, "#a0aec0"), *reps.get((a, b), [])]
                         for a, b, p in program.get("phases") or []]
        dev["steps"] = list(program.get("steps") or [])
    return data


def _shift(dev: dict, t0: float) -> None:
    dev["series"]["t"] = [t + t0 for t in dev["series"]["t"]]
    for part in (dev["peak"], dev["segmap"], dev["held"]):
        part["t"] = part["t"] + t0
    for o in dev["ooms"] + dev["oom_panels"]:
        o["t"] = o["t"] + t0
    for row in dev["top"]:
        row["start"] = None if row["start"] is None else row["start"] + t0
        row["end"] = None if row["end"] is None else row["end"] + t0
