"""Allocated and reserved memory over time, one colour per configuration, as a PNG (matplotlib,
headless) or, with no matplotlib, an SVG file (report/line_chart.py). Reserved is the solid line,
allocated the dashed one; in simulated runs every configuration replays the same requests, so the
x axis (allocator calls) is shared, and step boundaries are marked."""
from __future__ import annotations

from pathlib import Path
from typing import Any

MiB = 1 << 20


def _figure(series: list[tuple[str, list]], title: str, xlabel: str, steps: list[int] | None):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 5), dpi=110)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (label, timeline) in enumerate(series):
        if not timeline:
            continue
        xs = [p[0] for p in timeline]
        color = colors[i % len(colors)]
        ax.plot(xs, [p[2] / MiB for p in timeline], color=color, lw=1.6, label=f"{label} reserved")
        if all(p[1] is not None for p in timeline):  # a native trace knows reserved only
            ax.plot(xs, [p[1] / MiB for p in timeline], color=color, lw=1.0, ls="--", label=f"{label} allocated")
    for x in steps or []:
        ax.axvline(x, color="0.85", lw=0.6, zorder=0)
    ax.set(title=title, xlabel=xlabel, ylabel="MiB")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2, loc="upper left")
    fig.tight_layout()
    return fig


def plot_timelines(series: list[tuple[str, list]], path: str | Path, title: str, xlabel: str,
                   steps: list[int] | None = None) -> Path:
    """series: (label, [(x, allocated bytes, reserved bytes), ...]) per configuration."""
    from matplotlib import pyplot as plt

    from ..atomic_write import atomic_file

    fig = _figure(series, title, xlabel, steps)
    path = Path(path)
    try:
        with atomic_file(path, "wb") as f:
            fig.savefig(f, format="png")
    finally:
        plt.close(fig)
    return path


def write(result: Any, out: Path) -> dict:
    """compare.png for a CompareResult; {} when no configuration produced a timeline."""
    series = [(r["policy"], r.get("timeline") or []) for r in result.rows if not r.get("error")]
    if not any(t for _, t in series):
        return {}
    unit = next((r.get("timeline_unit") for r in result.rows if r.get("timeline_unit")), "allocator call")
    mode = "simulated" if result.mode == "simulated" else "measured"
    steps = (result.recording or {}).get("step_ops")
    try:
        path = plot_timelines(series, out / "compare.png", f"{result.target} ({mode})", unit, steps)
    except ImportError:  # matplotlib is optional: the table and JSON still stand
        return {}
    return {"png": path}


def write_replay_plots(report: Any, path: str | Path) -> list[Path]:
    """`amem replay --plot`: a replay.trace.TraceReplay as one plot per device (`path` itself when there
    is one device; name-dN.png otherwise): SVG where the path ends in .svg (no matplotlib), else PNG."""
    path, out = Path(path), []
    draw = svg_timelines if path.suffix == ".svg" else plot_timelines
    for d in report.devices:
        target = path if len(report.devices) == 1 else path.with_name(f"{path.stem}-d{d.trace.device}{path.suffix}")
        series = [(r.policy, r.timeline) for r in d.rows]
        if d.trace.native.segment_events:
            series.insert(0, ("native (trace)", d.native_timeline))
        out.append(draw(series, target, f"{Path(report.path).name}, device {d.trace.device} (simulated)",
                        "request", None))
    return out


def svg_timelines(series: list[tuple[str, list]], path: str | Path, title: str, xlabel: str,
                  steps: list[int] | None = None) -> Path:
    """plot_timelines' figure as an SVG file (report/line_chart.py), with no matplotlib."""
    from ..atomic_write import write_text
    from . import line_chart

    lines = []
    for i, (label, timeline) in enumerate(s for s in series if s[1]):
        xs = [p[0] for p in timeline]
        lines.append(line_chart.Line(f"{label} reserved", line_chart.colour(i), xs, [p[2] for p in timeline]))
        if all(p[1] is not None for p in timeline):
            lines.append(line_chart.Line(f"{label} allocated", line_chart.colour(i), xs, [p[1] for p in timeline],
                                         dashed=True))
    end = f"{max((ln.xs[-1] for ln in lines if ln.xs), default=0):,} ({xlabel})"
    return write_text(path, line_chart.chart(lines, end, "timeline", title, steps, standalone=True))
