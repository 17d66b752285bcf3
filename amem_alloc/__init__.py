"""amem_alloc — a CUDA caching allocator for PyTorch that tells you where your GPU memory goes.

    import amem_alloc
    amem_alloc.enable()                      # before any CUDA work; or `amem run script.py`
    amem_alloc.memory_stats(0)               # torch's key names, amem's figures
    amem_alloc.fragmentation(0)

    a = amem_alloc.Allocator(backend="sim")  # the same C++ core, on a CPU

    with amem_alloc.Tracer(model) as t: ...  # which op, module, autograd node owns each block
    amem_alloc.provenance(tensor); t.activations(); t.report(); amem_alloc.provenance_html(t, "prov.html")

    amem_alloc.predict(step_fn, gpu="H100-80GB")  # GPU memory predicted without a GPU (docs/predict.md)

    amem_alloc.record(stacks="python")       # allocation traces (AMEM_TRACE=path: always on)
    amem_alloc.dump_snapshot("trace.pickle") # torch's snapshot format; `amem report trace.pickle`
"""
from ._C import BackendError, ConfigError, InvalidFreeError, InvalidRequestError, OutOfMemoryError
from .allocator import Allocator
from .config import canonical as canonical_config
from .config import option_table
from .doctor import note_if_hook_inactive as _note_if_hook_inactive
from .cuda import empty_cache, enable, fragmentation, is_enabled, memory_stats, reset_peak_memory_stats, segments
from .trace_export import chrome_trace, rmm_csv
from .introspection import BlockInfo, Fragmentation, SegmentInfo
from .recording import record, tag
from .report import format_prediction, render_report, write_prediction_report, write_report
from .report.provenance import provenance_html
from .snapshot import SnapshotError, load_snapshot
from .snapshot_dump import build_snapshot, dump_snapshot
from .version import __version__

__all__ = [
    "Allocator",
    "BackendError",
    "BlockInfo",
    "ConfigError",
    "Fragmentation",
    "InvalidFreeError",
    "InvalidRequestError",
    "OutOfMemoryError",
    "SegmentInfo",
    "SnapshotError",
    "build_snapshot",
    "Tracer",
    "canonical_config",
    "chrome_trace",
    "dump_snapshot",
    "empty_cache",
    "enable",
    "fit",
    "format_prediction",
    "fragmentation",
    "is_enabled",
    "load_snapshot",
    "memory_stats",
    "option_table",
    "predict",
    "predicting",
    "record",
    "render_report",
    "replay_program",
    "replay_trace",
    "provenance",
    "provenance_html",
    "reset_peak_memory_stats",
    "rmm_csv",
    "segments",
    "tag",
    "write_prediction_report",
    "write_report",
]
_note_if_hook_inactive()  # AMEM_ENABLE=1 without the start-up hook: said, not silently ignored
_LAZY = {"replay_trace": ".replay.trace", "replay_program": ".replay"}  # amem replay; the C++ loop


def __getattr__(name: str):
    """Tracer and provenance import torch, so they load on first use (amem_alloc itself does not)."""
    if name in ("Tracer", "provenance"):
        import importlib

        module = importlib.import_module(".provenance", __name__)  # a callable module: provenance(t)
        return module.Tracer if name == "Tracer" else module
    if name in ("predict", "predicting"):  # the predict package is callable: amem_alloc.predict(fn)
        import importlib

        module = importlib.import_module(".predict", __name__)
        return module if name == "predict" else module.predicting
    if name == "fit":  # amem fit: bisection over predictions
        from .predict.fit import fit

        return fit
    if name in _LAZY:  # replay and compare import numpy: loaded on first use too
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    from .user_script import for_the_script   # Python's own error for a missing name: the caller's

    raise for_the_script(AttributeError(f"module 'amem_alloc' has no attribute {name!r}"))
