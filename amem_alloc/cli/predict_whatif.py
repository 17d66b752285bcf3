"""`amem predict --what-if LIST [--blocks PATH]`: the options (cli/predict.py calls add_arguments and
from_cli), checked before anything runs, and the what-ifs run after the unchanged prediction."""
from __future__ import annotations

from typing import Any, Callable

from ..predict.whatif.answers import NAMES, parse

def add_arguments(p: Any) -> None:
    """`amem predict`'s what-if options (cli/predict.py calls this)."""
    p.add_argument("--what-if", dest="what_if", metavar="LIST",
                   help="predict again with each change applied by amem (comma-separated, or 'all'): "
                   + ", ".join(NAMES))
    p.add_argument("--blocks", metavar="PATH", help="checkpoint=...: the model's repeated block stack, as a module "
                   "path from the model (e.g. transformer.h); default: found automatically")


def check_arguments(args: Any) -> list[str]:
    """The what-ifs asked for (ValueError: one line), checked before anything runs."""
    if getattr(args, "blocks", None) and not getattr(args, "what_if", None):
        raise ValueError("--blocks names the block stack for --what-if checkpoint=...; give --what-if too")
    return parse(args.what_if) if getattr(args, "what_if", None) else []


def from_cli(args: Any, script: list[str] | None, base: Any, body_for_workload: Callable[[Any], None]) -> None:
    """Runs the what-ifs `amem predict --what-if` asked for, attaching them to base."""
    import sys

    from ..predict import api
    from ..predict.whatif import trial, run as whatif_run
    from . import predict_options

    names = check_arguments(args)
    if not names:
        return
    if script:
        body = trial.script_body(script, *predict_options.script_limits(args))
    else:
        body = body_for_workload
    whatif_run.run_all(names, body, base, api.predicting, blocks=args.blocks, strict=args.strict, shapes=args.shapes,
            progress=lambda line: print(f"amem predict: {line}", file=sys.stderr, flush=True))
