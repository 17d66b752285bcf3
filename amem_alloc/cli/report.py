"""`amem report TRACE... -o report.html`: the offline HTML report of snapshots (amem_alloc/report)."""
from __future__ import annotations

import argparse

from .. import user_input
from ..user_input import UsageError
from . import parser


def command(args: argparse.Namespace) -> int:
    from ..report import write_report

    user_input.output_file(args.output)
    parser.apply_trace_limit(args)
    for trace in args.trace:
        user_input.input_file(trace, "a snapshot pickle")
    if len(args.trace) > 1:  # several ranks (or runs) side by side
        from ..report import write_ranks_report

        if args.provenance:
            raise UsageError("--provenance goes with one trace; give it when reporting a single file")
        out = write_ranks_report(args.trace, args.output, title=args.title)
        print(f"amem report: wrote {out} ({len(args.trace)} traces side by side)")
        return 0
    provenance = user_input.provenance_file(args.provenance) if args.provenance else None
    out = write_report(args.trace[0], args.output, provenance=provenance, title=args.title, top=args.top)
    print(f"amem report: wrote {out}")
    return 0


def add(sub: argparse._SubParsersAction) -> None:
    report = sub.add_parser("report", help="write a self-contained HTML report of a memory snapshot (amem's or torch's)")
    report.add_argument("trace", nargs="+", help="a snapshot pickle (amem_alloc.dump_snapshot or "
                        "torch.cuda.memory._dump_snapshot), or - for standard input; several (e.g. one per rank) "
                        "are shown side by side")
    report.add_argument("-o", "--output", default="report.html", help="the HTML file to write (default: report.html)")
    report.add_argument("--provenance", help="a JSON file with provenance data (Tracer.to_json()) to add as a section")
    report.add_argument("--title", help="the page's title")
    report.add_argument("--top", type=parser.positive_int, default=20, help="how many of the largest allocations to list")
    parser.add_trace_limit(report)
    report.set_defaults(func=command)
