"""One graph's wrapper, as inductor generated it (compile_trace.py), replayed on the session's fake
CUDA tensors: its allocations, buffer reuse and `del`s are inductor's own.

Inductor's Python wrapper is a module whose `call(args)` allocates each buffer a kernel writes
(`empty_strided_cuda`), reuses a dead buffer for a new one of the same size (`buf3 = buf0; del buf0
# reuse`, or `reinterpret_tensor(buf0, ...)`), launches kernels and drops each buffer after its last
use. The replay executes that module itself, with what needs a GPU stood in for:

* kernels: the module's `AsyncCompile` names each kernel and compiles none; a kernel's `.run(...)`
  does nothing (a fused kernel writes its outputs: their buffers are already allocated);
* `empty_strided_cuda` makes a session fake CUDA tensor of the size and stride asked, so the
  allocation lands in the recorded run and is freed when the wrapper lets it go;
* `reinterpret_tensor` is a view (`as_strided` at the storage offset plus the increment);
* streams and guards: the current stream's number, the checks of sizes and alignment passed.

What else the wrapper calls runs as eager would on the fake tensors: `extern_kernels.mm(..., out=)`
(cuBLAS's workspace as eager's), aten fallbacks (their own outputs). The tensors `call` returns are
the session's, which the prediction continues with.
"""
from __future__ import annotations

from typing import Any

import torch

from ...patching import PatchSet, declare

WRAPPER_PREFIX = "inductor_wrapper_"   # a loaded wrapper's code is named "<inductor_wrapper_forward>" and alike

LOAD_COMPILE = declare("torch._inductor.async_compile", "AsyncCompile",
                       "while an inductor wrapper is loaded for the replay: kernels are named, none compiled "
                       "(their launches do nothing; the replay keeps only the wrapper's allocations)")


# ============================================================================ kernels, never compiled
class _Kernel:
    """A kernel the wrapper launches: nothing runs (its output buffers were allocated before)."""

    def __init__(self, name: str):
        self.name = name

    def run(self, *args, **kwargs) -> None:
        return None

    def __call__(self, *args, **kwargs) -> None:
        return None


class _NoCompile:
    """AsyncCompile as the wrapper uses it: `.triton(name, source, ...)` (and every other kind)
    gives a kernel that does nothing; `.wait(scope)` has nothing to wait for."""

    def __getattr__(self, kind: str):
        if kind.startswith("__"):
            raise AttributeError(kind)
        return lambda name="kernel", *args, **kwargs: _Kernel(str(name))

    def wait(self, scope: dict) -> None:
        return None


# ============================================================================ what the wrapper allocates
def _empty_strided_cuda(size, stride, dtype) -> torch.Tensor:
    return torch.empty_strided(tuple(size), tuple(stride), dtype=dtype, device="cuda")   # the session's factory


def _empty_strided(size, stride, dtype=None, device=None, **kwargs) -> torch.Tensor:
    if device is not None and torch.device(device).type == "cuda":
        return _empty_strided_cuda(size, stride, dtype)
    return torch.empty_strided(size, stride, dtype=dtype, device=device, **kwargs)


def _reinterpret_tensor(t: torch.Tensor, size, stride, offset_increment: int = 0) -> torch.Tensor:
    return t.as_strided(tuple(size), tuple(stride), t.storage_offset() + offset_increment)


def _nothing(*args, **kwargs) -> None:
    return None


_STAND_INS = {
    "empty_strided_cuda": _empty_strided_cuda,
    "empty_strided": _empty_strided,
    "reinterpret_tensor": _reinterpret_tensor,
    "get_raw_stream": lambda index=0: 0,
    "assert_size_stride": _nothing,
    "assert_tensor_metadata": _nothing,
    "assert_alignment": _nothing,
}


class _NoDeviceGuard:
    """`torch.cuda._DeviceGuard(i)` in the wrapper: the fake tensors claim device 0 already."""

    def __init__(self, index: int):
        self.index = index

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None


# ============================================================================ the replay
class Replay:
    """A wrapper module, loaded once (no kernel compiled); called per run of its graph."""

    def __init__(self, source: str, name: str = WRAPPER_PREFIX + "graph"):
        self.source = source
        self.scope: dict[str, Any] = {"__name__": name}
        code = compile(source, f"<{name}>", "exec")
        with PatchSet() as patches:
            import torch._inductor.async_compile as async_compile

            patches.apply(LOAD_COMPILE, async_compile, "AsyncCompile", _NoCompile)
            exec(code, self.scope)
        self.scope.update(_STAND_INS)
        self.scope["torch"] = _TorchView()

    def __call__(self, args: list) -> list:
        """The graph run on `args`, which it clears (AOTAutograd's boxed call): what the caller
        passed is freed where the wrapper `del`s it, unless held elsewhere."""
        return list(self.scope["call"](args))


class _CudaView:
    """torch.cuda as the wrapper's `call` sees it: its device guard and set_device do nothing (the
    session's fake tensors are on the region's device already; the trace named device 0)."""

    _DeviceGuard = _NoDeviceGuard

    @staticmethod
    def set_device(index) -> None:
        return None

    def __getattr__(self, name: str):
        return getattr(torch.cuda, name)


class _TorchView:
    """`torch` as the wrapper's `call` sees it: torch itself, but for torch.cuda (above)."""

    cuda = _CudaView()

    def __getattr__(self, name: str):
        return getattr(torch, name)
