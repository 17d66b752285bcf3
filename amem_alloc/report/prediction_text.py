"""`amem predict`'s and `amem fit`'s text, from their JSON: one process, every rank of a job, the
what-ifs, and amem fit's answer. Nothing here reads a prediction object: each function takes the
dict that `.to_dict()` gives (or anything with a `to_dict()`), so the text and the JSON cannot
disagree.

    print(format_prediction(amem_alloc.predict(step)))
"""
from __future__ import annotations

from typing import Any

from ..introspection import format_bytes
from ..replay.evaluation import align, format_table, signed_bytes
from .what_if_cost import cost_text
from .verdict import text_lines as verdict_lines

POLICY_COLUMNS = ("policy", "peak allocated", "peak reserved", "needs", "fits", "spare", "frag. at peak")
FRAGMENTATION_LEGEND = ("frag. at peak: the share of reserved memory not allocated when reserved memory peaked "
                        "(that can be after the allocated peak, when little is allocated)")
NO_ALLOCATION = ("No CUDA allocation was recorded: does the code put its tensors on a CUDA device "
                 "(device=\"cuda\", .cuda(), .to(\"cuda\"))?")


def _data(x: Any) -> dict:
    return x.to_dict() if hasattr(x, "to_dict") else x


def _share(part: int, whole: int) -> str:
    return f"{part / whole:.0%}" if whole else "-"


def note_line(note: dict) -> str:
    """One note (predict/notes.py's Note.as_dict()) in words: what, its bytes, where, how often.
    The page and `amem predict`'s text say it the same way."""
    times = f" x{note['count']}" if note["count"] > 1 else ""
    size = f" ({format_bytes(note['bytes'])})" if note["bytes"] else ""
    return f"{note['kind']}: {note['what']}{size} at {note['where']}{times}"


# ============================================================================ one process
def format_prediction(prediction: Any, top: int = 8, written: list | tuple = ()) -> str:
    """The text of one prediction (a Prediction, or its JSON). It ends with the answer: the verdict
    per policy and, when one does not fit, the next step; `written` (the files the command wrote)
    is named just before it."""
    d = _data(prediction)
    lines = _heading(d)
    lines += _policy_table(d["policies"])
    lines += _at_peak(d, top)
    lines += _markers_text(d.get("at_markers") or [], top)
    lines += ["", "needs: the smallest usable memory the run fits in (torch empties its cache and retries before "
                  "it fails); spare: usable memory (the card's total less what the process holds outside the "
                  f"caching allocator) less that. Card figures: {d['gpu']['memory_source']}."]
    lines += _notes_text(d.get("notes") or [])
    lines += format_what_if(d)
    if written:
        lines += ["", "wrote " + ", ".join(str(p) for p in written)]
    if d["policies"]:
        lines += [""] + verdict_lines(d["verdict"]) + next_step_lines(d)
    return "\n".join(lines)


def _heading(d: dict) -> list[str]:
    g = d["gpu"]
    ctx = f"{format_bytes(g['context_bytes'])} outside the caching allocator" if g["context_bytes"] else \
        "no context taken"
    lines = [f"amem predict: {d['target']} on {g['name']} ({format_bytes(g['capacity_bytes'])}; {ctx}; "
             f"usable {format_bytes(g['usable_bytes'])})", d["note"], ""]
    stopped = d.get("stopped_after")
    if stopped:
        lines[-1:-1] = [stopped[0].upper() + stopped[1:] + "."]
    if not d["program"]["allocations"]:
        lines += [NO_ALLOCATION, ""]
    return lines


def _policy_table(rows: list[dict]) -> list[str]:
    lines = format_table(rows, POLICY_COLUMNS)
    if any(r["fits"] and r["headroom"] < 0 for r in rows):
        lines.append("* fits only by emptying its cache when a cudaMalloc fails (torch retries), which costs time")
    best = min(rows, key=lambda r: (r["min_capacity"], r["peak_reserved"]), default=None)
    if best is not None:
        lines.append(f"least memory needed: {best['policy']} ({format_bytes(best['min_capacity'])})")
    lines.append(FRAGMENTATION_LEGEND)
    return lines


