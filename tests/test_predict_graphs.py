"""CUDA graphs under prediction (amem_alloc/predict/shims/graphs.py): a capture's allocations live in
its private pool, as torch's caching allocator serves them (c10/cuda/CUDACachingAllocator.cpp
beginAllocateToPool / releasePool), replays allocate nothing, and the pool's memory goes back only
when its graphs are gone. Figures are torch's own rules applied by hand: 20 MiB segments for large
requests, 2 MiB for small ones."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import amem_alloc  # noqa: E402
from amem_alloc.replay import ALLOC, POOL_BEGIN, POOL_END, POOL_RELEASE  # noqa: E402

MiB = 1 << 20


def _predict(body):
    seen = {}

    def main():
        body(seen)
    prediction = amem_alloc.predict(main, gpu="H100", policies=["torch"])
    return prediction, seen


def test_memory_freed_inside_a_capture_stays_in_the_graphs_pool():
    def body(seen):
        x = torch.empty(4 * MiB, dtype=torch.uint8, device="cuda")   # a 20 MiB segment, 16 MiB of it free
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            seen["capturing"] = torch.cuda.is_current_stream_capturing()
            tmp = torch.empty(8 * MiB, dtype=torch.uint8, device="cuda")   # the pool's own segment
            del tmp
        seen["after capture"] = torch.cuda.memory_reserved()
        y = torch.empty(18 * MiB, dtype=torch.uint8, device="cuda")  # would fit the pool's free 20 MiB
        seen["after outside alloc"] = torch.cuda.memory_reserved()
        g.reset()
        del y, x
        torch.cuda.empty_cache()
        seen["after release"] = torch.cuda.memory_reserved()

    prediction, seen = _predict(body)
    assert seen["capturing"] is True and torch.cuda.is_current_stream_capturing is not None
    assert seen["after capture"] == 40 * MiB          # the shared segment and the pool's
    assert seen["after outside alloc"] == 58 * MiB    # its own 18 MiB segment: the pool's block is the graph's
    assert seen["after release"] == 0                 # the graph gone, empty_cache returns the pool too
    kinds = [op[0] for op in prediction.run.ops]
    assert kinds.count(POOL_BEGIN) == kinds.count(POOL_END) == kinds.count(POOL_RELEASE) == 1


def test_replays_allocate_nothing_and_captured_outputs_stay_live():
    def body(seen):
        x = torch.zeros(1024, 1024, device="cuda")
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = (x * 2).relu()                            # a temporary and the output, 4 MiB each
        seen["allocs"] = torch.cuda.memory_stats()["allocation.all.allocated"]
        for _ in range(5):
            g.replay()
        seen["allocs after replays"] = torch.cuda.memory_stats()["allocation.all.allocated"]
        seen["allocated"] = torch.cuda.memory_allocated()
        del out

    prediction, seen = _predict(body)
    assert seen["allocs after replays"] == seen["allocs"]
    assert seen["allocated"] == 8 * MiB                     # x and the captured output
    assert sum(1 for op in prediction.run.ops if op[0] == ALLOC) == 3


def test_the_prediction_replays_the_pool_as_the_live_core_did():
    def body(seen):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            tmp = torch.empty(8 * MiB, dtype=torch.uint8, device="cuda")
            del tmp
        y = torch.empty(8 * MiB, dtype=torch.uint8, device="cuda")
        seen["reserved"] = torch.cuda.max_memory_reserved()
        del y

    prediction, seen = _predict(body)
    row = next(r for r in prediction.to_dict()["policies"] if r["policy"] == "torch")
    assert row["peak_reserved"] == seen["reserved"] == 40 * MiB


def test_graphs_sharing_a_pool_release_it_when_the_last_is_reset():
    def body(seen):
        pool = torch.cuda.graph_pool_handle()
        graphs = [torch.cuda.CUDAGraph() for _ in range(2)]
        for g in graphs:
            with torch.cuda.graph(g, pool=pool):
                tmp = torch.empty(8 * MiB, dtype=torch.uint8, device="cuda")
                del tmp
        seen["shared"] = torch.cuda.memory_reserved()       # the second capture reused the first's block
        graphs[0].reset()
        torch.cuda.empty_cache()
        seen["one left"] = torch.cuda.memory_reserved()
        graphs[1].reset()
        torch.cuda.empty_cache()
        seen["none left"] = torch.cuda.memory_reserved()

    _, seen = _predict(body)
    assert seen["shared"] == 20 * MiB
    assert seen["one left"] == 20 * MiB
    assert seen["none left"] == 0


def test_the_core_replays_pool_scopes_and_refuses_unknown_kinds():
    """The C++ replay loop (csrc/core/replay.cpp, Note [captured pools]) on a packed program."""
    from amem_alloc import replay

    captured = [(POOL_BEGIN, 1, 0, 0), (ALLOC, 10, 8 * MiB, 0), (replay.FREE, 10, 0, 0), (POOL_END, 1, 0, 0),
                (ALLOC, 11, 18 * MiB, 0)]
    plain = [op for op in captured if op[0] in (ALLOC, replay.FREE)]
    run = lambda ops: replay.run(replay.Program(replay.pack(ops)))   # noqa: E731
    assert run(plain).peak_reserved == 20 * MiB           # the 18 MiB request reuses the freed 20 MiB segment
    assert run(captured).peak_reserved == 38 * MiB        # it cannot: that segment is the pool's
    released = captured + [(POOL_RELEASE, 1, 0, 0), (replay.RELEASE, 0, 0, 0), (ALLOC, 12, 18 * MiB, 0)]
    assert run(released).peak_reserved == 38 * MiB
    with pytest.raises(ValueError, match="unknown kind 7"):
        run([(7, 1, 0, 0)])
