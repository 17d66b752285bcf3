"""amem_alloc — a CUDA caching allocator for PyTorch that tells you where your GPU memory goes.

    import amem_alloc
    amem_alloc.enable()                      # before any CUDA work; or `amem run script.py`
    amem_alloc.memory_stats(0)               # torch's key names, amem's figures
    amem_alloc.fragmentation(0)

    a = amem_alloc.Allocator(backend="sim")  # the same C++ core, on a CPU
"""
from ._C import BackendError, ConfigError, InvalidFreeError, InvalidRequestError, OutOfMemoryError
from .allocator import Allocator
from .config import canonical as canonical_config
from .config import option_table
from .cuda import empty_cache, enable, fragmentation, is_enabled, memory_stats, reset_peak_memory_stats, segments
from .introspection import BlockInfo, Fragmentation, SegmentInfo

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
    "canonical_config",
    "empty_cache",
    "enable",
    "fragmentation",
    "is_enabled",
    "memory_stats",
    "option_table",
    "reset_peak_memory_stats",
    "segments",
]
__version__ = "0.1.0"
