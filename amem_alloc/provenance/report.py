"""Readable text: the tracer's summary, one step's activation memory, two steps side by side.

Everything here formats the JSON-ready dicts (ActivationReport.to_dict(), Tracer.summary()), so
the text, the JSON and the HTML report always show the same figures.
"""
from __future__ import annotations

from ..introspection import format_bytes
from .classify import module_label
from .module_paths import module_order
from .records import CATEGORIES, PHASES


# ---------------------------------------------------------------- allocations -------------------

def alloc_row(rec, cat) -> dict:
    """One AllocRecord as JSON."""
    return {
        "seq": rec.seq, "op": rec.op, "module": rec.module, "phase": rec.phase, "category": cat,
        "device": rec.device, "address": rec.ptr, "dtype": rec.dtype, "shape": list(rec.shape),
        "nominal_bytes": rec.nbytes, "allocator_bytes": rec.block.size, "exact": rec.block.exact,
        "allocator": rec.block.allocator, "stream": rec.block.stream, "alloc_seq": rec.block.alloc_seq,
        "freed_seq": rec.freed_seq, "saved_by": [s.label for s in rec.saved_by],
        "grad_node": rec.grad_node, "recompute": rec.recompute, "stack": rec.stack,
    }


def _tally(rows, field: str, names) -> dict:
    """{value of field: storages, nominal and allocator bytes}, in the order of names."""
    out: dict = {}
    for r in rows:
        acc = out.setdefault(r[field] if r[field] is not None else "none",
                             {"storages": 0, "nominal_bytes": 0, "allocator_bytes": 0})
        acc["storages"] += 1
        acc["nominal_bytes"] += r["nominal_bytes"]
        acc["allocator_bytes"] += r["allocator_bytes"]
    return dict(sorted(out.items(), key=lambda kv: names.index(kv[0]) if kv[0] in names else len(names)))


def summary(rows: list[dict], table) -> dict:
    """Allocations made inside the tracer, by phase; the live ones by category."""
    live = [r for r in rows if r["freed_seq"] is None]
    return {"allocations": table.count, "kept": len(rows), "live": len(live),
            "by_phase": _tally(rows, "phase", PHASES), "live_by_category": _tally(live, "category", CATEGORIES)}


def headline(acts: list[dict]) -> dict:
    """The figures a reader wants first: activation bytes per step, in words and in bytes."""
    words = [f"step {a['step']}: {format_bytes(a['total']['allocator_bytes'])} allocator, "
             f"{format_bytes(a['total']['nominal_bytes'])} nominal, {a['total']['storages']} storages ({a['status']})"
             for a in acts]
    return {"activation_memory": words or ["no autograd graph was recorded"],
            "activation_allocator_bytes": [a["total"]["allocator_bytes"] for a in acts],
            "activation_nominal_bytes": [a["total"]["nominal_bytes"] for a in acts],
            "status": acts[-1]["status"] if acts else "empty"}


def largest_saved(act: dict | None, n: int = 8) -> list[str]:
    """The n largest counted saved tensors of a step, one line each."""
    rows = sorted((r for r in (act or {}).get("saved", []) if r["counted"]), key=lambda r: -r["allocator_bytes"])
    return [f"{r['label']} in {module_label(r['module'])}: {format_bytes(r['allocator_bytes'])} "
            f"{r['dtype']} {_shape(r['shape'])}, {r['what']}" for r in rows[:n]]


def duration_ms(start, stop):
    return None if start is None or stop is None else round((stop - start) / 1e6, 3)


def _tally_line(tally: dict) -> str:
    return ", ".join(f"{k} {format_bytes(v['allocator_bytes'])} in {v['storages']}" for k, v in tally.items()) or "none"


def summary_text(s: dict) -> str:
    return "\n".join([
        f"allocations inside the tracer: {s['allocations']} storages ({s['live']} alive now)",
        f"  made in each phase (allocator bytes): {_tally_line(s['by_phase'])}",
        f"  alive now, by category:               {_tally_line(s['live_by_category'])}",
    ])


