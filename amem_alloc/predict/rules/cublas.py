"""cuBLAS's workspace: what a matmul takes from the caching allocator on its first call.

Design note
-----------
aten/src/ATen/cuda/CublasHandlePool.cpp: the first cuBLAS (or cuBLASLt) call on a stream
allocates a workspace through the caching allocator and keeps it for the process's life, one per
(handle, stream); handles are per thread, so backward (the autograd engine's device thread) has
its own. Its size is CUBLAS_WORKSPACE_CONFIG's sum of ":SIZE:COUNT" sizes (KiB), else 32 MiB on
compute capability 9.x/10.x/11.x/12.x, else 4096 KiB * 2 + 16 KiB * 8. The session keeps which
(thread, stream) pairs have one (FakeCudaSession._cublas_workspace).
"""
from __future__ import annotations

import os
import re

from .registry import Stage, aten_op, rule

BLAS_OPS = {"mm", "addmm", "bmm", "baddbmm", "addmv", "mv", "addbmm", "_addmm_activation", "dot", "vdot",
            "addr", "_scaled_mm", "_int_mm"}


def workspace_bytes(capability: tuple[int, int]) -> int:
    conf = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    default = 4096 * 8 * 1024 if capability[0] in (9, 10, 11, 12) else 4096 * 1024 * 2 + 16 * 1024 * 8
    if not conf:
        return default
    sizes = re.findall(r":([0-9]+):([0-9]+)", conf)
    return sum(int(size) * 1024 for size, _ in sizes) if sizes else default


@rule(Stage.KERNEL, *(aten_op(name) for name in sorted(BLAS_OPS)), source="aten/src/ATen/cuda/CublasHandlePool.cpp")
def before_op(args, kwargs, scratch, session) -> None:
    session._cublas_workspace()
