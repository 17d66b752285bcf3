"""`amem run script.py args...` (or `-m module`): the script with amem as torch's CUDA allocator."""
from __future__ import annotations

import argparse

from .. import user_script
from ..user_input import UsageError


def command(args: argparse.Namespace) -> int:
    from ..cuda import enable

    if not args.target:
        raise UsageError("give a script (amem run train.py args...) or -m module")
    target, rest = args.target[0], args.target[1:]
    user_script.check_target(target, args.module)
    enable(policy=args.policy)  # a bad policy, AMEM_CONF or AMEM_TRACE is amem's error, said before the script starts
    return user_script.run(target, rest, module=args.module)  # the script's errors stay the script's


def add(sub: argparse._SubParsersAction) -> None:
    run = sub.add_parser("run", help="run a Python script with amem as torch's CUDA allocator")
    run.add_argument("-m", dest="module", action="store_true", help="run a module instead of a script")
    run.add_argument("--policy", help="the allocator policy to start from (default: AMEM_POLICY, else amem; "
                     "amem-defaults for torch's own decisions); AMEM_CONF overrides it key by key")
    run.add_argument("target", nargs=argparse.REMAINDER, help="script.py args... (or module args... with -m)")
    run.set_defaults(func=command)
