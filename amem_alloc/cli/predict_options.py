"""`amem predict`'s run options, read and checked once for every way it runs: one process
(predict.py), a distributed job (predict_ranks.py) and the what-ifs (predict_whatif.py); its
outputs (--json, --trace, --report) written the same way by each; and --check's test."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Callable


def add_context_arguments(p: argparse.ArgumentParser) -> None:
    """--context-mb and --calibration-file: what the process holds outside the caching allocator
    (amem predict, amem fit)."""
    p.add_argument("--context-mb", type=float, metavar="MIB",
                   help="what the process holds outside torch's caching allocator (CUDA context and libraries), "
                   "in MiB, as you measured it (nvidia-smi's figure for the process less "
                   "torch.cuda.memory_reserved()); default: modelled from what the run used")
    p.add_argument("--calibration-file", metavar="FILE",
                   help="take that figure from amem doctor --calibrate's file for the card (default: "
                   "$AMEM_CALIBRATION, else ~/.cache/amem_alloc/calibration.json, where it exists)")


def card(args: argparse.Namespace) -> Any:
    """The card the options name, with the context they give (predict/api.py resolve_gpu)."""
    from ..predict import api

    return api.resolve_gpu(args.gpu, args.capacity_gb, getattr(args, "context_mb", None),
                           getattr(args, "calibration_file", None))


def check(args: argparse.Namespace, workload: bool) -> None:
    """--size, --steps, --timeout within bounds and every output's folder present (ValueError: one line)."""
    if args.size < 1 or (args.steps is not None and args.steps < (1 if workload else 0)):
        raise ValueError("--size must be an integer >= 1, --steps >= 1 for a workload, >= 0 for a script")
    if args.timeout is not None and not args.timeout >= 0:
        raise ValueError("--timeout must be a number of seconds >= 0 (0: no limit)")
    for path in (args.json, args.trace, args.report):
        if path and not Path(path).resolve().parent.is_dir():
            raise ValueError(f"{path}: its folder does not exist")


def script_limits(args: argparse.Namespace) -> tuple[int, float]:
    """(optimizer steps, seconds) after which a script is stopped: the options, or predict/script.py's defaults."""
    from ..predict import script as script_mod

    steps = args.steps if args.steps is not None else script_mod.DEFAULT_STEPS
    timeout = args.timeout if args.timeout is not None else script_mod.DEFAULT_TIMEOUT
    return steps, timeout


def write_outputs(args: argparse.Namespace, json: Callable[[str], Any], trace: Callable[[str], Any],
                  report: Callable[[str], Any]) -> list[Any]:
    """Writes the outputs asked for (each writer returns its path, or a list of paths); returns their
    paths, which the text names just before its verdict (report/prediction_text.py)."""
    written: list[Any] = []
    try:
        for path, write in ((args.json, json), (args.trace, trace), (args.report, report)):
            if path:
                out = write(path)
                written += out if isinstance(out, list) else [out]
    except OSError as err:  # atomic_write's WriteError names the path; nothing half-written is left there
        raise ValueError(str(err) if err.filename else f"cannot write an output: {err.strerror or err}") from None
    return written


def does_not_fit(rows: list[dict]) -> bool:
    """--check: whether any policy predicted does not fit (the command then exits DOES_NOT_FIT)."""
    return any(not r["fits"] for r in rows)
