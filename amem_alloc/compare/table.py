"""The comparison as a text table (the terminal), a markdown table (benchmarks/RESULTS.md) and an
HTML page (the report's page template when amem_alloc.report is present, with the plot inline)."""
from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any

from .. import atomic_write
from ..replay import evaluation

# the cells of replay/evaluation.py's rows that amem compare shows (the markdown leaves out the pid)
HEADERS = ("configuration", "peak allocated", "peak reserved", "frag. at peak", "device mallocs", "OOMs",
           "time/step", "pid")


def preamble(result: Any) -> list[str]:
    """What was run and how: the first lines of every rendering."""
    env = result.environment
    if result.mode == "real":
        return [f"amem compare: {result.target} on {env.get('device')} (torch {env.get('torch')}, {env.get('date')}); "
                "each configuration ran for real in its own process."]
    rec = result.recording or {}
    return [f"amem compare: {result.target}. PREDICTED without a GPU: no GPU was used.",
            f"The workload ran once on fake CUDA tensors (amem predict: no compute; {rec.get('ops', 0)} allocator "
            f"calls over {rec.get('steps', 0)} steps, recorded in {rec.get('record_seconds', 0):.1f} s); each "
            "configuration replayed that sequence through amem's C++ core on the sim backend, in its own process.",
            "The figures are what each allocator policy does with the allocations CUDA's caching allocator "
            "would receive (cuBLAS workspaces and CUDA kernels' own buffers included): a prediction, not a GPU "
            "measurement (docs/predict.md says what is modelled)."]


def footnotes(result: Any) -> list[str]:
    notes = []
    if result.mode == "simulated":
        notes.append("time/step: the allocator's own time per step when replaying on the sim backend, "
                     "not the model's step time.")
    notes.append("frag. at peak: 1 - allocated / reserved when reserved memory peaked.")
    notes += [f"{r['policy']}: {r['description']}" + (f" (AMEM_CONF={r['conf']!r})" if r["conf"] else "")
              for r in result.rows]
    return notes


def format_text(result: Any) -> str:
    """The table as the terminal shows it."""
    lines = evaluation.format_table(result.rows, HEADERS)
    return "\n".join(preamble(result) + [""] + lines + [""] + ["* " + n for n in footnotes(result)])


def format_markdown(result: Any) -> str:
    return evaluation.format_markdown(result.rows, HEADERS[:-1])


def _html_table(result: Any) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in HEADERS)
    rows = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in evaluation.cells(r, HEADERS)) + "</tr>" for r in result.rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


def _body(result: Any, png: Path | None) -> str:
    parts = ['<section class="compare"><h2>Configurations</h2>']
    parts += [f"<p>{html.escape(line)}</p>" for line in preamble(result)]
    parts.append(_html_table(result))
    parts.append("<ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in footnotes(result)) + "</ul>")
    if png is not None and Path(png).exists():
        data = base64.b64encode(Path(png).read_bytes()).decode()
        parts.append(f'<h2>Allocated and reserved over time</h2><img alt="allocated and reserved memory over '
                     f'time, one colour per configuration" src="data:image/png;base64,{data}" style="max-width:100%">')
    return "\n".join(parts + ["</section>"])


def write_html(result: Any, path: Path, png: Path | None) -> Path:
    """The page: the report's template (offline, strict CSP) when available, else a plain page."""
    from ..version import __version__

    title = f"amem compare: {result.target}"
    subtitle = "predicted without a GPU" if result.mode == "simulated" else f"on {result.environment.get('device')}"
    try:
        from ..report import html as report_html

        text = report_html.page(title, subtitle, _body(result, png), {"devices": []}, __version__)
    except (ImportError, AttributeError, TypeError, OSError):
        text = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title></head>"
                f"<body><h1>{html.escape(title)}</h1><p>{html.escape(subtitle)}</p>{_body(result, png)}</body></html>")
    return atomic_write.write_text(path, text)
