"""The `amem` command (also `python -m amem_alloc`).

    amem run script.py args...     run a script with amem as torch's CUDA allocator
    amem run -m module args...     the same for a module
    amem demo [--backend sim]      replay a realistic training pattern; print stats and fragmentation
    amem config                    the options table and the configuration in effect
    amem doctor                    what is installed; whether the start-up hook, torch, a GPU and VMM are usable
    amem report TRACE -o report.html   an offline HTML report of a snapshot (amem's or torch's)
    amem export TRACE -f chrome|rmm -o OUT   Chrome/Perfetto JSON, or RMM's replay CSV
    amem replay TRACE --policy torch,amem   replay a trace under allocator policies (sim backend)
    amem compare --workload gpt             every policy on a workload, one process each (predicted without a GPU)
    amem predict --gpu H100-80GB -- python train.py   GPU memory per policy, predicted without a GPU
    amem fit --gpu H100-80GB --arg batch_size -- python train.py   the largest batch that fits, per policy
"""
from __future__ import annotations

import argparse
import sys
import time

from . import config as config_mod
from . import usage
from .usage import UsageError


def _run(args: argparse.Namespace) -> int:
    from . import user_script
    from .cuda import enable

    if not args.target:
        raise UsageError("give a script (amem run train.py args...) or -m module")
    target, rest = args.target[0], args.target[1:]
    user_script.check_target(target, args.module)
    enable(policy=args.policy)  # a bad policy, AMEM_CONF or AMEM_TRACE is amem's error, said before the script starts
    return user_script.run(target, rest, module=args.module)  # the script's errors stay the script's


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
    chosen = config_mod.resolve_with_policy()
    print(f"\nin effect for amem_alloc.enable() and amem run (policy {chosen.policy}, AMEM_CONF, defaults):")
    print(config_mod.canonical(chosen.conf))
    return 0


def _doctor(args: argparse.Namespace) -> int:
    from . import doctor

    return doctor.main()


def _report(args: argparse.Namespace) -> int:
    from .report import write_report

    usage.output_file(args.output)
    usage.apply_trace_limit(args)
    for trace in args.trace:
        usage.input_file(trace, "a snapshot pickle")
    if len(args.trace) > 1:  # several ranks (or runs) side by side
        from .report import write_ranks_report

        if args.provenance:
            raise UsageError("--provenance goes with one trace; give it when reporting a single file")
        out = write_ranks_report(args.trace, args.output, title=args.title)
        print(f"amem report: wrote {out} ({len(args.trace)} traces side by side)")
        return 0
    provenance = usage.provenance_file(args.provenance) if args.provenance else None
    out = write_report(args.trace[0], args.output, provenance=provenance, title=args.title, top=args.top)
    print(f"amem report: wrote {out}")
    return 0


def _export(args: argparse.Namespace) -> int:
    from .exports import devices_with_events, write_export
    from .snapshot import load_snapshot

    usage.output_file(args.output)
    usage.apply_trace_limit(args)
    snapshot = load_snapshot(usage.input_file(args.trace, "a snapshot pickle"))
    if args.device is not None and args.device not in devices_with_events(snapshot):
        have = ", ".join(map(str, devices_with_events(snapshot))) or "none"
        raise UsageError(f"{args.trace} has no events for device {args.device} (devices with events: {have}); "
                         "give one of those to --device")
    paths = write_export(snapshot, args.output, args.format, args.device)
    print("amem export: wrote " + ", ".join(str(p) for p in paths))
    return 0


def _add_trace_commands(sub: argparse._SubParsersAction) -> None:
    report = sub.add_parser("report", help="write a self-contained HTML report of a memory snapshot (amem's or torch's)")
    report.add_argument("trace", nargs="+", help="a snapshot pickle (amem_alloc.dump_snapshot or "
                        "torch.cuda.memory._dump_snapshot), or - for standard input; several (e.g. one per rank) "
                        "are shown side by side")
    report.add_argument("-o", "--output", default="report.html", help="the HTML file to write (default: report.html)")
    report.add_argument("--provenance", help="a JSON file with provenance data (Tracer.to_json()) to add as a section")
    report.add_argument("--title", help="the page's title")
    report.add_argument("--top", type=usage.positive_int, default=20, help="how many of the largest allocations to list")
    usage.add_trace_limit(report)
    report.set_defaults(func=_report)
    export = sub.add_parser("export", help="convert a snapshot's trace to Chrome/Perfetto JSON or RMM's log CSV")
    export.add_argument("trace", help="a snapshot pickle (amem's or torch's), or - for standard input")
    export.add_argument("-f", "--format", choices=("chrome", "rmm"), default="chrome",
                        help="chrome: Trace Event JSON for ui.perfetto.dev / chrome://tracing; rmm: "
                             "Thread,Time,Action,Pointer,Size,Stream for RMM's replay benchmark")
    export.add_argument("-o", "--output", required=True, help="the file to write (rmm, several devices: one per "
                                                              "device, named like out.dev0.csv)")
    export.add_argument("--device", type=usage.device_index, help="rmm: the device to export (default: the only one "
                        "with events)")
    usage.add_trace_limit(export)
    export.set_defaults(func=_export)


def _parser() -> argparse.ArgumentParser:
    parser = usage.Parser(prog="amem", description="amem_alloc: a CUDA caching allocator for PyTorch")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a Python script with amem as torch's CUDA allocator")
    run.add_argument("-m", dest="module", action="store_true", help="run a module instead of a script")
    run.add_argument("--policy", help="the allocator policy to start from (default: AMEM_POLICY, else amem; "
                     "amem-defaults for torch's own decisions); AMEM_CONF overrides it key by key")
    run.add_argument("target", nargs=argparse.REMAINDER, help="script.py args... (or module args... with -m)")
    run.set_defaults(func=_run)
    demo = sub.add_parser("demo", help="allocate a realistic training pattern and print stats and fragmentation")
    demo.add_argument("--backend", choices=("sim", "host"), default="sim")
    demo.add_argument("--steps", type=usage.positive_int, default=20)
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--limit-gb", type=usage.whole_gb, default=80, help="simulated device capacity in GiB (0: unlimited)")
    demo.set_defaults(func=_demo)
    cfg = sub.add_parser("config", help="print the options table and the configuration in effect")
    cfg.set_defaults(func=_config)
    doc = sub.add_parser("doctor", help="what is installed, which torch, whether the start-up hook (AMEM_ENABLE, "
                         "AMEM_TRACE) is active, and whether a GPU and its virtual memory management are usable")
    doc.set_defaults(func=_doctor)
    _add_trace_commands(sub)
    from .compare.commands import add_commands as _add_compare_commands

    _add_compare_commands(sub)
    from .predict.cli import add_command as _add_predict_command

    _add_predict_command(sub)
    from .predict.fit_cli import add_command as _add_fit_command

    _add_fit_command(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs one command; amem's own errors become one line and exit status 1 (Ctrl-C: 130).

    A script's errors under `amem run` never get here: user_script prints them as Python does.
    """
    args = _parser().parse_args(argv)
    command = f"amem {args.command}"
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print(f"{command}: interrupted", file=sys.stderr)
        return 130
    except (ValueError, RuntimeError, MemoryError, OSError) as err:
        print(usage.one_line(err, command), file=sys.stderr)
        return 1
