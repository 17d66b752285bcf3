"""`amem config`: the options table and the configuration in effect."""
from __future__ import annotations

import argparse

from .. import config


def command(args: argparse.Namespace) -> int:
    print(config.describe())
    chosen = config.resolve_with_policy()
    print(f"\nin effect for amem_alloc.enable() and amem run (policy {chosen.policy}, AMEM_CONF, defaults):")
    print(config.canonical(chosen.conf))
    return 0


def add(sub: argparse._SubParsersAction) -> None:
    cfg = sub.add_parser("config", help="print the options table and the configuration in effect")
    cfg.set_defaults(func=command)
