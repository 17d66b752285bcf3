"""Every allocator benchmark in one command, and one table of the figures and ratios measured in it.

    python benchmarks/run.py            # (make bench) full run; writes benchmarks/RESULTS.md
    python benchmarks/run.py --quick    # CI smoke: a few seconds each; checks that every program
                                        # runs and prints its ratios; judges no speed, writes nothing

What runs (each program's docstring says how it measures):

  benchmarks/bench_core.cpp   the C++ core called directly (built here as `amem_bench`): the hot
                              malloc+free pair on the host and sim backends, the pair with 10 / 1k /
                              64k free holes in the pool, 1-8 threads, recording on vs off, the
                              pair while freed blocks wait on stream events
  benchmarks/bench_replay.py  replay throughput: the Python reference model, a Python loop over
                              the core, and the C++ replay loop, on one training program
  benchmarks/bench_gpu.py     amem vs torch's native allocator on a GPU (skipped, with the reason,
                              where torch sees no CUDA device)
  benchmarks/bench_fragmentation.py  memory beyond what programs ask for, per policy, over every
                              shared trace and bundled workload (its own section of RESULTS.md,
                              between its own markers; --quick: two small traces, one short workload)
  benchmarks/bench_predict.py a LLaMA-7B training step predicted without a GPU: wall time and peak
                              RSS of the predicting process (--quick: a tiny config); its own
                              RESULTS.md section is written by `bench_predict.py --write`

Within each figure the variants are interleaved repetition by repetition, so a ratio compares
numbers taken side by side. A value is the median over repetitions; a ratio is the median of the
per-repetition ratios. RESULTS.md keeps every other section as it is and rewrites only the one
between this program's markers.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import tempfile
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from results_file import cpu_model, replace_section  # noqa: E402  (benchmarks/ is on sys.path)

RESULTS = HERE / "RESULTS.md"
BEGIN = "<!-- BEGIN allocator benchmarks (issue 7): written by `python benchmarks/run.py`; do not edit inside -->"
END = "<!-- END allocator benchmarks (issue 7) -->"


# ============================================================================ building and running


def _tool(name: str) -> str:
    """A build tool from PATH, else from this interpreter's environment (the venv's cmake, ninja)."""
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if not found:
        raise SystemExit(f"run.py: {name} not found; run `make setup` (it installs cmake and ninja in .venv)")
    return found


def build_bench(build_dir: Path) -> Path:
    """Configures (once) and builds the amem_bench target; returns the program's path."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    cache = _cache(build_dir)
    if not (build_dir / "build.ninja").exists() or "AMEM_BUILD_BENCHMARKS:BOOL=ON" not in cache \
            or "CMAKE_CXX_FLAGS:STRING=-g\n" not in cache:
        subprocess.run([_tool("cmake"), "-S", str(ROOT), "-B", str(build_dir), "-G", "Ninja",
                        "-DAMEM_BUILD_PYTHON=OFF", "-DAMEM_BUILD_BENCHMARKS=ON", "-DCMAKE_BUILD_TYPE=Release",
                        "-DCMAKE_CXX_FLAGS=-g"],  # -g: same code, and callgrind can tell inlined files apart
                       check=True, env=env, stdout=subprocess.DEVNULL)
    subprocess.run([_tool("cmake"), "--build", str(build_dir), "--target", "amem_bench"], check=True, env=env,
                   stdout=subprocess.DEVNULL)
    return build_dir / "amem_bench"


def _cache(build_dir: Path) -> str:
    cache = build_dir / "CMakeCache.txt"
    return cache.read_text() if cache.exists() else ""


def run_core(program: Path, quick: bool) -> dict:
    proc = subprocess.run([str(program), *(["--quick"] if quick else [])], capture_output=True, text=True,
                          check=True, timeout=1800)
    return json.loads(proc.stdout)


# ============================================================================ figures and ratios


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def ratios(num: list[float], den: list[float]) -> list[float]:
    return [a / b for a, b in zip(num, den)]


def paired_ratio(num: list[float], den: list[float]) -> float:
    """The median of the per-repetition ratios (the two lists were measured interleaved)."""
    return median(ratios(num, den))


def iqr(xs: list[float], digits: int = 1) -> str:
    """The middle half of the samples, "q1–q3": how much the machine moved the figure."""
    if len(xs) < 4:
        return "n/a"
    q1, _, q3 = statistics.quantiles(xs, n=4)
    return f"{q1:.{digits}f}–{q3:.{digits}f}"


def times(r: float) -> str:
    return f"{r:.2f}×" if r < 10 else f"{r:.0f}×"


@dataclass
class Row:
    figure: str
    value: str
    target: str = "—"
    verdict: str = "—"


