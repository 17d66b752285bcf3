"""Recording cost seen from Python, with and without Python stacks (issue 4).

Times Allocator.malloc+free pairs on the host backend from Python, three variants interleaved
in one run: recording off, recording on without stacks, recording on with stacks="python".
Prints medians of per-repetition times and the ratios against "off".

    python benchmarks/bench_stacks.py [--pairs N] [--reps R]
"""
import argparse
import statistics
import time

from amem_alloc import Allocator


def pairs_per_call(alloc: Allocator, pairs: int) -> float:
    started = time.perf_counter()
    for _ in range(pairs):
        alloc.free(alloc.malloc(1000))
    return (time.perf_counter() - started) / pairs * 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=20000)
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    variants = {"off": Allocator("host"), "on": Allocator("host"), "on+stacks": Allocator("host")}
    variants["on"].record(max_entries=1 << 16)
    times = {name: [] for name in variants}
    for _ in range(args.reps):
        for name, alloc in variants.items():  # interleaved: the machine's noise hits all alike
            if name == "on+stacks":  # the stack capturer is process-wide: on only while timing this one
                alloc.record(max_entries=1 << 16, stacks="python")
            times[name].append(pairs_per_call(alloc, args.pairs))
            if name == "on+stacks":
                alloc.record(enabled=False)
    base = statistics.median(times["off"])
    print("| variant | ns per malloc+free pair from Python | ratio to off |")
    print("|---|---|---|")
    for name, ts in times.items():
        print(f"| {name} | {statistics.median(ts):.0f} | {statistics.median(ts) / base:.2f}x |")


if __name__ == "__main__":
    main()
