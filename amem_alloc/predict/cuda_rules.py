"""The entry points the engine calls for what CUDA kernels allocate that meta kernels do not show.

execution.py calls `function` (torch-function level), `before_op` (before each CUDA op: the
kernel's temporaries), `layout` (an output CUDA returns in another memory format) and
`host_outputs` (outputs CUDA keeps off the device); session.py sizes the
cuBLAS workspace with `cublas_workspace_bytes`. The rules themselves, each from torch's CUDA
sources, live in the `kernels` package (kernels/__init__.py lists them).
"""
from __future__ import annotations

from .kernels import before_op, function, host_outputs, layout
from .kernels.cublas import workspace_bytes as cublas_workspace_bytes

__all__ = ["function", "before_op", "layout", "host_outputs", "cublas_workspace_bytes"]
