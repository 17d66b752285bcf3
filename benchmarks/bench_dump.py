"""The exit dump of a large trace with Python stacks (issue 21): old code vs new, side by side.

Records the same deterministic allocation pattern (`--events` allocator events, about a third
of them allocations, from `--stacks` distinct Python stacks of up to 100 frames) on the sim
backend with stacks="python", then times dump_snapshot alone: what AMEM_TRACE does at exit.
"old" is the tree at --old-commit (git archive) run with this build's extension, "new" is this
tree; each variant runs in a fresh process, the variants alternate repetition by repetition, and
both files are checked to load (with this tree's loader) with the same number of events.

    python benchmarks/bench_dump.py [--events 930000] [--stacks 100000] [--reps 1] [--write]
    python benchmarks/bench_dump.py --quick        # a few seconds: checks that it runs
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from results_file import cpu_model, replace_section  # noqa: E402

BEGIN = "<!-- BEGIN exit dump benchmark (issue 21): written by `python benchmarks/bench_dump.py --write` -->"
END = "<!-- END exit dump benchmark (issue 21) -->"

CHILD = textwrap.dedent("""
    import json, resource, sys, time
    from amem_alloc import Allocator, dump_snapshot
    events, stacks, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    import amem_alloc
    print(amem_alloc.__file__)
    a = Allocator(backend="sim", limit_bytes=1 << 44)
    a.record(max_entries=events + 4096, stacks="python")
    leaves = []
    for j in range(max(1, stacks // 97)):
        ns = {"a": a}
        exec("def leaf(size):\\n" + "\\n" * j + "    return a.malloc(size)\\n", ns)  # one line per leaf
        leaves.append(ns["leaf"])
    def deep(k, leaf, size):
        return deep(k - 1, leaf, size) if k else leaf(size)
    live, i = [], 0
    while i * 3 < events:
        live.append(deep(i % 97, leaves[(i * 31) % len(leaves)], ((i * 7919) % 50 + 1) << 16))
        if len(live) > 64:
            a.free(live.pop(0))
        i += 1
    started = time.perf_counter()
    dump_snapshot(out, allocator=a)
    seconds = time.perf_counter() - started
    print(json.dumps({"seconds": seconds, "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
""")


def old_tree(commit: str, where: Path) -> Path:
    """The package at `commit`, with this build's extension (the recording core is the same)."""
    archive = subprocess.run(["git", "archive", commit, "amem_alloc"], cwd=ROOT, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive.stdout, check=True)
    for so in (ROOT / "amem_alloc").glob("_C*.so"):
        shutil.copy2(so, where / "amem_alloc" / so.name)
    return where


def run_one(tree: Path, events: int, stacks: int, out: Path) -> dict:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("AMEM_")}, "PYTHONPATH": str(tree)}
    proc = subprocess.run([sys.executable, "-c", CHILD, str(events), str(stacks), str(out)], env=env,
                          capture_output=True, text=True, timeout=3600, cwd=out.parent)  # not this tree: -c puts
    # the working folder first on sys.path
    if proc.returncode != 0:
        raise SystemExit(f"bench_dump: the run in {tree} failed:\n{proc.stderr}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["package"] = proc.stdout.strip().splitlines()[0]
    result["mib"] = out.stat().st_size / (1 << 20)
    return result


def check_loads(path: Path) -> int:
    sys.path.insert(0, str(ROOT))
    from amem_alloc import load_snapshot

    return sum(len(t) for t in load_snapshot(path, max_bytes=4 << 30)["device_traces"])


def section(args: argparse.Namespace, runs: dict, counts: dict) -> str:
    old, new = (statistics.median(r["seconds"] for r in runs[v]) for v in ("old", "new"))
    rows = "\n".join(f"| {v} ({'commit ' + args.old_commit if v == 'old' else 'this tree'}) | "
                     f"{statistics.median(r['seconds'] for r in runs[v]):.1f} | "
                     f"{statistics.median(r['rss_mib'] for r in runs[v]):.0f} | {runs[v][0]['mib']:.0f} | "
                     f"{counts[v]:,} |" for v in ("old", "new"))
    return (f"## Exit dump of a large trace with stacks (issue 21)\n\n"
            f"Measured {datetime.date.today()} on {cpu_model()} ({os.cpu_count()} cores, no GPU) with "
            f"`python benchmarks/bench_dump.py --events {args.events} --stacks {args.stacks} --reps {args.reps}`: "
            f"{args.events:,} events recorded with stacks=\"python\" from about {args.stacks:,} distinct stacks "
            "of up to 100 frames, then dump_snapshot alone timed (what AMEM_TRACE does at exit), old and new "
            "each in a fresh process, alternating. Both files load with the same events.\n\n"
            "| variant | dump seconds | peak RSS MiB | file MiB | events |\n|---|---|---|---|---|\n"
            f"{rows}\n\nNew/old: {new / old:.2f}x the time. The new dump shares one dict per distinct frame and "
            "one list per stack across the whole process (pickle writes each once), and writes the snapshot "
            "it built without checking it a second time.\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=930_000)
    parser.add_argument("--stacks", type=int, default=100_000)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--old-commit", default="96e1824")
    parser.add_argument("--quick", action="store_true", help="a tiny run: checks that it works")
    parser.add_argument("--write", action="store_true", help="write the section of benchmarks/RESULTS.md")
    args = parser.parse_args()
    if args.quick:
        args.events, args.stacks, args.reps = 3000, 300, 1
    with tempfile.TemporaryDirectory(prefix="amem-bench-dump-") as tmp:
        (Path(tmp) / "old").mkdir()
        (Path(tmp) / "out").mkdir()
        trees = {"old": old_tree(args.old_commit, Path(tmp) / "old"), "new": ROOT}
        runs: dict = {"old": [], "new": []}
        counts = {}
        for rep in range(args.reps):
            for variant, tree in trees.items():
                out = Path(tmp) / "out" / f"{variant}.pickle"
                runs[variant].append(run_one(tree, args.events, args.stacks, out))
                counts[variant] = check_loads(out)
                print(f"{variant}: {runs[variant][-1]}", flush=True)
    text = section(args, runs, counts)
    print(text)
    if counts["old"] != counts["new"]:
        raise SystemExit(f"bench_dump: the dumps differ in events: {counts}")
    if args.write and not args.quick:
        replace_section(HERE / "RESULTS.md", BEGIN, END, text)


if __name__ == "__main__":
    main()
