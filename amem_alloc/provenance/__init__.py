"""Provenance: which op, module and autograd node owns each block; activation memory per node.

    with amem_alloc.Tracer(model) as t:          # around forward, backward and optimizer step
        loss = model(x).sum(); loss.backward(); opt.step()
    print(t.report())                            # readable tables (returned; a REPL shows them)
    t.activations()                              # per node, per module, totals (.to_dict(): JSON)
    amem_alloc.provenance(tensor)                # one tensor: block, op, module, phase, category ...

This package is also callable: amem_alloc.provenance(tensor) is provenance.provenance(tensor).
Files: tracer (the context manager), dispatch (per op), graph (saved tensors), scope (modules and
phases), allocations (storage table), accounting (bytes per device), classify (categories),
activations (the per-step report), report (its text), lookup (one tensor). The package makes no
HTML: amem_alloc.provenance_html(t, path) (amem_alloc/report/provenance.py) draws the page from
t.to_dict().
"""
from __future__ import annotations

import sys
import types

from .activations import ActivationReport
from .lookup import Provenance, provenance, tracers
from .records import CATEGORIES, PHASES
from .report import compare_text
from .tracer import Tracer


def compare(a, b, labels=None) -> str:
    """Two activation reports (or Tracers) side by side per module, e.g. without and with checkpointing."""
    return compare_text(a, b, labels)


class _CallableModule(types.ModuleType):
    def __call__(self, tensor, tracer=None) -> Provenance:
        return provenance(tensor, tracer)


sys.modules[__name__].__class__ = _CallableModule

__all__ = ["ActivationReport", "CATEGORIES", "PHASES", "Provenance", "Tracer", "compare", "provenance", "tracers"]
