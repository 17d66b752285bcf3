"""Replay throughput: one recorded allocation program, replayed three ways, interleaved in one run.

    python benchmarks/bench_replay.py [--quick]      # prints the figures as JSON

The program is amem's synthetic training pattern (amem_alloc.workloads.training_events: a GPT-style
decoder's activations, gradients and Adam states, with a random sequence length each step). It is
replayed by

* `model`:  the pure-Python reference model of the policy (tests/reference_model.py), the oracle
            the property tests check the core against — plain lists and linear scans;
* `python`: a Python loop calling Allocator("sim").malloc/free per event (the binding's cost);
* `core`:   the C++ replay loop (amem_alloc.replay.replay_program -> csrc/core/replay.cpp),
            the engine `amem replay` uses.

Each repetition times every variant once, in turn; a sample is events per second. The core loop
runs the program several times per sample (each on a fresh allocator) so a sample lasts long enough
to time. All three must end at the same peak reserved bytes: the replay is checked, not only timed.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # reference_model.py lives with the tests it serves

from reference_model import ReferenceAllocator  # noqa: E402

from amem_alloc import Allocator  # noqa: E402
from amem_alloc.workloads import training_events  # noqa: E402


def replay_model(events: list) -> tuple[float, int]:
    """(seconds, peak reserved) of the reference model over the events."""
    model, address = ReferenceAllocator(), {}
    started = time.perf_counter()
    for action, key, size, stream in events:
        if action == "alloc":
            address[key] = model.malloc(size, stream)
        else:
            model.free(address.pop(key))
    return time.perf_counter() - started, model.memory_stats()["reserved_bytes.all.peak"]


def replay_python(events: list) -> tuple[float, int]:
    """(seconds, peak reserved) of a Python loop over Allocator("sim")."""
    alloc, address = Allocator("sim"), {}
    malloc, free = alloc.malloc, alloc.free
    started = time.perf_counter()
    for action, key, size, stream in events:
        if action == "alloc":
            address[key] = malloc(size, stream)
        else:
            free(address.pop(key))
    return time.perf_counter() - started, alloc.memory_stats()["reserved_bytes.all.peak"]


def replay_core(program_bytes: bytes, times: int) -> tuple[float, int]:
    """(seconds per run, peak reserved) of the C++ replay loop, `times` runs on fresh allocators."""
    from amem_alloc.replay import replay_program

    seconds, peak = 0.0, 0
    for _ in range(times):
        result = replay_program(program_bytes)
        seconds += result["seconds"]
        peak = result["peak_reserved"]
    return seconds / times, peak


def measure(quick: bool = False, reps: int | None = None) -> dict:
    from amem_alloc.replay import program_from_events

    reps = reps or (2 if quick else 7)
    events = list(training_events(steps=4 if quick else 40, seed=0))
    program = program_from_events(events).to_bytes()
    core_times = 5 if quick else 20
    samples: dict[str, list[float]] = {"model": [], "python": [], "core": []}
    peaks: dict[str, int] = {}
    replay_model(events[: len(events) // 4])  # warm-up
    for _ in range(reps):
        for name, run in (("model", lambda: replay_model(events)), ("python", lambda: replay_python(events)),
                          ("core", lambda: replay_core(program, core_times))):
            seconds, peaks[name] = run()
            samples[name].append(len(events) / seconds)
    if len(set(peaks.values())) != 1:
        raise AssertionError(f"the replays disagree on the peak reserved bytes: {peaks}")
    figures = [{"id": f"replay.{name}", "unit": "events/s", "iterations": len(events), "samples": s}
               for name, s in samples.items()]
    return {"events": len(events), "peak_reserved": peaks["core"], "figures": figures}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short program, two repetitions (a smoke run)")
    parser.add_argument("--reps", type=int, default=None)
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.quick, args.reps)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