# ---------------------------------------------------------------- activations -------------------

def _fig(acc: dict) -> str:
    return f"{format_bytes(acc['nominal_bytes']):>12} {format_bytes(acc['allocator_bytes']):>12} {acc['storages']:>8}"


def _shape(shape) -> str:
    return "x".join(str(d) for d in shape) if shape else ("scalar" if shape == [] else "-")


def _depth(path) -> int:
    return 0 if path in ("", None) else path.count(".") + 1


def _module_rows(d: dict, limit: int = 40) -> list[str]:
    """Modules in natural order, indented by depth; as deep as fits in `limit` rows."""
    mods = d["modules"]
    depth = max((_depth(m["module"]) for m in mods), default=0)
    while depth > 1 and sum(_depth(m["module"]) <= depth for m in mods) > limit:
        depth -= 1
    lines = [f"  {'module (self+children)':<36} {'nominal':>12} {'allocator':>12} {'storages':>8}"]
    for m in mods:
        if _depth(m["module"]) <= depth:
            lines.append(f"  {'  ' * _depth(m['module']) + m['label']:<36} {_fig(m['total'])}")
    hidden = sum(_depth(m["module"]) > depth for m in mods)
    if hidden:
        lines.append(f"  ... {hidden} deeper modules (all of them in to_json())")
    return lines


def _saved_rows(d: dict, top: int) -> list[str]:
    """The saved tensors that were read, largest first; those held by other hooks, summarised."""
    read = [r for r in d["saved"] if r["dtype"] is not None]
    rows = sorted(read, key=lambda r: (not r["counted"], -r["allocator_bytes"]))
    w = max([len(r["label"]) for r in rows[:top]] + [9])
    m = min(32, max([len(module_label(r["module"])) for r in rows[:top]] + [6]))
    lines = [f"  {'node.slot':<{w}} {'module':<{m}} {'dtype':<9} {'shape':<14} {'nominal':>11} {'allocator':>11}  what"]
    for r in rows[:top]:
        note = r["note"] if not r["counted"] and r["note"] != r["what"] else ""
        what = r["what"] + (f"  [{note}]" if note else "")
        lines.append(f"  {r['label']:<{w}} {module_label(r['module'])[:m]:<{m}} {r['dtype']:<9} "
                     f"{_shape(r['shape'])[:14]:<14} {format_bytes(r['nominal_bytes']):>11} "
                     f"{format_bytes(r['allocator_bytes']):>11}  {what}")
    if len(rows) > top:
        lines.append(f"  ... {len(rows) - top} more saved tensors (all of them in to_json())")
    unread: dict = {}
    for r in d["saved"]:
        if r["dtype"] is None:
            unread.setdefault(r["note"] or r["what"], set()).add((r["node_seq"], r["label"]))
    for why, slots in unread.items():
        nodes = len({seq for seq, _ in slots})
        lines.append(f"  {len(slots)} slots of {nodes} nodes not counted: {why}")
    return lines


def activations_text(d: dict, top: int = 25) -> str:
    t = d["total"]
    lines = [f"Activation memory, step {d['step']} of {d['steps']} [{d['status']}]: {d['message']}"]
    lines += [f"  ({a})" for a in d["accounting"]]
    lines.append(f"  total: {format_bytes(t['nominal_bytes'])} nominal, {format_bytes(t['allocator_bytes'])} "
                 f"allocator, in {t['storages']} storages")
    if d["by_kind"]:
        lines.append("  by kind: " + ", ".join(f"{k} {format_bytes(v['allocator_bytes'])}" for k, v in d["by_kind"].items()))
    ms = d["model_state_saved"]
    if ms["storages"]:
        lines.append(f"  parameters/buffers saved by nodes (not counted): {ms['storages']} tensors, "
                     f"{format_bytes(ms['nominal_bytes'])}")
    if d["saved"]:
        lines += _module_rows(d) + _saved_rows(d, top)
    return "\n".join(lines)


