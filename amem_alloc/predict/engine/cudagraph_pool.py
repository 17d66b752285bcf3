"""A compiled region under mode="reduce-overhead": inductor's CUDA graph trees run its graphs in
one private memory pool, and the prediction puts the graphs' allocations there.

torch (torch/_inductor/cudagraph_trees.py) keeps one tree per device and thread, all of whose
graphs, forward and backward, share one pool (`graph_pool_handle()` made with the tree); the
first call of a graph warms it up with its allocations already in that pool, the next records it
there, and later calls replay it, writing into the same blocks. The pool stays reserved while the
trees live (the process, unless `reset_cudagraph_trees()`): `empty_cache()` does not return it.

Here each call replays the graph's allocations inside the pool's scope (the recorded program's
POOL_BEGIN/POOL_END, as a capture's, shims/graphs.py): what a call frees goes back to the pool and
the next call takes it again, so the pool holds one call's footprint; where a previous call's
outputs are still alive when the next runs, the pool grows by them (torch overwrites them in
place, and refuses their later use). The pool is never released, as torch keeps it.
"""
from __future__ import annotations

import itertools
import weakref

_POOL_NUMBERS = itertools.count(1 << 30)   # apart from the numbers torch.cuda.graph_pool_handle gives
_TREE_POOLS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # session -> its trees' pool

NOTE = ("under CUDA graph trees (inductor's triton.cudagraphs: modes \"reduce-overhead\" and \"max-autotune\" set it): "
        "its memory comes from the trees' private pool, kept reserved; each call's allocations are replayed in the "
        "pool (torch replays into the same blocks)")


def wants_cudagraphs(options: dict | None) -> bool:
    """Whether the region's inductor options turn on CUDA graphs (what mode="reduce-overhead" sets)."""
    return bool(options and options.get("triton.cudagraphs"))


def tree_pool(session) -> int:
    """The one pool of the session's CUDA graph trees (one device, as the session predicts one)."""
    pool = _TREE_POOLS.get(session)
    if pool is None:
        pool = _TREE_POOLS[session] = next(_POOL_NUMBERS)
        session.uses("graphs")
    return pool


class PooledRunner:
    """The session's graph runner with every graph's allocations in the trees' pool."""

    def __init__(self, session, runner):
        self.session, self.runner = session, runner

    def run(self, graph, inputs: list) -> list:
        pool = tree_pool(self.session)
        self.session.pool_event("begin", pool)
        try:
            return self.runner.run(graph, inputs)
        finally:
            self.session.pool_event("end", pool)
