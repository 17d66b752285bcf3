"""The fragmentation benchmark's measures: the limit (peak live requested bytes), the empty
start, the smallest OOM-free capacity, and, on the shared real traces, the torch and
torch-expandable figures the benchmark's table starts from."""
import sys

import pytest

from amem_alloc import policies, replay
from helpers import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_fragmentation as bf  # noqa: E402

MiB = 1 << 20


def _program(ops, prologue=0):
    return replay.Program(replay.pack(ops), prologue)


def test_limit_is_the_peak_of_live_requested_bytes():
    p = _program([(replay.ALLOC, 1, 3 * MiB, 0), (replay.ALLOC, 2, 5 * MiB, 0), (replay.FREE, 1, 0, 0),
                  (replay.ALLOC, 3, 4 * MiB, 0), (replay.ALLOC, 2, 1 * MiB, 0)])  # key 2 re-allocated smaller
    assert bf.peak_live_requested(p) == 9 * MiB


def test_empty_start_drops_prologue_temporaries_and_releases_keeps_live_blocks():
    temp = replay.TEMP_KEY + 5
    p = _program([(replay.ALLOC, temp, 20 * MiB, 0), (replay.FREE, temp, 0, 0), (replay.ALLOC, 0x1000, 3 * MiB, 0),
                  (replay.ALLOC, 7, 2 * MiB, 0), (replay.RELEASE, 0, 0, 0), (replay.FREE, 7, 0, 0)], prologue=3)
    e = bf.empty_start(p)
    assert e.prologue == 0 and e.ops["key"].tolist() == [0x1000, 7, 7]
    assert replay.RELEASE not in e.ops["kind"].tolist()


def test_smallest_capacity_is_where_the_replay_stops_failing():
    # two 30 MiB blocks live at once, then a 50 MiB one alone: torch's policy needs 60 MiB + room
    ops = [(replay.ALLOC, 1, 30 * MiB, 0), (replay.ALLOC, 2, 30 * MiB, 0), (replay.FREE, 1, 0, 0),
           (replay.FREE, 2, 0, 0), (replay.ALLOC, 3, 50 * MiB, 0), (replay.FREE, 3, 0, 0)]
    case = bf.Case("synthetic", "trace", _program(ops))
    r = bf.measure(case, policies.get("torch"))
    assert case.limit == 60 * MiB and r.peak_reserved == 110 * MiB  # without a limit, 50 MiB more is cached
    assert 60 * MiB <= r.capacity < 61 * MiB  # with one, the OOM retry frees the cache: 60 MiB suffice
    data = case.program.to_bytes()
    assert bf._replay(data, "", r.capacity)["failed_allocs"] == 0
    assert bf._replay(data, "", r.capacity - MiB)["failed_allocs"] > 0
    assert r.total_calls == r.calls["cudaMalloc"] + (r.calls["map"] or 0) + (r.calls["unmap"] or 0) + r.calls["cudaFree"]


@pytest.mark.skipif(not bf.TRACES.is_dir(), reason="../shared/traces is not present")
def test_shared_traces_reproduce_the_reference_figures():
    """torch and torch-expandable from an empty start on the 12 trace-devices: geomean (a) 1.084 /
    1.059, (b) 1.033 / 1.010; multistream_4dev (a) 1.483 / 1.455; small_train (a) 1.164 / 1.169."""
    cases = bf.trace_cases()
    names = ["torch", "torch-expandable"]
    results = bf.measure_all(cases, names)
    assert len(cases) == 12
    summary = {s.policy: s for s in bf.summarize(cases, results, names)}
    assert round(summary["torch"].geomean_a_traces, 3) == 1.084
    assert round(summary["torch-expandable"].geomean_a_traces, 3) == 1.059
    assert round(summary["torch"].geomean_b_traces, 3) == 1.033
    assert round(summary["torch-expandable"].geomean_b_traces, 3) == 1.010
    assert round(summary["torch"].multistream_a, 3) == 1.483 and round(summary["torch-expandable"].multistream_a, 3) == 1.455
    small = results["small_train.pickle d0"]
    assert round(small["torch"].a, 3) == 1.164 and round(small["torch-expandable"].a, 3) == 1.169
