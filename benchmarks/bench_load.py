"""Loading a real trace: the bounded loader (issue 21) vs the loader before it, side by side.

Loads each shared trace with load_snapshot from --old-commit (git show, run in this process with
this build's extension) and from this tree, alternating, --reps times each; prints the best time
of each and the ratio. The new loader also scans the pickle's opcodes in C++, refuses shared
segments, blocks and events, and counts shared stacks against a budget.

    python benchmarks/bench_load.py [--reps 9] [--write]
"""
from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
import time
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))
from results_file import cpu_model, replace_section  # noqa: E402

BEGIN = "<!-- BEGIN trace loading benchmark (issue 21): written by `python benchmarks/bench_load.py --write` -->"
END = "<!-- END trace loading benchmark (issue 21) -->"
TRACES = ROOT.parent / "shared" / "traces"


def old_loader(commit: str):
    import amem_alloc.snapshot  # noqa: F401 - the package the old module's relative imports need

    source = subprocess.run(["git", "show", f"{commit}:amem_alloc/snapshot/load.py"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout
    module = types.ModuleType("amem_alloc.snapshot._old_load")
    module.__package__ = "amem_alloc.snapshot"
    exec(compile(source, "old load.py", "exec"), module.__dict__)
    return module.load_snapshot


def best(load, path: Path, reps: int) -> float:
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        load(path)
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--old-commit", default="96e1824")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    from amem_alloc.snapshot import load_snapshot

    old = old_loader(args.old_commit)
    rows = []
    for path in sorted(TRACES.glob("*.pickle")):
        o, n = [], []
        for _ in range(3):  # alternate the variants in rounds
            o.append(best(old, path, args.reps))
            n.append(best(load_snapshot, path, args.reps))
        rows.append((path.name, path.stat().st_size, min(o), min(n)))
        print(f"{path.name}: old {min(o) * 1000:.1f} ms, new {min(n) * 1000:.1f} ms", flush=True)
    table = "\n".join(f"| {name} | {size / 1e6:.2f} | {o * 1000:.1f} | {n * 1000:.1f} | {n / o:.2f}x |"
                      for name, size, o, n in rows)
    text = (f"## Loading a trace: bounded vs before (issue 21)\n\nMeasured {datetime.date.today()} on {cpu_model()} "
            f"({os.cpu_count()} cores) with `python benchmarks/bench_load.py --reps {args.reps}`: load_snapshot of "
            f"commit {args.old_commit} and of this tree in one process, alternating, the best of "
            f"{3 * args.reps} loads each.\n\n| trace | MB | before ms | bounded ms | ratio |\n|---|---|---|---|---|\n"
            f"{table}\n")
    print(text)
    if args.write:
        replace_section(HERE / "RESULTS.md", BEGIN, END, text)


if __name__ == "__main__":
    main()
