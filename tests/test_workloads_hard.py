"""The harder bundled workloads (FSDP, mixture of experts, 1F1B pipeline, LLM serving) make the
allocation patterns they claim, checked on what the CPU allocator saw (recorded as the
fragmentation benchmark records them, each allocation on the stream current when it was made)
and on what each workload reports; each is seeded and has a size knob."""
import random
import sys
from collections import Counter

import numpy as np
import pytest

from amem_alloc import replay, workloads
from amem_alloc.workloads import fsdp, moe, pipeline, serving, streams
from helpers import ROOT

pytest.importorskip("torch")
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_fragmentation  # noqa: E402


def _record(name, steps, size=1):
    """(program, info): the workload run once on the CPU under the profiler."""
    from torch.profiler import ProfilerActivity, profile

    streams.SWITCHES.clear()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        info = workloads.get(name)(size, steps, "cpu", 0)
    program = bench_fragmentation.program_from_profile(bench_fragmentation._allocations(prof), list(streams.SWITCHES))
    return program, info


def _max_live(program, size, stream=None):
    """The most blocks of exactly `size` bytes (on `stream`, if given) live at once."""
    live, best, sizes = 0, 0, {}
    for key, nbytes, on, kind in program.ops.tolist():
        if kind == replay.ALLOC and nbytes == size and stream in (None, on):
            sizes[key] = True
            live += 1
            best = max(best, live)
        elif kind == replay.FREE and sizes.pop(key, False):
            live -= 1
    return best


def test_fsdp_gathers_on_the_communication_stream_and_frees_after_use():
    program, info = _record("fsdp", 1)
    ops = program.ops
    allocs = ops[ops["kind"] == replay.ALLOC]
    assert set(allocs["stream"].tolist()) == {0, 1}  # compute and communication streams
    full = allocs[allocs["size"] == info["gathered_bytes"]]  # a layer's full parameters (or gradients)
    assert info["gathered_bytes"] > 2**20
    # per layer and step: two gathers (forward, backward) and the reduce-scatter's input on the
    # communication stream; the full gradient on the compute stream
    assert (full["stream"] == 1).sum() == 3 * fsdp.LAYERS and (full["stream"] == 0).sum() == fsdp.LAYERS
    assert _max_live(program, info["gathered_bytes"], stream=1) == 2  # prefetch: the next layer's is there
    gathered = full[full["stream"] == 1]
    # compute-stream work happens between a gather and its free: the buffer is used on stream 0
    keys = set(gathered["key"].tolist())
    index = {int(k): i for i, k in enumerate(ops["key"].tolist()) if k in keys and ops["kind"][i] == replay.ALLOC}
    first = next(iter(index))
    freed = next(i for i in range(len(ops)) if ops["kind"][i] == replay.FREE and ops["key"][i] == first)
    between = ops[index[first] + 1:freed]
    assert (between[between["kind"] == replay.ALLOC]["stream"] == 0).any()


def test_moe_sends_a_different_number_of_tokens_to_each_expert_every_step():
    program, info = _record("moe", 2)  # two steps: the counts must change between them
    counts = info["tokens_per_expert"]  # [step][block][expert]
    assert all(sum(block) == info["tokens"] for step in counts for block in step)
    first = counts[0][0]
    assert len(set(first)) >= moe.EXPERTS - 1 and max(first) > 2 * min(first) + 1  # uneven within a step
    assert counts[0][0] != counts[1][0]  # and changing from step to step
    # each expert's hidden activation (tokens x 4*width floats) was really allocated at that size
    sizes = Counter(program.ops[program.ops["kind"] == replay.ALLOC]["size"].tolist())
    for n in first:
        if n:
            assert sizes[n * 4 * info["width"] * 4] >= 1, n
    assert moe.run(steps=1)["tokens_per_expert"] == counts[:1]  # seeded
    assert moe.route(random.Random(0), 512) == moe.route(random.Random(0), 512) != moe.route(random.Random(1), 512)


def test_pipeline_keeps_several_stages_micro_batches_live_at_once():
    assert pipeline.schedule(0)[:5] == [("F", 0), ("F", 1), ("F", 2), ("F", 3), ("B", 0)]
    assert pipeline.schedule(3)[:3] == [("F", 0), ("B", 0), ("F", 1)]
    for s in range(pipeline.STAGES):  # every micro-batch once forward, once backward, forward first
        plan = pipeline.schedule(s)
        assert sorted(plan) == sorted([("F", m) for m in range(8)] + [("B", m) for m in range(8)])
        assert all(plan.index(("F", m)) < plan.index(("B", m)) for m in range(8))
    program, info = _record("pipeline", 1)
    assert info["most_in_flight_per_stage"] == [[4, 3, 2, 1]] and info["most_in_flight_total"] == [10]
    hidden = info["rows"] * 4 * info["width"] * 4  # one micro-batch's 4w activation in one stage
    assert hidden == 2**20
    assert _max_live(program, hidden) >= 10  # the 10 micro-batch-stages in flight at once hold theirs


def test_serving_batch_changes_size_and_kv_caches_grow_and_shrink():
    program, info = _record("serving", 24)
    batch, kv = info["batch_sizes"], info["kv_bytes"]
    assert len(set(batch)) >= 4 and info["finished"] >= 1
    steps = np.diff(kv)
    assert (steps > 0).any() and (steps < 0).any()  # caches grow, and are freed as requests finish
    # the caches grow through torch.cat: allocations of a request's (1, heads, length, head_dim)
    # float32 keys at many lengths, each one token longer than one before it
    per_token = info["width"] * 4
    cache_sizes = {s // per_token for s in program.ops[program.ops["kind"] == replay.ALLOC]["size"].tolist()
                   if s % per_token == 0 and s >= 16 * per_token}
    assert sum(1 for n in cache_sizes if n - 1 in cache_sizes) >= 20
    assert serving.run(steps=6)["batch_sizes"] == batch[:6]  # seeded


def test_size_knobs_scale():
    one, two = fsdp.run(size=1, steps=0), fsdp.run(size=2, steps=0)
    assert two["width"] == 2 * one["width"] and two["gathered_bytes"] > 3.9 * one["gathered_bytes"]
    assert moe.run(size=2, steps=0)["tokens"] == 2 * moe.run(steps=0)["tokens"]
    assert pipeline.run(size=2, steps=0)["rows"] == 1024
    assert serving.run(size=2, steps=0)["width"] == 2 * serving.run(steps=0)["width"]


def test_cpu_streams_are_logged_and_looked_up():
    streams.SWITCHES.clear()
    s1 = streams.Stream("cpu", 1)
    with s1.use():
        with streams.Stream("cpu", 2).use():
            pass
        assert streams._cpu_stream() == 1
    assert streams._cpu_stream() == 0
    log = list(streams.SWITCHES)
    assert [s for _, s in log] == [1, 2, 1, 0]
    assert streams.stream_at(log, log[0][0] - 1) == 0 and streams.stream_at(log, log[1][0]) == 2
    assert streams.stream_at(log, log[3][0] + 10) == 0
