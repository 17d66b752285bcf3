"""`amem demo`: a realistic training pattern through the core on a CPU; stats and fragmentation."""
from __future__ import annotations

import argparse
import time

from . import parser


def command(args: argparse.Namespace) -> int:
    from ..allocator import Allocator
    from ..introspection import format_bytes, summary
    from ..workloads import training_events

    alloc = Allocator(backend=args.backend, limit_bytes=args.limit_gb << 30)
    live: dict[int, int] = {}
    started = time.perf_counter()
    events = 0
    for action, tid, size, stream in training_events(steps=args.steps, seed=args.seed):
        events += 1
        if action == "alloc":
            live[tid] = alloc.malloc(size, stream)
        else:
            alloc.free(live.pop(tid))
    elapsed = time.perf_counter() - started
    alloc.check_valid()
    stats, frag = alloc.memory_stats(), alloc.fragmentation()
    print(f"amem demo: GPT-style training, {args.steps} steps with random sequence lengths, "
          f"on the {alloc.backend} backend ({'addresses only' if alloc.backend == 'sim' else 'host memory'})")
    print(f"{events} allocator calls in {elapsed:.2f} s; {len(live)} tensors live at the end "
          f"({format_bytes(stats['allocated_bytes.all.current'])})\n")
    print(summary(stats, frag))
    return 0


def add(sub: argparse._SubParsersAction) -> None:
    demo = sub.add_parser("demo", help="allocate a realistic training pattern and print stats and fragmentation")
    demo.add_argument("--backend", choices=("sim", "host"), default="sim")
    demo.add_argument("--steps", type=parser.positive_int, default=20)
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--limit-gb", type=parser.whole_gb, default=80, help="simulated device capacity in GiB (0: unlimited)")
    demo.set_defaults(func=command)
