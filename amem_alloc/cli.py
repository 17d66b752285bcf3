"""The `amem` command (also `python -m amem_alloc`).

    amem run script.py args...     run a script with amem as torch's CUDA allocator
    amem run -m module args...     the same for a module
    amem demo [--backend sim]      replay a realistic training pattern; print stats and fragmentation
    amem config                    the options table and the configuration in effect
"""
from __future__ import annotations

import argparse
import runpy
import sys
import time

from . import config as config_mod


def _run(args: argparse.Namespace) -> int:
    from .cuda import enable

    if not args.target:
        print("amem run: give a script (amem run train.py args...) or -m module", file=sys.stderr)
        return 2
    enable()
    target, rest = args.target[0], args.target[1:]
    if args.module:
        sys.argv = [target, *rest]
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        sys.argv = [target, *rest]
        sys.path.insert(0, str(__import__("pathlib").Path(target).resolve().parent))
        runpy.run_path(target, run_name="__main__")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from .allocator import Allocator
    from .introspection import format_bytes, summary
    from .workloads import training_events

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


def _config(args: argparse.Namespace) -> int:
    print(config_mod.describe())
    print("\nin effect (AMEM_CONF and defaults):")
    print(config_mod.canonical(config_mod.resolve()))
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="amem", description="amem_alloc: a CUDA caching allocator for PyTorch")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a Python script with amem as torch's CUDA allocator")
    run.add_argument("-m", dest="module", action="store_true", help="run a module instead of a script")
    run.add_argument("target", nargs=argparse.REMAINDER, help="script.py args... (or module args... with -m)")
    run.set_defaults(func=_run)
    demo = sub.add_parser("demo", help="allocate a realistic training pattern and print stats and fragmentation")
    demo.add_argument("--backend", choices=("sim", "host"), default="sim")
    demo.add_argument("--steps", type=int, default=20)
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--limit-gb", type=int, default=80, help="simulated device capacity in GiB")
    demo.set_defaults(func=_demo)
    cfg = sub.add_parser("config", help="print the options table and the configuration in effect")
    cfg.set_defaults(func=_config)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, RuntimeError, MemoryError) as err:
        print(f"amem: {err}", file=sys.stderr)
        return 1