# ============================================================================ the next step
def next_step_lines(d: dict) -> list[str]:
    """What to do when a policy does not fit (the verdict's `next_step`), as the text's last lines."""
    step = d["verdict"].get("next_step")
    if not step:
        return []
    find = _find_out(d, step)
    if step["kind"] == "what_if":
        w = next(x for x in d.get("what_if") or [] if x["change"] == step["change"])
        return [f"Next step: the cheapest change that makes it fit under {step['policy']} is {step['change']} "
                f"({cost_text(w)}); {find}"]
    if step["kind"] == "policy":
        return [f"Next step: {step['policy']} fits ({_how_to_use(step)}); to make {step['failing'][0]} fit, {find}"]
    return [f"Next step: {find}"]


def _find_out(d: dict, step: dict) -> str:
    """The commands that say which change, or which batch, fits (on the same card and script)."""
    script = step.get("script")
    g = d["gpu"]
    card = f"--capacity-gb {g['usable_bytes'] / 2**30:g}" if g["memory_source"].startswith("given") else f"--gpu {g['key']}"
    fit = (f"the largest batch that fits: amem fit {card} --arg {step.get('batch_arg') or 'batch_size'} -- python "
           f"{' '.join(script)}" + ("" if step.get("batch_arg") else " (--arg: your script's batch-size argument)")
           if script else "a smaller batch (amem fit --arg NAME -- python SCRIPT ...)")
    if step.get("tried"):
        return f"{fit}"
    what = f"amem predict {card} --what-if all -- python {' '.join(script)}" if script else \
        "amem predict --what-if all ..."
    return f"see which change makes it fit: {what}; or {fit}"


def _how_to_use(step: dict) -> str:
    if step["native"]:
        return f"PYTORCH_CUDA_ALLOC_CONF={step['conf']}" if step["conf"] else "torch's allocator as it is"
    if step["policy"].startswith("conf:"):
        return f"AMEM_ENABLE=1 AMEM_CONF={step['conf']}"
    script = " ".join(step["script"]) if step.get("script") else "SCRIPT"
    return f"amem run --policy {step['policy']} {script}, or AMEM_ENABLE=1 AMEM_POLICY={step['policy']}"


def _at_peak(d: dict, top: int) -> list[str]:
    allocated, cats = d["at_peak_allocated"], d["at_peak"]
    during = f", in {d['at_peak_phase']}" if d.get("at_peak_phase") else ""
    lines = ["", f"At the peak ({format_bytes(allocated)} requested, each request rounded to 512 B: a policy's "
                 f"allocated adds its own rounding{during}, after allocator call {d['at_peak_op'] + 1} of "
                 f"{d['program']['ops']}):"]
    most = d.get("category_peaks") or {}
    order = list(cats) + [k for k in most if k not in cats]
    body = [[k, format_bytes(cats.get(k, 0)), _share(cats.get(k, 0), allocated),
             format_bytes(most[k]) if k in most else "-"] for k in order]
    lines += ["  " + ln for ln in align([["category", "bytes", "share", "largest in the run"]] + body)]
    lines += ["", "  by module:"] + [f"    {format_bytes(v):>10}  {k}" for k, v in list(d["at_peak_modules"].items())[:top]]
    lines += ["", "  by op / autograd node:"] + [f"    {format_bytes(v):>10}  {k}" for k, v in list(d["at_peak_ops"].items())[:top]]
    return lines


def _markers_text(marks: list[dict], top: int) -> list[str]:
    if not marks:
        return []
    shown = marks if len(marks) <= top else marks[: top - 1] + marks[-1:]
    out = ["", "  live at each marker (allocated; largest categories):"]
    for mk in shown:
        cats = ", ".join(f"{k} {format_bytes(v)}" for k, v in list(mk["categories"].items())[:3])
        out.append(f"    {mk['marker']} after call {mk['op']}: {format_bytes(mk['allocated'])}" + (f" ({cats})" if cats else ""))
    if len(shown) < len(marks):
        out.insert(-1, f"    ... {len(marks) - len(shown)} more")
    return out


def _notes_text(notes: list[dict]) -> list[str]:
    """What the prediction stood in for, estimated or did not model, one line each."""
    if not notes:
        return []
    out = ["", f"What this prediction stood in for, estimated or did not model ({len(notes)}):"]
    return out + ["  " + note_line(n) for n in notes]


