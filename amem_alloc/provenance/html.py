"""Offline HTML for the activation report: a fragment another report can embed, and a page.

No JavaScript and nothing loaded from the network: tables and inline CSS only, so the file opens
anywhere. `section(data)` takes Tracer.to_dict() (or one ActivationReport.to_dict()) and is what
the offline HTML report of allocator traces embeds when a tracer's data is given to it.
"""
from __future__ import annotations

import html

from ..introspection import format_bytes
from .classify import module_label

_CSS = """
.amem-prov table{border-collapse:collapse;font:12px/1.4 monospace;margin:6px 0 14px}
.amem-prov td,.amem-prov th{border:1px solid #ccc;padding:2px 6px;text-align:left}
.amem-prov td.n{text-align:right}.amem-prov tr.off{color:#888}
"""


def _e(x) -> str:
    return html.escape(str(x))


def _table(head: list[str], rows: list[list[str]], classes: list[str] | None = None) -> str:
    th = "".join(f"<th>{_e(h)}</th>" for h in head)
    body = []
    for i, row in enumerate(rows):
        cls = f' class="{classes[i]}"' if classes and classes[i] else ""
        body.append(f"<tr{cls}>" + "".join(row) + "</tr>")
    return f"<table><tr>{th}</tr>{''.join(body)}</table>"


def _num(n: int) -> str:
    return f'<td class="n" title="{n} bytes">{_e(format_bytes(n))}</td>'


def _step(d: dict) -> str:
    t = d["total"]
    head = (f"<h3>Activation memory, step {d['step']} of {d['steps']} ({_e(d['status'])})</h3>"
            f"<p>{_e(d['message'])}<br>{'<br>'.join(_e(a) for a in d['accounting'])}</p>"
            f"<p>total {_e(format_bytes(t['nominal_bytes']))} nominal, {_e(format_bytes(t['allocator_bytes']))} "
            f"allocator, {t['storages']} storages</p>")
    modules = _table(["module", "self allocator", "total nominal", "total allocator", "storages"],
                     [[f"<td>{_e(m['label'])}</td>", _num(m["self"]["allocator_bytes"]),
                       _num(m["total"]["nominal_bytes"]), _num(m["total"]["allocator_bytes"]),
                       f'<td class="n">{m["total"]["storages"]}</td>'] for m in d["modules"]])
    rows = sorted(d["saved"], key=lambda r: (not r["counted"], -r["allocator_bytes"]))
    saved = _table(["node.slot", "module", "dtype", "shape", "what", "nominal", "allocator", "note"],
                   [[f"<td>{_e(r['label'])}</td>", f"<td>{_e(module_label(r['module']))}</td>",
                     f"<td>{_e(r['dtype'])}</td>", f"<td>{_e(r['shape'])}</td>", f"<td>{_e(r['what'])}</td>",
                     _num(r["nominal_bytes"]), _num(r["allocator_bytes"]), f"<td>{_e(r['note'])}</td>"]
                    for r in rows], ["" if r["counted"] else "off" for r in rows])
    return head + modules + saved


def _headline(data: dict) -> str:
    """Tracer.to_dict()'s first figures: activation memory per step and the largest saved tensors."""
    lines = list(data.get("headline", {}).get("activation_memory", [])) + list(data.get("largest_saved", []))
    return f"<p>{'<br>'.join(_e(line) for line in lines)}</p>" if lines else ""


def section(data: dict) -> str:
    """An HTML fragment (a <section>) for Tracer.to_dict() or one ActivationReport.to_dict()."""
    steps = data["activations"] if "activations" in data else [data]
    body = "".join(_step(d) for d in steps) or "<p>No autograd graph was recorded.</p>"
    return (f'<section class="amem-prov"><style>{_CSS}</style><h2>Provenance: activation memory</h2>'
            f"{_headline(data)}{body}</section>")


def page(data: dict) -> str:
    title = f"amem provenance: {_e(data.get('model') or 'tracer')}"
    return f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title></head><body>{section(data)}</body></html>"
