"""The benchmarks are not part of the test run, but a quick smoke of each is, so they cannot rot:
`benchmarks/run.py --quick` builds the C++ benchmark program, runs every benchmark briefly and
prints the results table with every ratio. It judges no speed (a loaded CI machine proves
nothing about speed) and writes no results file."""
from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

from helpers import ROOT, run_command


def test_every_benchmark_runs_and_prints_its_ratios(tmp_path):
    proc = run_command([sys.executable, str(ROOT / "benchmarks" / "run.py"), "--quick",
                        "--build-dir", str(ROOT / "build" / "bench")], timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    table = proc.stdout
    for figure in ("Hot path: cached malloc+free pair, sim backend", "Hot path: cached malloc+free pair, host backend",
                   "Free holes: 64k vs 10", "Threads: throughput with 8 threads", "Recording: pair with",
                   "Pending events", "Replay throughput: the C++ replay loop", "GPU: torch.empty/del loop",
                   "GPU: training step", "Prediction at scale"):
        assert figure in table, f"{figure!r} missing from:\n{table}"
    ratios = re.findall(r"(\d+(?:\.\d+)?)×", table)  # holes, threads, recording, pending, replay
    assert len(ratios) >= 9 and all(float(r) > 0 for r in ratios), table
    assert "| misses |" not in table and "| meets |" not in table, "--quick must not judge speed"
    assert "torch" in table and "Machine:" in table
    # the fragmentation benchmark: every policy's (a) / (b) / (c) on two small traces (where the
    # shared traces are present) and one short recorded workload
    from amem_alloc import policies

    assert "## Fragmentation" in table and "| workload:serving |" in table, table
    frag = table.split("## Fragmentation", 1)[1]
    for name in policies.POLICIES:
        assert f"| {name} |" in frag, name
    cells = re.findall(r"(\d\.\d{3}) / (\d\.\d{3}) / (\d+)", frag)
    assert cells and all(float(a) >= 1 and float(b) >= 1 and float(b) <= float(a) + 1e-9 for a, b, _ in cells), frag
    if shutil.which("valgrind") and shutil.which("callgrind_annotate"):  # the hot path's profile
        assert "| free index: std::set" in table and "| total |" in table, table


def test_bench_stacks_quick_prints_its_ratios():
    import subprocess
    import sys

    script = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_stacks.py"
    out = subprocess.run([sys.executable, str(script), "--pairs", "200", "--reps", "1"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "| on+stacks |" in out.stdout and "x |" in out.stdout


def test_bench_traced_quick_checks_and_times_both_loops(tmp_path):
    from amem_alloc import replay

    saved = replay.Program(replay.pack([(replay.ALLOC, 1, 4096, 0), (replay.FREE, 2, 0, 0), (replay.RELEASE, 0, 0, 0),
                                        (replay.ALLOC, 1, 3 << 20, 7)])).save(tmp_path / "p.npz")
    for args in (["--quick"], ["--program", str(saved), "--start", "1", "--reps", "2"]):
        out = _bench("bench_traced.py", *args)
        assert out.returncode == 0, out.stderr[-3000:]
        assert "| replay |" in out.stdout and "| snapshot |" in out.stdout and "x |" in out.stdout, out.stdout


def test_bench_predict_gpu_skips_cleanly_without_a_gpu(tmp_path):
    import os
    import subprocess
    import sys

    if any(os.path.exists(p) for p in ("/dev/nvidiactl", "/proc/driver/nvidia")):
        import pytest

        pytest.skip("a GPU machine: the script runs for real there")
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_predict_gpu.py"
    out = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "skipped: no CUDA device", (out.stdout, out.stderr)


def _bench(name: str, *args: str):
    script = Path(__file__).resolve().parent.parent / "benchmarks" / name
    return run_command([sys.executable, str(script), *args], timeout=600)


def test_prediction_benchmarks_run_small():
    """The prediction benchmarks of amem fit and of distributed jobs, on their small configurations:
    each completes and prints its figures (they judge nothing and write no results file here)."""
    fit = _bench("bench_fit.py", "--quick")
    assert fit.returncode == 0, fit.stderr[-3000:]
    assert "predictions (trials)" in fit.stdout and "| amem |" in fit.stdout, fit.stdout
    ranks = _bench("bench_predict_fsdp.py", "--config", "tiny", "--ranks", "2")
    assert ranks.returncode == 0, ranks.stderr[-3000:]
    assert "distinct rank programs" in ranks.stdout and "GiB" in ranks.stdout, ranks.stdout
    tracker = _bench("bench_fsdp_tracker.py", "--config", "tiny", "--world", "2")
    assert tracker.returncode == 0, tracker.stderr[-3000:]
    assert "FSDPMemTracker" in tracker.stdout and "%" in tracker.stdout, tracker.stdout


def test_compile_benchmark_runs_small(tmp_path):
    """benchmarks/bench_predict_compile.py --quick: the small MLP predicted eager and compiled side
    by side, both complete, the compiled one says its region is predicted as compiled, and the
    ratios are printed (no speed is judged here)."""
    import json

    rows = tmp_path / "rows.json"
    proc = _bench("bench_predict_compile.py", "--quick", "--json", str(rows))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (row,) = json.loads(rows.read_text())
    assert row["eager"]["exit"] == 0 and row["compiled"]["exit"] == 0, row
    assert row["eager"]["compiled"] == [], row
    assert [w.split(":")[0] for w in row["compiled"]["compiled"]] == ["torch.compile region Sequential"], row
    assert "predicted as compiled (inductor)" in row["compiled"]["compiled"][0], row
    assert row["wall_ratio"] > 0 and row["cpu_ratio"] > 0 and "| mlp |" in proc.stdout, proc.stdout
    again = row["compiled_again"]   # the second compiled run, with the wrappers the first kept
    assert again["exit"] == 0 and again["peak_allocated"] == row["compiled"]["peak_allocated"], row
    assert "predicted as compiled (inductor)" in again["compiled"][0] and row["wall_ratio_again"] > 0, row