def judge(value: float, limit: float | None, quick: bool) -> str:
    if limit is None:
        return "—"
    if quick:
        return "not judged (--quick)"
    return "meets" if value <= limit else "misses"


def rows_for(samples: dict[str, list[float]], quick: bool, skipped_gpu: str | None) -> list[Row]:
    s = samples
    rows: list[Row] = []
    for backend in ("sim", "host"):
        for size, label in (("small", "1000 B"), ("large", "3 MiB")):
            xs = s[f"hot_path.{backend}.{size}"]
            v = median(xs)
            rows.append(Row(f"Hot path: cached malloc+free pair, {backend} backend, {label}",
                            f"{v:.1f} ns (IQR {iqr(xs)})",
                            "≤ 60 ns", judge(v, 60, quick)))
    base = median(s["holes.10"])
    rows.append(Row("Free holes: the pair with 10 free blocks in the pool", f"{base:.1f} ns"))
    for n, label in (("1000", "1k"), ("65536", "64k")):
        r = paired_ratio(s[f"holes.{n}"], s["holes.10"])
        target = 2.0 if n == "65536" else None
        rows.append(Row(f"Free holes: {label} vs 10 free blocks",
                        f"{times(r)} (IQR {iqr(ratios(s[f'holes.{n}'], s['holes.10']), 2)}; "
                        f"{median(s[f'holes.{n}']):.1f} ns)",
                        "≤ 2×" if target else "—", judge(r, target, quick)))
    r = paired_ratio(s["holes_spread.65536"], s["holes_spread.10"])
    rows.append(Row("Free holes: 64k vs 10, the pairs cycling through 10 holes spread over the index",
                    f"{times(r)} (IQR {iqr(ratios(s['holes_spread.65536'], s['holes_spread.10']), 2)}; "
                    f"{median(s['holes_spread.65536']):.1f} vs {median(s['holes_spread.10']):.1f} ns)"))
    one = s["threads.1"]
    for n in ("1", "2", "4", "8"):
        rate = 1e3 / median(s[f"threads.{n}"])  # pairs per µs = M pairs/s
        ratio = paired_ratio(one, s[f"threads.{n}"])  # throughput ratio = time ratio inverted
        rows.append(Row(f"Threads: throughput with {n} thread{'s' if n != '1' else ''} (own streams, one allocator)",
                        f"{rate:.2f} M pairs/s ({ratio:.2f}× of 1 thread)"))
    off, on = s["recording.off"], s["recording.on"]
    r = paired_ratio(on, off)
    rows.append(Row("Recording: pair with start_trace(65536) on vs off, host backend",
                    f"{times(r)} (IQR {iqr(ratios(on, off), 2)}; {median(on):.1f} vs {median(off):.1f} ns)", "≤ 1.2×",
                    judge(r, 1.2, quick)))
    added = (median(on) - median(off)) / 2  # a pair is two allocator calls
    rows.append(Row("Recording: added per allocator call (3 events per pair, one timestamp per call)",
                    f"{added:.1f} ns, of which one read of the time-stamp counter {median(s['recording.clock']):.1f} ns"))
    r = paired_ratio(s["pending.1000"], s["pending.0"])
    rows.append(Row("Pending events: pair while 1000 freed blocks wait on a busy stream vs none, sim",
                    f"{times(r)} ({median(s['pending.1000']):.1f} vs {median(s['pending.0']):.1f} ns)"))
    for name, label in (("model", "the Python reference model"), ("python", "a Python loop over the core"),
                        ("core", "the C++ replay loop")):
        rows.append(Row(f"Replay throughput: {label}", f"{median(s[f'replay.{name}']) / 1e6:.3f} M events/s"))
    rows.append(Row("Replay throughput: C++ loop vs Python model",
                    times(paired_ratio(s['replay.core'], s['replay.model']))))
    for key, label in (("empty_del", "torch.empty/del loop of mixed sizes"), ("train_step", "training step, small MLP")):
        if skipped_gpu:
            rows.append(Row(f"GPU: {label}, amem vs native", f"skipped: {skipped_gpu}", "≤ 1.05×", "skipped"))
            continue
        amem, native = s[f"gpu.{key}.amem"], s[f"gpu.{key}.native"]
        r = paired_ratio(amem, native)
        unit = "ns" if key == "empty_del" else "ms"
        rows.append(Row(f"GPU: {label}, amem vs native",
                        f"{r:.3f}× (IQR {iqr(ratios(amem, native), 3)}; {median(amem):.1f} vs {median(native):.1f} {unit})",
                        "≤ 1.05×", judge(r, 1.05, quick)))
    return rows


# ============================================================================ where the time goes

