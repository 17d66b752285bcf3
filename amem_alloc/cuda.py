"""amem on real GPUs: swap it in as torch's CUDA allocator, and read what it holds per device.

enable() must run before torch initializes CUDA (the first CUDA tensor, torch.cuda.init(), ...):
torch refuses to swap an allocator that has served memory. `amem run script.py` and
AMEM_ENABLE=1 put it in place before any user code runs. What amem holds per device is read
through amem_alloc.devices (re-exported here). Why it cannot run here is said by
pluggable_problem (this torch) and gpu_problem (this machine), which `amem doctor` and
`amem compare` ask too.
"""
from __future__ import annotations

import ctypes
import os
import threading
from typing import Any

from . import _C
from .config import resolve_with_policy
from .devices import block_info, empty_cache, fragmentation, memory_stats, reset_peak_memory_stats, segments  # noqa: F401
from .recording import start_always_on, trace_config_from_env
from .torch_patch import patch

_lock = threading.Lock()
_state: dict[str, Any] = {"enabled": False, "conf": None, "allocator": None}

_TOO_LATE = (
    "amem_alloc.enable() must run before CUDA is initialized, but torch has already initialized "
    "CUDA in this process (a CUDA tensor, torch.cuda.init() or a CUDA query created its context), "
    "and torch cannot swap an allocator after that. Call amem_alloc.enable() at the very top of "
    "your script, before any CUDA work, or start the script with `amem run script.py` or with "
    "AMEM_ENABLE=1 in the environment."
)


def _function_address(lib: ctypes.CDLL, name: str) -> int:
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


# torch's setter on _CUDAPluggableAllocator -> our C entry point (csrc/bind/c_api.cpp).
HOOKS = {
    "set_init_fn": "amem_init",                            # torch initialising CUDA
    "set_reset_fn": "amem_empty_cache",                    # torch.cuda.empty_cache()
    "set_record_stream_fn": "amem_record_stream",          # tensor.record_stream(stream)
    "set_memory_fraction_fn": "amem_set_memory_fraction",  # torch.cuda.set_per_process_memory_fraction
    "set_begin_allocate_to_pool": "amem_begin_allocate_to_pool",  # CUDA graph capture / MemPool
    "set_end_allocate_to_pool_fn": "amem_end_allocate_to_pool",
    "set_release_pool": "amem_release_pool",                      # graph / pool destroyed
}


def pluggable_problem(torch: Any) -> str | None:
    """Why this torch cannot take a pluggable CUDA allocator (None: it can)."""
    if not hasattr(torch._C, "_cuda_customAllocator"):
        return (f"torch {torch.__version__} has no pluggable CUDA allocator (torch._C._cuda_customAllocator is "
                "missing: a build without CUDA); install a CUDA build of torch")
    return None


def gpu_problem() -> str | None:
    """Why no CUDA device is usable here (None: one is); cheap when there is no NVIDIA driver at all."""
    if not any(os.path.exists(p) for p in ("/dev/nvidiactl", "/proc/driver/nvidia")):
        return "this machine has no NVIDIA driver (no /dev/nvidiactl)"
    try:
        import torch

        return None if torch.cuda.is_available() else "torch sees no CUDA device (torch.cuda.is_available() is False)"
    except Exception as err:  # noqa: BLE001 - no usable torch means no GPU run
        return f"torch cannot be imported ({type(err).__name__}: {err})"


def _register_hooks(pluggable: Any, lib: ctypes.CDLL) -> None:
    for setter, symbol in HOOKS.items():
        getattr(pluggable, setter)(_function_address(lib, symbol))


def enable(patch_torch: bool = True, policy: str | None = None, **options: Any) -> None:
    """Makes amem torch's CUDA allocator for this process.

    It starts from a named policy of amem_alloc/policies.py: `amem` (expandable segments with
    10 MiB pages, and blocks handed from one stream to another without a host sync: the
    combination that wastes least on the real traces, docs/policies.md) unless `policy` or
    AMEM_POLICY names another, e.g. policy="amem-defaults" for torch's own decisions. AMEM_CONF,
    then the keyword options, override it key by key, e.g.
    enable(max_split_size_mb=512, garbage_collection_threshold=0.8). A device that cannot map
    pages gets plain segments unless you asked for expandable segments yourself. With patch_torch
    (the default) torch.cuda.memory_stats, memory_allocated, memory_summary, _snapshot, ... report
    amem's figures (see amem_alloc/torch_patch.py for the exact list); patch_torch=False leaves
    torch's functions alone.
    """
    import torch

    config = resolve_with_policy(options, policy)
    conf = config.conf
    trace = trace_config_from_env()  # AMEM_TRACE: a bad value raises before anything is installed
    with _lock:
        if _state["enabled"]:
            if conf != _state["conf"]:
                raise RuntimeError(
                    f"amem is already enabled with options {_state['conf']!r}; options are fixed "
                    "once the allocator is in place. Restart the process to change them."
                )
            return
        if torch.cuda.is_initialized():
            raise RuntimeError(_TOO_LATE)
        if pluggable_problem(torch):
            raise RuntimeError(f"amem cannot be torch's allocator: {pluggable_problem(torch)}")
        _C.cuda_configure(conf, expandable_optional=config.expandable_optional)
        pluggable = torch.cuda.memory.CUDAPluggableAllocator(_C.__file__, "amem_malloc", "amem_free")
        _register_hooks(pluggable._allocator, ctypes.CDLL(_C.__file__))
        try:
            torch.cuda.memory.change_current_allocator(pluggable)
        except RuntimeError as err:
            raise RuntimeError(f"{_TOO_LATE} (torch said: {err})") from err
        _state.update(enabled=True, conf=conf, allocator=pluggable)
        if patch_torch:
            patch()
        if trace is not None:  # always-on mode: record from now on, dump at exit and on OOM
            start_always_on(**trace)


def is_enabled() -> bool:
    """Whether amem is torch's CUDA allocator in this process."""
    return bool(_state["enabled"])
