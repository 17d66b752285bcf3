"""LiveAllocator: the recorded allocations fed, as they happen, into amem's C++ core on the sim
backend under one policy (torch's by default), so that torch.cuda's memory questions asked
mid-script (`memory_allocated()`, `memory_stats()`, `mem_get_info()`) read what the caching
allocator would hold at that point on the GPU, not an estimate made afterwards."""
from __future__ import annotations

from typing import Any

from ..._C import CoreAllocator
from ...introspection import parse_stats

class LiveAllocator:
    """Listener: feeds the recorded allocations into the core (sim backend) as they happen."""

    def __init__(self, conf: str = "") -> None:
        self.conf = conf
        self.core = CoreAllocator("sim", conf, 0)
        self.live: dict[int, int] = {}                    # key -> address in the core
        self.unknown_frees = 0

    # ---------------------------------------------------------------- the listener protocol
    def on_alloc(self, key: int, stream: int, info: Any) -> None:
        if key in self.live:                      # a key reused without its free: release the old block
            self.core.free(self.live.pop(key))
        address = self.core.malloc(int(info.requested), stream)
        if address:
            self.live[key] = address

    def on_free(self, key: int) -> None:
        address = self.live.pop(key, None)
        if address is None:
            self.unknown_frees += 1
        else:
            self.core.free(address)

    def on_marker(self, name: str) -> None:
        pass

    def on_release(self) -> None:
        """torch.cuda.empty_cache(): the core empties its cache."""
        self.core.empty_cache()

    def on_pool(self, event: str, pool: int) -> None:
        """A CUDA graph capture's private pool (shims/graphs.py): every stream's requests go there."""
        pool_id = (0, pool)
        if event == "begin":
            self.core.begin_allocate_to_pool(pool_id, [])
        elif event == "end":
            self.core.end_allocate_to_pool(pool_id)
        else:
            self.core.release_pool(pool_id)

    # ---------------------------------------------------------------- what scripts ask
    def stats(self) -> dict[str, int]:
        return parse_stats(self.core.stats_json())

    def reset_peaks(self) -> None:
        self.core.reset_peak_stats()