# ============================================================================ what-ifs
def format_what_if(prediction: Any) -> list[str]:
    """The what-if lines of `amem predict`'s text (none when no what-if was asked)."""
    d = _data(prediction)
    results = d.get("what_if") or []
    if not results:
        return []
    lines = ["", "What if (each change applied by amem and the code predicted again; saving against the "
                 "unchanged run):"]
    body = []
    for w in results:
        if w["failed"]:
            body.append([w["change"], "-", "-", "-", "-", "could not be predicted"])
            continue
        for r in w["policies"]:
            body.append([w["change"], r["policy"], format_bytes(r["peak_allocated"]), format_bytes(r["peak_reserved"]),
                         "yes" if r["fits"] else "NO", signed_bytes(r["saving_reserved"])])
    headers = ["change", "policy", "peak allocated", "peak reserved", "fits", "saving (reserved)"]
    lines += ["  " + ln for ln in align([headers] + body)]
    for w in results:
        costly = "recompute" in w and w["applied"]
        extra = ([w["failed"]] if w["failed"] else []) + w["notes"] + ([cost_text(w)] if costly else [])
        lines += [f"  {w['change']}: {e}" for e in extra]
    return lines + _cheapest_lines(results, d.get("cheapest_change") or {})


def _cheapest_lines(results: list[dict], picks: dict) -> list[str]:
    lines = []
    for policy, change in picks.items():
        if change is None:
            lines.append(f"  {policy}: none of these changes makes it fit")
        else:
            w = next(x for x in results if x["change"] == change)
            lines.append(f"  cheapest change that makes it fit under {policy}: {change} ({cost_text(w)})")
    if not picks:
        lines.append("  the unchanged run fits under every policy")
    return lines


# ============================================================================ every rank of a job
def format_ranks(ranks: Any, written: list | tuple = ()) -> str:
    """The text of a distributed prediction (a RankPrediction, or its JSON): the ranks side by side,
    then the worst rank's prediction, which ends with its verdict."""
    d = _data(ranks)
    entries = d["ranks"]
    distinct = sum(1 for e in entries if e["same_as"] is None)
    recorded = sum(1 for e in entries if e.get("recorded", True))
    nodes = d["nnodes"]
    per_node = d["nproc_per_node"]
    lines = [f"amem predict: {d['world_size']} rank{'s' if d['world_size'] > 1 else ''} ({nodes} "
             f"node{'s' if nodes > 1 else ''} x {per_node} process{'es' if per_node > 1 else ''}), "
             f"{len(entries)} predicted ({recorded} recorded), "
             f"{distinct} distinct program{'s' if distinct > 1 else ''}"]
    if d.get("not_recorded_because"):
        lines.append(d["not_recorded_because"])
    lines.append("")
    lines += _rank_table(entries)
    worst = next(e for e in entries if e["rank"] == d["worst_rank"])
    lines += _other_ranks_notes(entries, worst)
    lines += ["", f"worst rank: {worst['rank']} (the one that needs the most memory under "
                  f"{worst['policies'][0]['policy']}); its prediction:", ""]
    lines.append(format_prediction({**worst, "gpu": d["gpu"], "note": d["note"], "predicted": True}, written=written))
    return "\n".join(lines)


OTHER_NOTES_SHOWN = 8   # notes of ranks other than the worst listed in the text (all are in the JSON)


def _other_ranks_notes(entries: list[dict], worst: dict) -> list[str]:
    """The notes other ranks have and the worst rank, whose prediction follows, has not (a rank
    that shares its GPU, files only rank 0 writes), each with the ranks it came from."""
    shown = {(n["kind"], n["what"]) for n in worst.get("notes") or ()}
    ranks_of: dict = {}
    for e in entries:
        for n in e.get("notes") or ():
            if (n["kind"], n["what"]) not in shown:
                ranks_of.setdefault((n["kind"], n["what"], n["where"]), []).append(e["rank"])
    if not ranks_of:
        return []
    lines = ["", f"notes of other ranks (not in rank {worst['rank']}'s below):"]
    for (kind, what, where), ranks in list(ranks_of.items())[:OTHER_NOTES_SHOWN]:
        lines.append(f"  {kind}: {what} at {where} (rank{'s' if len(ranks) > 1 else ''} "
                     f"{', '.join(map(str, ranks))})")
    if len(ranks_of) > OTHER_NOTES_SHOWN:
        lines.append(f"  and {len(ranks_of) - OTHER_NOTES_SHOWN} more (the JSON's ranks[].notes)")
    return lines


def _rank_table(entries: list[dict]) -> list[str]:
    policies = [r["policy"] for r in entries[0]["policies"]]
    headers = ["rank", "same as", "peak allocated"] + [f"reserved {p}" for p in policies] + ["fits"]
    body = []
    for first, last, e in _rank_runs(entries):
        rows = e["policies"]
        fitting = [r["policy"] for r in rows if r["fits"]]
        fits = "all" if len(fitting) == len(rows) else ", ".join(fitting) or "none"
        ranks = str(first) if first == last else f"{first}-{last}"
        same = "-" if e["same_as"] is None else str(e["same_as"])
        if not e.get("recorded", True):
            same += " (not recorded)"
        body.append([ranks, same, format_bytes(rows[0]["peak_allocated"])]
                    + [format_bytes(r["peak_reserved"]) for r in rows] + [fits])
    return align([headers] + body, text_columns=2)


