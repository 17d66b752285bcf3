"""amem compare: allocator configurations side by side, on a GPU or simulated without one.

    from amem_alloc.compare import compare
    result = compare(workload="gpt")          # one fresh process per configuration
    print(format_text(result))                # also result.files: compare.json, .png, .html

runner.py orchestrates, child.py is one configuration's process, recorder.py records a workload's
CUDA allocations by prediction (no GPU), table.py and plot.py render, fidelity.py measures the emulation of torch's policy
against traces that carry the native allocator's own decisions, and trace_replay.py is
`amem replay`.
"""
from .runner import CompareResult, compare
from .table import format_markdown, format_text

__all__ = ["CompareResult", "compare", "format_markdown", "format_text"]