# Where the hot pair's instructions go, by the kind of work. amem_bench is built with -g (which
# does not change the generated code), so callgrind attributes inlined code to the file it came
# from: stats.h is the counters, stl_tree.h the free index, and so on. Matched on "file:function".
CATEGORIES = [
    ("free index: std::set lookup, insert, erase, rebalance; exact-size table", re.compile(r"stl_tree|_Rb_tree|block\.(cpp|h):|BlockPool::")),
    ("lock: AllocatorLock (futex) lock and unlock", re.compile(r"pthread_mutex|gthr|allocator_lock|atomic_base")),
    ("address map: allocated blocks by address", re.compile(r"address_map|AddressMap|hashtable|unordered_map")),
    ("stats: counters (current, peak, allocated, freed)", re.compile(r"stats\.h:")),
    ("heap: malloc, free, new, delete", re.compile(r"(?<!:):(malloc|free|cfree|_int_free|_int_malloc|operator new|operator delete)\b")),
    ("rounding: round_size, divisions_for", re.compile(r"size_policy|options\.(cpp|h):|round_size|divisions_for")),
    ("benchmark loop", re.compile(r"bench_core\.cpp:")),
    ("allocator: malloc, free, best fit, split, merge, block recycling", re.compile(r"CachingAllocator::|caching_allocator|stl_vector|new_allocator")),
]
LINE = re.compile(r"^\s*([\d,]+) \([^)]*\)\s+(.*?)(?: \[[^\]]*\])?$")


def _callgrind(program: Path, pairs: int, out: Path) -> dict[str, int]:
    subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", str(program),
                    "--profile-hot", str(pairs)], check=True, capture_output=True)
    text = subprocess.run(["callgrind_annotate", "--inclusive=no", "--auto=no", "--threshold=100", str(out)],
                          check=True, capture_output=True, text=True).stdout
    costs: dict[str, int] = {}
    for line in text.splitlines():
        m = LINE.match(line)
        if m and "PROGRAM TOTALS" not in line:  # group 2 is "file:function"
            costs[m.group(2)] = costs.get(m.group(2), 0) + int(m.group(1).replace(",", ""))
    return costs


def profile_hot_path(program: Path, tmp: Path, quick: bool = False) -> list[tuple[str, float]] | None:
    """Instructions per hot pair (sim, 1000 B) by category: callgrind at two run lengths, the
    difference divided by the extra pairs, so setup and exit cancel out. None without valgrind."""
    if not shutil.which("valgrind") or not shutil.which("callgrind_annotate"):
        return None
    short, long = (5_000, 25_000) if quick else (50_000, 250_000)
    a = _callgrind(program, short, tmp / "short.callgrind")
    b = _callgrind(program, long, tmp / "long.callgrind")
    per_pair = {fn: (b.get(fn, 0) - a.get(fn, 0)) / (long - short) for fn in b}
    totals = {name: 0.0 for name, _ in CATEGORIES}
    totals["other"] = 0.0
    for fn, cost in per_pair.items():
        name = next((n for n, pattern in CATEGORIES if pattern.search(fn)), "other")
        if os.environ.get("AMEM_BENCH_DEBUG_PROFILE") and abs(cost) >= 1:
            print(f"{cost:8.1f}  {name[:12]:12}  {fn[:150]}", file=sys.stderr)
        totals[name] += cost
    return [(name, cost) for name, cost in totals.items() if cost >= 0.5]


# ============================================================================ the report


def machine() -> dict[str, str]:
    import torch

    model = cpu_model()
    mem = next((int(l.split()[1]) for l in Path("/proc/meminfo").read_text().splitlines() if l.startswith("MemTotal")), 0)
    compiler = subprocess.run(["c++", "--version"], capture_output=True, text=True).stdout.splitlines()
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "csrc", "CMakeLists.txt"],
                           capture_output=True, text=True).stdout.strip()
    return {
        "cpu": f"{model}, {os.cpu_count()} cores, {mem / 2**20:.1f} GiB memory",
        "os": f"{platform.system()} {platform.release()}",
        "compiler": (compiler[0] if compiler else "unknown") + ", CMake Release (-O3)",
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none (no CUDA device)",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "code": (commit.stdout.strip() or "unknown") + (" with uncommitted changes in csrc/" if dirty else ""),
        "date": datetime.date.today().isoformat(),
    }


def loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "?"


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return 0.0