def _rank_runs(entries: list[dict]) -> list[tuple[int, int, dict]]:
    """(first rank, last rank, entry): consecutive ranks taken as the same recorded rank are one row."""
    runs: list[tuple[int, int, dict]] = []
    for e in entries:
        prev = runs[-1] if runs else None
        if (prev and not e.get("recorded", True) and not prev[2].get("recorded", True)
                and prev[2]["same_as"] == e["same_as"] and prev[1] + 1 == e["rank"]):
            runs[-1] = (prev[0], e["rank"], prev[2])
        else:
            runs.append((e["rank"], e["rank"], e))
    return runs


# ============================================================================ amem fit
def format_fit(fit: Any, written: list | tuple = ()) -> str:
    """amem fit's answer (a FitResult, or its JSON): it ends with one line per policy."""
    d = _data(fit)
    g = d["gpu"]
    held, margin = g.get("context_bytes") or 0, d.get("margin_bytes") or 0
    outside = f": its {format_bytes(g['capacity_bytes'])} less {format_bytes(held)} outside the allocator" if held else ""
    lines = ([f"wrote {', '.join(str(p) for p in written)}", ""] if written else [])
    lines += [f"amem fit: the largest --{d['arg']} that fits {g['name']} (usable {format_bytes(g['usable_bytes'])}"
              + outside
              + (f", keeping a margin of {d['margin']} free (--margin)" if margin else ", with no margin (--margin 0)")
              + f"), {len(d['trials'])} predictions in {d['seconds']:.1f} s:"]
    lines += ["  " + _fit_line(d["arg"], p, margin) for p in d["policies"]]
    return "\n".join(lines)


def _fit_line(arg: str, p: dict, margin: int = 0) -> str:
    if p["largest"] is None:
        return f"{p['policy']}: does not fit at any value tried"
    spare = p.get("spare")
    spare_text = f", {format_bytes(spare)} to spare" if spare is not None else ""
    line = (f"{p['policy']}: --{arg} {p['largest']} (needs {format_bytes(p['needed'])}{spare_text}; peak reserved "
            f"{format_bytes(p['peak_reserved'])}"
            + (": fits only by emptying its cache when a cudaMalloc fails" if p["headroom"] < 0 else "") + ")")
    if p["first_failing"] is None:
        return line + f"; fits at every value tried, up to {p['largest']}"
    if p["needed_at_first_failing"] is not None:
        kept = " with the margin" if margin else ""
        return line + f"; {p['first_failing']} does not fit{kept}: it needs {format_bytes(p['needed_at_first_failing'])}"
    return line + f"; {p['first_failing']} could not be predicted: {p['why_first_failing']}"


def format_frontier(frontier: Any) -> str:
    """amem fit --across's answer (a Frontier, or its JSON): a table, one row per value of the second
    argument, the largest first argument that fits per policy ('-': not even the smallest)."""
    d = _data(frontier)
    rows = d["frontier"]
    first = next((r["fit"] for r in rows if r["fit"]), None)
    policies = [p["policy"] for p in first["policies"]] if first else []
    card = f" {first['gpu']['name']} (usable {format_bytes(first['gpu']['usable_bytes'])})" if first else ""
    lines = [f"amem fit: the largest --{d['arg']} that fits{card} at each --{d['across']}, per policy "
             f"({sum(len(r['fit']['trials']) for r in rows if r['fit'])} predictions in {d['seconds']:.1f} s):"]
    width = max([len(d["across"]) + 2, *(len(p) for p in policies)])
    lines.append(f"  {'--' + d['across']:>{width}}  " + "  ".join(f"{p:>{width}}" for p in policies))
    for r in rows:
        cells = [next((str(p["largest"]) if p["largest"] is not None else "-" for p in r["fit"]["policies"]
                       if p["policy"] == name), "-") if r["fit"] else "-" for name in policies]
        line = f"  {r['value']:>{width}}  " + "  ".join(f"{c:>{width}}" for c in cells)
        lines.append(line + (f"   ({r['why']})" if r["why"] else ""))
    return "\n".join(lines)
