"""`amem doctor`: what is installed and usable (amem_alloc/doctor.py does the checking)."""
from __future__ import annotations

import argparse


def command(args: argparse.Namespace) -> int:
    from .. import doctor

    return doctor.main()


def add(sub: argparse._SubParsersAction) -> None:
    doc = sub.add_parser("doctor", help="what is installed, which torch, whether the start-up hook (AMEM_ENABLE, "
                         "AMEM_TRACE) is active, and whether a GPU and its virtual memory management are usable")
    doc.set_defaults(func=command)