def render(rows: list[Row], info: dict[str, str], command: str, reps: int, load: tuple[str, str],
           profile: list[tuple[str, float]] | None = None) -> str:
    lines = [
        "## Allocator benchmarks (issue 7)",
        "",
        f"Measured on {info['date']} with `{command}`; every figure below comes from that one run.",
        "",
        f"- Machine: {info['cpu']}; {info['os']}; {info['compiler']}",
        f"- Device: {info['device']}",
        f"- torch {info['torch']}, Python {info['python']}; code at {info['code']}",
        f"- Load average (1 min) before / after the run: {load[0]} / {load[1]} on {os.cpu_count()} cores",
        f"- Method: {reps} repetitions after a warm-up; the variants of a figure are interleaved; a value is",
        "  the median, a ratio the median of the per-repetition ratios, IQR the middle half of the",
        "  samples (see benchmarks/run.py)",
    ]
    busy = max(_number(x) for x in load)
    if busy >= 0.5:
        lines += [f"- Note: other work was running (load average up to {busy:.2f} on {os.cpu_count()} cores):",
                  "  absolute times are inflated and the thread figures depend on how many cores were free;",
                  "  ratios of interleaved variants are affected least"]
    lines += [
        "",
        "| figure | value | target | verdict |",
        "|---|---|---|---|",
    ]
    lines += [f"| {r.figure} | {r.value} | {r.target} | {r.verdict} |" for r in rows]
    if profile:
        total = sum(cost for _, cost in profile)
        lines += ["", "Where the hot path goes: instructions per malloc+free pair (sim backend, 1000 B), counted",
                  "by callgrind in the same build (two run lengths, the difference per extra pair; code",
                  "inlined into a function counts for it). Instructions, not time: a guide to what to cut.",
                  "", "| work | instructions per pair | share |", "|---|---|---|"]
        lines += [f"| {name} | {cost:.0f} | {cost / total:.0%} |" for name, cost in sorted(profile, key=lambda p: -p[1])]
        lines += [f"| total | {total:.0f} | 100% |"]
    return "\n".join(lines) + "\n"


def write_results(section: str, path: Path = RESULTS) -> None:
    """Replaces this program's section of RESULTS.md (between the markers); keeps everything else."""
    replace_section(path, BEGIN, END, section)


# ============================================================================ main


def prediction_rows(r: dict, quick: bool) -> list[Row]:
    """bench_predict's two judged figures (a tiny config under --quick)."""
    if "error" in r:
        return [Row("Prediction at scale: LLaMA-7B training step", f"failed: {r['error']}", "< 60 s", "misses")]
    what = "LLaMA-7B training step" if r["config"] == "7b" else "tiny LLaMA step (--quick)"
    return [Row(f"Prediction at scale: {what}, wall time", f"{r['seconds']:.1f} s", "< 60 s",
                judge(r["seconds"], 60, quick)),
            Row(f"Prediction at scale: {what}, peak RSS", f"{r['maxrss'] / (1 << 30):.2f} GiB", "< 4 GiB",
                judge(r["maxrss"] / (1 << 30), 4, quick))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: short, judges nothing, writes nothing")
    parser.add_argument("--build-dir", type=Path, default=ROOT / "build" / "bench",
                        help="where amem_bench is built (default build/bench)")
    parser.add_argument("--output", type=Path, default=None,
                        help="results file to update (default benchmarks/RESULTS.md; none with --quick)")
    parser.add_argument("--no-write", action="store_true", help="print the table only")
    args = parser.parse_args(argv)

    import bench_fragmentation
    import bench_gpu
    import bench_predict
    import bench_replay

    load_before = loadavg()
    print("building amem_bench ...", file=sys.stderr, flush=True)
    program = build_bench(args.build_dir)
    print("running the C++ core benchmarks ...", file=sys.stderr, flush=True)
    core = run_core(program, args.quick)
    print("running the replay benchmarks ...", file=sys.stderr, flush=True)
    replay = bench_replay.measure(args.quick)
    print("running the GPU benchmarks ...", file=sys.stderr, flush=True)
    gpu = bench_gpu.measure(args.quick)
    print("running the prediction benchmark ...", file=sys.stderr, flush=True)
    predicted = bench_predict.measure(args.quick)
    load_after = loadavg()
    print("profiling the hot path with callgrind ...", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        profile = profile_hot_path(program, Path(tmp), args.quick)

    print("running the fragmentation benchmark ...", file=sys.stderr, flush=True)
    fragmentation = bench_fragmentation.run(args.quick)

    samples = {f["id"]: f["samples"] for f in core["figures"] + replay["figures"] + gpu["figures"]}
    rows = rows_for(samples, args.quick, gpu.get("skipped")) + prediction_rows(predicted, args.quick)
    command = "python benchmarks/run.py" + (" --quick" if args.quick else "")
    section = render(rows, machine(), command, core["reps"], (load_before, load_after), profile)
    print(section)
    print(fragmentation)
    output = args.output or (None if args.quick else RESULTS)
    if output and not args.no_write:
        write_results(section, output)
        bench_fragmentation.write_section(fragmentation, output)
        print(f"wrote {output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
