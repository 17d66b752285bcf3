"""The comparison as a text table (the terminal), a markdown table (benchmarks/RESULTS.md), and the
data of its HTML page, which report/compare.py builds."""
from __future__ import annotations

from pathlib import Path
from typing import Any

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
    stopped = (rec.get("info") or {}).get("stopped_after_steps")
    stop = [f"The script was stopped after {stopped} optimizer steps (--steps {stopped}; --steps 0 runs it to "
            "its end), as amem predict stops it: memory reaches its steady state within the first steps."] \
        if stopped else []
    return [f"amem compare: {result.target}. PREDICTED without a GPU: no GPU was used.", *stop,
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


def plot_data(result: Any) -> dict:
    """The timelines the page plots: per configuration [x, allocated or None, reserved] points, the
    x axis's unit, and the step boundaries (simulated runs share one x axis: the same requests)."""
    series = [{"policy": r["policy"], "timeline": r.get("timeline") or []} for r in result.rows if not r.get("error")]
    unit = next((r.get("timeline_unit") for r in result.rows if r.get("timeline_unit")), "allocator call")
    return {"series": series, "unit": unit, "steps": (result.recording or {}).get("step_ops") or []}


def page_data(result: Any) -> dict:
    """What compare.html shows, as data for report/compare.py: the same lines and cells as the text."""
    return {"title": f"amem compare: {result.target}",
            "subtitle": "predicted without a GPU" if result.mode == "simulated" else f"on {result.environment.get('device')}",
            "preamble": preamble(result), "columns": list(HEADERS),
            "rows": [evaluation.cells(r, HEADERS) for r in result.rows], "footnotes": footnotes(result),
            "plot": plot_data(result)}


def write_html(result: Any, path: Path) -> Path:
    """compare.html: the page is report/'s (report/compare.py), from page_data; its plot is inline SVG."""
    from ..report.compare import write_page

    return write_page(page_data(result), path)
