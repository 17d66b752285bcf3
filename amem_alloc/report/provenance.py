"""Offline HTML for the activation report: a fragment another report can embed, and a page.

No JavaScript and nothing loaded from the network. `section(data)` takes Tracer.to_dict() (or one
ActivationReport.to_dict()) and is what the offline HTML report of allocator traces embeds when a
tracer's data is given to it; `page(data)` is that section in the report's own page (its
template and stylesheet, amem_alloc/report/), so both look alike. `provenance_html(tracer, path)`
(amem_alloc.provenance_html) writes a Tracer's page: the Tracer hands its data, never HTML.
"""
from __future__ import annotations

import html

from .. import atomic_write
from ..introspection import format_bytes
from ..provenance_format import module_label
from ..user_input import output_file

def _e(x) -> str:
    return html.escape(str(x))


def _table(head: list[str], rows: list[list[str]], classes: list[str] | None = None) -> str:
    th = "".join(f"<th>{_e(h)}</th>" for h in head)
    body = []
    for i, row in enumerate(rows):
        cls = f' class="{classes[i]}"' if classes and classes[i] else ""
        body.append(f"<tr{cls}>" + "".join(row) + "</tr>")
    return f"<table class=\"prov\"><tr>{th}</tr>{''.join(body)}</table>"


def _num(n: int) -> str:
    return f'<td class="num" title="{n} bytes">{_e(format_bytes(n))}</td>'


def _step(d: dict) -> str:
    t = d["total"]
    cards = [(format_bytes(t["allocator_bytes"]), "allocator bytes"), (format_bytes(t["nominal_bytes"]), "nominal bytes"),
             (f"{t['storages']:,}", "storages")]
    head = (f"<h3>Activation memory, step {d['step']} of {d['steps']} ({_e(d['status'])})</h3>"
            '<div class="cards">' + "".join(f"<div class=\"card\"><strong>{_e(v)}</strong><span>{_e(k)}</span></div>"
                                            for v, k in cards) + "</div>"
            f"<p>{_e(d['message'])}</p><p class=\"muted\">{'<br>'.join(_e(a) for a in d['accounting'])}</p>")
    modules = _table(["module", "self allocator", "total nominal", "total allocator", "storages"],
                     [[f"<td>{_e(m['label'])}</td>", _num(m["self"]["allocator_bytes"]),
                       _num(m["total"]["nominal_bytes"]), _num(m["total"]["allocator_bytes"]),
                       f'<td class="num">{m["total"]["storages"]}</td>'] for m in d["modules"]])
    rows = sorted(d["saved"], key=lambda r: (not r["counted"], -r["allocator_bytes"]))
    saved = _table(["node.slot", "module", "dtype", "shape", "what", "nominal", "allocator", "note"],
                   [[f"<td>{_e(r['label'])}</td>", f"<td>{_e(module_label(r['module']))}</td>",
                     f"<td>{_e(r['dtype'])}</td>", f"<td>{_e(r['shape'])}</td>", f"<td>{_e(r['what'])}</td>",
                     _num(r["nominal_bytes"]), _num(r["allocator_bytes"]), f"<td>{_e(r['note'])}</td>"]
                    for r in rows], ["" if r["counted"] else "off" for r in rows])
    return head + "<h4>By module</h4>" + modules + "<h4>Saved tensors</h4>" + saved


def _headline(data: dict) -> str:
    """Tracer.to_dict()'s first figures: activation memory per step and the largest saved tensors."""
    lines = list(data.get("headline", {}).get("activation_memory", [])) + list(data.get("largest_saved", []))
    return f"<p>{'<br>'.join(_e(line) for line in lines)}</p>" if lines else ""


def section(data: dict) -> str:
    """An HTML fragment (a <section>) for Tracer.to_dict() or one ActivationReport.to_dict()."""
    steps = data["activations"] if "activations" in data else [data]
    body = "".join(_step(d) for d in steps) or "<p>No autograd graph was recorded.</p>"
    return (f'<section class="amem-prov"><h2>Provenance: activation memory</h2>'
            f"{_headline(data)}{body}</section>")


def page(data: dict) -> str:
    """A whole page, styled like amem's report of allocator traces (and with no script)."""
    from ..version import __version__
    from .html import page as report_page

    model = data.get("model") or "tracer"
    duration = data.get("duration_ms")
    subtitle = f"torch {data.get('torch', '?')}" + (f"; traced for {duration:.1f} ms" if isinstance(duration, (int, float)) else "")
    return report_page(f"amem provenance: {model}", subtitle, section(data), None, __version__)


def provenance_html(tracer, path=None) -> str:
    """The offline page of a Tracer (or of its to_dict()), returned, and written to `path` if one is given.

    amem_alloc.provenance_html(t, "prov.html"): the Tracer hands its data (to_dict), report/ makes the page.
    """
    if path is not None:  # a path that cannot be written is said before the work, in one line
        output_file(path, "amem_alloc.provenance_html")
    text = page(tracer if isinstance(tracer, dict) else tracer.to_dict(allocations=False))
    if path is not None:
        atomic_write.write_text(path, text)
    return text
