"""`amem replay TRACE [--policy torch,amem,...] [--device N] [--json OUT] [--plot OUT.svg|OUT.png]`: a trace
replayed under allocator policies on the sim backend (the evaluation is amem_alloc/replay/trace.py)."""
from __future__ import annotations

import argparse
import json

from .. import atomic_write
from .. import policies as policies_mod
from .. import user_input
from . import parser


def _policy_names(text: str | None) -> list[str] | None:
    return [p.name for p in policies_mod.parse_list(text)] if text else None


def command(args: argparse.Namespace) -> int:
    from ..replay import trace as trace_replay

    for option in ("json", "plot"):
        if getattr(args, option):
            user_input.output_file(getattr(args, option), f"--{option}")
    if args.plot and not args.plot.endswith(".svg"):  # said before the replay, not after it
        user_input.require_module("matplotlib", "--plot", parser.PLOTS_EXTRA,
                                  instead="give --plot OUT.svg, which needs no install")
    user_input.input_file(args.trace, "a snapshot pickle or a program .npz written by amem compare")
    parser.apply_trace_limit(args)
    report = trace_replay.replay_trace(args.trace, _policy_names(args.policy), args.device,
                                       limit_bytes=int(args.limit_gb * (1 << 30)))
    print(trace_replay.format_text(report))
    if args.json:
        atomic_write.write_text(args.json, json.dumps(report.to_dict(), indent=1))
        print(f"\nwrote {args.json}")
    if args.plot:
        from ..report.plot import write_replay_plots

        print("wrote " + ", ".join(str(p) for p in write_replay_plots(report, args.plot)))
    return 0


def add(sub: argparse._SubParsersAction) -> None:
    rep = sub.add_parser("replay", help="replay a memory trace through amem's core under allocator policies",
                         description="Replays a snapshot (torch.cuda.memory._dump_snapshot, amem's, or a program "
                         "recorded by amem compare) on the sim backend. Policies:\n" + policies_mod.describe(),
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    rep.add_argument("trace", help="a snapshot pickle (- for standard input), or a .npz program")
    parser.add_policy_option(rep, "the policy emulating the trace's own allocator settings")
    rep.add_argument("--device", type=parser.device_index, help="only this device")
    rep.add_argument("--limit-gb", type=parser.capacity_gb, default=0, help="simulated device capacity in GiB (0: unlimited)")
    rep.add_argument("--json", help="write the full report (timelines included) as JSON")
    rep.add_argument("--plot", help="write allocated/reserved over time: OUT.svg (no install needed), or a PNG "
                     "(needs matplotlib: amem_alloc[plots])")
    parser.add_trace_limit(rep)
    rep.set_defaults(func=command)
