"""CUDA graphs under prediction: what a capture does to memory, since nothing is captured or replayed.

Design note
-----------
torch's caching allocator serves every request made during a CUDA graph capture from the graph's
private pool (c10/cuda/CUDACachingAllocator.cpp: `beginAllocateToPool` with the capture's stream
filter, `endAllocateToPool`), keeps that pool's memory for the graph's replays, and gives it back
only when every graph using the pool is gone (`releasePool`; the memory returns at the next
empty_cache). A replay allocates nothing: the captured kernels write into the pool's blocks.

So here a capture is a scope in the recorded program (replay.POOL_BEGIN/POOL_END, Note [captured
pools] in csrc/core/replay.h): the captured code runs once, on fake tensors, and its allocations
and frees land in the pool; `replay()` does nothing; resetting or dropping the last graph of a
pool releases it (POOL_RELEASE). `torch.cuda.graph` mirrors torch's context manager
(torch/cuda/graphs.py: synchronize, empty_cache, the capture stream made current, capture_begin;
capture_end on exit); `graph_pool_handle` gives a pool number; `is_current_stream_capturing`
answers whether a capture is open. Every stream the captured code uses joins its capture (as
FSDP's streams do by waiting on the capturing stream), so every request in the scope goes to
the pool. `make_graphed_callables` stays unmodelled (it captures forward and backward apart).
"""
from __future__ import annotations

import itertools
from typing import Any


class CapturePools:
    """The private pools of one prediction's CUDA graphs: which capture is open, and the session
    that records the pool scopes."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self._numbers = itertools.count(1)
        self.capturing: tuple | None = None
        self.closed = False

    def handle(self) -> tuple[int, int]:
        """torch.cuda.graph_pool_handle(): a pool no graph uses yet."""
        return (0, next(self._numbers))

    def begin(self, pool: tuple) -> None:
        if self.capturing is not None:
            raise RuntimeError("a CUDA graph capture is already underway (torch allows one at a time)")
        self.session.uses("graphs")   # the device total says what it does not count for a graph (context.py)
        self.capturing = pool
        self.session.pool_event("begin", pool[1])

    def end(self) -> None:
        if self.capturing is None:
            raise RuntimeError("capture_end() without capture_begin()")
        self.session.pool_event("end", self.capturing[1])
        self.capturing = None

    def drop(self, pool: tuple) -> None:
        """A graph that captured into `pool` was reset or deleted: it gives up its use of the pool
        (torch's CUDAGraph::reset calls releasePool once per capture; the allocator frees the pool
        when its uses reach 0, as the core does)."""
        if not self.closed:
            self.session.pool_event("release", pool[1])

    def is_capturing(self) -> bool:
        return self.capturing is not None


def graph_class(pools: CapturePools) -> type:
    """torch.cuda.CUDAGraph for this prediction."""

    class CUDAGraph:
        def __init__(self, keep_graph: bool = False) -> None:
            self._pool: tuple | None = None
            self._captured = False

        def capture_begin(self, pool: Any = None, capture_error_mode: str = "global", **kwargs: Any) -> None:
            self._pool = _pool_id(pool) if pool is not None else pools.handle()
            pools.begin(self._pool)

        def capture_end(self) -> None:
            pools.end()
            self._captured = True

        def replay(self) -> None:
            """Nothing runs: the captured work allocated its memory once, during capture."""

        def reset(self) -> None:
            if self._captured and self._pool is not None:
                self._captured = False
                pools.drop(self._pool)

        def pool(self) -> tuple | None:
            return self._pool

        def instantiate(self) -> None:
            pass

        def enable_debug_mode(self) -> None:
            pass

        def debug_dump(self, path: str) -> None:
            pass

        def __del__(self) -> None:
            try:
                self.reset()
            except Exception:   # noqa: BLE001 - a graph collected after its prediction ended
                pass

    return CUDAGraph


def graph_context(pools: CapturePools) -> type:
    """torch.cuda.graph, as torch/cuda/graphs.py's context manager does it."""
    import torch

    class graph:
        default_capture_stream = None

        def __init__(self, cuda_graph: Any, pool: Any = None, stream: Any = None, capture_error_mode: str = "global",
                     **kwargs: Any) -> None:
            if stream is None and self.__class__.default_capture_stream is None:
                self.__class__.default_capture_stream = torch.cuda.Stream()
            self.pool = () if pool is None else (_pool_id(pool),)
            self.capture_stream = stream if stream is not None else self.__class__.default_capture_stream
            self.stream_ctx = torch.cuda.stream(self.capture_stream)
            self.cuda_graph, self.capture_error_mode = cuda_graph, capture_error_mode

        def __enter__(self) -> None:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()   # free as much as possible for the graph, as torch does
            self.stream_ctx.__enter__()
            self.cuda_graph.capture_begin(*self.pool, capture_error_mode=self.capture_error_mode)

        def __exit__(self, *exc: Any) -> None:
            self.cuda_graph.capture_end()
            self.stream_ctx.__exit__(*exc)

    return graph


def _pool_id(pool: Any) -> tuple:
    """A pool handle, a MemPool (its id) or another graph's pool(): the pool's id."""
    return tuple(getattr(pool, "id", pool))
