"""The fragmentation benchmark's measures: the limit (peak live requested bytes), the empty
start, the smallest OOM-free capacity, and, on the shared real traces, the torch and
torch-expandable figures the benchmark's table starts from and amem's policy held to the
benchmark's bar: per case no worse than the better of the two (+0.5%)."""
import os
import subprocess
import sys

import pytest

from amem_alloc import policies, replay, workloads
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


_TRACE_RESULTS = []


def _shared_trace_results():
    """torch, torch-expandable and amem on every shared trace-device (measured once per session)."""
    if not _TRACE_RESULTS:
        cases = bf.trace_cases()
        _TRACE_RESULTS.append((cases, bf.measure_all(cases, ["torch", "torch-expandable", "amem"])))
    return _TRACE_RESULTS[0]


def _assert_the_per_case_bar(case_name, per_policy):
    """amem's (a), (b) within 0.5% of the better of torch and torch-expandable on this case, each
    measure apart, and its device calls at most twice torch-expandable's."""
    r, torch, expandable = per_policy["amem"], per_policy["torch"], per_policy["torch-expandable"]
    assert r.a <= min(torch.a, expandable.a) * 1.005, (case_name, r.a, torch.a, expandable.a)
    assert r.b <= min(torch.b, expandable.b) * 1.005, (case_name, r.b, torch.b, expandable.b)
    assert r.total_calls <= 2 * expandable.total_calls, (case_name, r.total_calls, expandable.total_calls)
    assert bf.row_verdict(r, per_policy)[0], case_name  # the benchmark's own verdict agrees


def test_row_verdict_takes_the_better_native_per_measure():
    def result(name, a, b, calls):
        return bf.Result(name, int(a * 100), int(b * 100), {"cudaMalloc": calls, "map": 0, "unmap": 0,
                                                              "cudaFree": 0}, 100)
    per = {"torch": result("torch", 1.10, 1.00, 10), "torch-expandable": result("torch-expandable", 1.00, 1.10, 10)}
    assert bf.row_verdict(result("amem", 1.00, 1.00, 20), per)[0]
    ok, why = bf.row_verdict(result("amem", 1.02, 1.00, 20), per)  # worse than expandable's (a)
    assert not ok and why == ["(a) 1.020 > 1.005"]
    ok, why = bf.row_verdict(result("amem", 1.00, 1.02, 21), per)  # worse than torch's (b), too many calls
    assert not ok and why == ["(b) 1.020 > 1.005", "(c) 21 > 20"]


@pytest.mark.skipif(not bf.TRACES.is_dir(), reason="../shared/traces is not present")
def test_amem_is_never_worse_than_the_better_native_on_the_shared_traces():
    cases, results = _shared_trace_results()
    for case in cases:
        _assert_the_per_case_bar(case.name, results[case.name])
    summary = {s.policy: s for s in bf.summarize(cases, results, ["torch", "torch-expandable", "amem"])}
    assert summary["amem"].geomean_a_traces <= bf.GEOMEAN_BAR == 1.02
    assert summary["amem"].multistream_a <= bf.MULTISTREAM_BAR == 1.05
    assert summary["amem"].verdict == "meets" and summary["amem"].rows_met == len(cases)


# The bundled workloads, recorded on the CPU (minutes): the same bar per workload; a miss measured
# and listed in bench_fragmentation.KNOWN_MISSES is an expected failure with its figure.
def _known_miss_marks(case_name):
    """A strict expected failure where the benchmark lists amem's miss on this case."""
    why = bf.KNOWN_MISSES.get(("amem", case_name))
    return [pytest.mark.xfail(strict=True, reason=why)] if why else []


WORKLOADS = [name for name in workloads.WORKLOADS if name not in bf.NOT_ON_CPU]


@pytest.mark.slow
@pytest.mark.parametrize("name", [pytest.param(n, marks=_known_miss_marks(f"workload:{n}")) for n in WORKLOADS])
def test_amem_is_never_worse_than_the_better_native_on_each_workload(name, tmp_path):
    case = _workload_case(name, tmp_path)
    per = {n: bf.measure(case, policies.get(n)) for n in ("torch", "torch-expandable", "amem")}
    _assert_the_per_case_bar(case.name, per)


def _workload_case(name, tmp_path):
    """One workload recorded as the benchmark records it (a fresh process), at its benchmark size."""
    size = bf.BENCH_SIZES.get(name, 1)
    path = tmp_path / f"{name}.npz"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_fragmentation.py"), "--record", name,
                    "--size", str(size), "--out", str(path)], check=True, capture_output=True,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    return bf.Case(f"workload:{name}", "workload", replay.Program.load(path))


def test_the_demo_program_meets_the_bar(tmp_path):
    """`make demo`'s program (the GPT workload at size 1, predicted on fake CUDA as `amem compare`
    records it): amem reserves less than torch (120 against 122 MiB; torch-expandable 138) and
    meets the per-case bar."""
    (case,) = bf.predicted_cases(quick=True, tmp=tmp_path)
    assert case.name == "predicted:gpt" and bf.QUICK_PREDICTED == "gpt"
    per = {n: bf.measure(case, policies.get(n)) for n in ("torch", "torch-expandable", "amem")}
    assert [per[n].peak_reserved // MiB for n in ("torch", "torch-expandable", "amem")] == [122, 138, 120]
    _assert_the_per_case_bar(case.name, per)


@pytest.mark.slow
@pytest.mark.parametrize("name", [pytest.param(n, marks=_known_miss_marks(f"predicted:{n}"))
                                  for n in workloads.WORKLOADS if n not in bf.NOT_PREDICTED])
def test_amem_is_never_worse_than_the_better_native_on_each_predicted_workload(name, tmp_path):
    path = tmp_path / f"{name}.npz"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_fragmentation.py"), "--predict", name,
                    "--size", str(bf.PREDICTED_SIZE), "--out", str(path)], check=True, capture_output=True,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    case = bf.Case(f"predicted:{name}", "predicted", replay.Program.load(path))
    per = {n: bf.measure(case, policies.get(n)) for n in ("torch", "torch-expandable", "amem")}
    _assert_the_per_case_bar(case.name, per)


@pytest.mark.skipif(not bf.TRACES.is_dir(), reason="../shared/traces is not present")
def test_shared_traces_reproduce_the_reference_figures():
    """torch and torch-expandable from an empty start on the 12 trace-devices: geomean (a) 1.088 /
    1.058, (b) 1.035 / 1.009; multistream_4dev (a) 1.483 / 1.455; small_train (a) 1.164 / 1.169.
    (1.084 / 1.059 and 1.033 / 1.010 while simulated segment addresses ascended: Note [segment
    addresses descend] in csrc/backends/sim_backend.cpp.)"""
    cases, results = _shared_trace_results()
    assert len(cases) == 12
    summary = {s.policy: s for s in bf.summarize(cases, results, ["torch", "torch-expandable"])}
    assert round(summary["torch"].geomean_a_traces, 3) == 1.088
    assert round(summary["torch-expandable"].geomean_a_traces, 3) == 1.058
    assert round(summary["torch"].geomean_b_traces, 3) == 1.035
    assert round(summary["torch-expandable"].geomean_b_traces, 3) == 1.009
    assert round(summary["torch"].multistream_a, 3) == 1.483 and round(summary["torch-expandable"].multistream_a, 3) == 1.455
    small = results["small_train.pickle d0"]
    assert round(small["torch"].a, 3) == 1.164 and round(small["torch-expandable"].a, 3) == 1.169