# ---------------------------------------------------------------- side by side ------------------

def _as_dict(x) -> dict:
    if hasattr(x, "activations"):
        x = x.activations()
    return x.to_dict() if hasattr(x, "to_dict") else x


def compare_text(a, b, labels=None) -> str:
    """Two steps' activation memory per module, side by side (e.g. without and with checkpointing)."""
    a, b = _as_dict(a), _as_dict(b)
    la, lb = labels or ("A", "B")
    ma = {m["module"]: m["total"] for m in a["modules"]}
    mb = {m["module"]: m["total"] for m in b["modules"]}
    order = sorted(set(ma) | set(mb), key=module_order)
    zero = {"nominal_bytes": 0, "allocator_bytes": 0, "storages": 0}
    lines = [f"  {'module':<30} {la[:24]:>24} {lb[:24]:>24}", f"  {'':<30} {'(allocator bytes)':>24} {'(allocator bytes)':>24}"]
    for p in order:
        x, y = ma.get(p, zero), mb.get(p, zero)
        lines.append(f"  {module_label(p)[:30]:<30} {format_bytes(x['allocator_bytes']):>24} {format_bytes(y['allocator_bytes']):>24}")
    ta, tb = a["total"], b["total"]
    lines.append(f"  {'total allocator bytes':<30} {format_bytes(ta['allocator_bytes']):>24} {format_bytes(tb['allocator_bytes']):>24}")
    lines.append(f"  {'total nominal bytes':<30} {format_bytes(ta['nominal_bytes']):>24} {format_bytes(tb['nominal_bytes']):>24}")
    lines.append(f"  {'storages':<30} {ta['storages']:>24} {tb['storages']:>24}")
    return "Activation memory side by side\n" + "\n".join(lines)


class ReportText(str):
    """The readable report: a str that an interactive prompt (the REPL, IPython, Jupyter) shows as
    the text itself, once, rather than as a quoted string with escaped newlines."""

    def __repr__(self) -> str:
        return str(self)

    def _repr_pretty_(self, printer, cycle) -> None:  # IPython and Jupyter
        printer.text(str(self))


def tracer_text(tracer, compare=None, top: int = 25, labels=None) -> str:
    parts = [f"amem provenance: {type(tracer.model).__name__ if tracer.model is not None else 'no model'}",
             summary_text(tracer.summary()), activations_text(tracer.activations().to_dict(), top)]
    if compare is not None:
        parts.append(compare_text(tracer, compare, labels))
    return "\n\n".join(parts)


# ---------------------------------------------------------------- one tensor --------------------

def provenance_text(p: dict) -> str:
    node = f", in {p['grad_node']}" if p.get("grad_node") else ""
    where = f"{p['op']} in {module_label(p['module'])} ({p['phase']}{node})" if p["traced"] else "not traced"
    lines = [f"{p['dtype']} {_shape(p['shape'])} on {p['device']}: {p['category'] or 'uncategorized'} - {where}"]
    if p.get("block_size") is not None:
        lines.append(f"  block {p['address']:#x}: {format_bytes(p['block_size'])} ({p['allocator']}), "
                     f"requested {format_bytes(p['requested_bytes'])}, stream {p['stream']}, segment {p['segment']}")
    if p["traced"]:
        lines.append(f"  allocated: seq {p['seq']}, {p['time_ns'] / 1e6:.3f} ms after the tracer started"
                     + (f", amem alloc_seq {p['alloc_seq']}" if p["alloc_seq"] is not None else ""))
    if p["what"]:
        lines.append(f"  what: {p['what']}")
    if p["saved_by"]:
        lines.append("  saved for backward by: " + ", ".join(f"{s['label']} ({s['state']})" for s in p["saved_by"]))
    lines += [f"  stack: {frame}" for frame in (p["stack"] or [])[-4:]]
    lines += [f"  note: {n}" for n in p["notes"]]
    return "\n".join(lines)
