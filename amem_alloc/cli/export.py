"""`amem export TRACE -f chrome|rmm -o OUT`: a snapshot's trace in other tools' formats (trace_export.py)."""
from __future__ import annotations

import argparse

from .. import user_input
from ..user_input import UsageError
from . import parser


def command(args: argparse.Namespace) -> int:
    from ..snapshot import load_snapshot
    from ..trace_export import devices_with_events, write_export

    user_input.output_file(args.output)
    parser.apply_trace_limit(args)
    snapshot = load_snapshot(user_input.input_file(args.trace, "a snapshot pickle"))
    if args.device is not None and args.device not in devices_with_events(snapshot):
        have = ", ".join(map(str, devices_with_events(snapshot))) or "none"
        raise UsageError(f"{args.trace} has no events for device {args.device} (devices with events: {have}); "
                         "give one of those to --device")
    paths = write_export(snapshot, args.output, args.format, args.device)
    print("amem export: wrote " + ", ".join(str(p) for p in paths))
    return 0


def add(sub: argparse._SubParsersAction) -> None:
    export = sub.add_parser("export", help="convert a snapshot's trace to Chrome/Perfetto JSON or RMM's log CSV")
    export.add_argument("trace", help="a snapshot pickle (amem's or torch's), or - for standard input")
    export.add_argument("-f", "--format", choices=("chrome", "rmm"), default="chrome",
                        help="chrome: Trace Event JSON for ui.perfetto.dev / chrome://tracing; rmm: "
                             "Thread,Time,Action,Pointer,Size,Stream for RMM's replay benchmark")
    export.add_argument("-o", "--output", required=True, help="the file to write (rmm, several devices: one per "
                                                              "device, named like out.dev0.csv)")
    export.add_argument("--device", type=parser.device_index, help="rmm: the device to export (default: the only one "
                        "with events)")
    parser.add_trace_limit(export)
    export.set_defaults(func=command)
