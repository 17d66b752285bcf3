"""amem compare: allocator configurations side by side, on a GPU or simulated without one.

    from amem_alloc.compare import compare
    result = compare(workload="gpt")          # one fresh process per configuration
    print(format_text(result))                # also result.files: compare.json, .png, .html

runner.py orchestrates, child.py is one configuration's process, predicted_program.py records a
workload's CUDA allocations by prediction (no GPU) as a replay program, and table.py renders the
rows as text and markdown (the page and plot are amem_alloc/report's). The command is
amem_alloc/cli/compare.py; replaying traces (`amem replay`) and the fidelity of the emulation of
torch's policy are amem_alloc/replay's.
"""
from .runner import CompareResult, compare
from .table import format_markdown, format_text

__all__ = ["CompareResult", "compare", "format_markdown", "format_text"]
