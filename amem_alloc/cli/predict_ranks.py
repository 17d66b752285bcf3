"""`amem predict` for a distributed job: the options, and the command that predicts every rank.

    amem predict [--nproc-per-node N] [--nnodes M] [--rank R|all] [options] -- python train.py ARGS
    amem predict [options] -- torchrun --nproc-per-node N [--nnodes M] train.py ARGS
    amem predict [options] -- deepspeed --num_gpus N [--num_nodes M] train.py ARGS
    amem predict [options] -- accelerate launch --num_processes N train.py ARGS

cli/predict.py calls `add_arguments` on its parser and hands the command here when `wanted`.
Exit statuses are one process's (predict_exits.py): 0 with a prediction (5 under --check when a
rank does not fit), 2 for bad input, the script's own status when it fails, 3, 4 and 124 as for one
process (amem's own failure inside a rank's script is the same one line, --debug its traceback); a
failure names the rank.
"""
from __future__ import annotations

import argparse
from typing import Any

from ..predict.distributed.accelerate_launcher import AccelerateJob, is_accelerate, parse_accelerate
from ..predict.distributed.deepspeed_launcher import is_deepspeed, parse_deepspeed
from ..predict.distributed.launch import Launch, is_torchrun, make, parse_torchrun
from . import exit_status


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nproc-per-node", help="predict a distributed job: processes (GPUs) per node, as torchrun's "
                   "option; each rank runs on torch's fake process group (no network)")
    p.add_argument("--nnodes", help="nodes of the distributed job (default 1)")
    p.add_argument("--rank", help="the ranks to predict: R, R,S,... or all (default all; ranks with equal "
                   "programs are analysed once)")


def _target(args: argparse.Namespace) -> list[str]:
    target = list(args.target)
    return target[1:] if target and target[0] == "--" else target


def accelerate_job(args: argparse.Namespace) -> AccelerateJob | None:
    """The job of an `accelerate launch` command (read once), or None for another command."""
    if not is_accelerate(_target(args)):
        return None
    if getattr(args, "accelerate_job", None) is None:
        args.accelerate_job = parse_accelerate(_target(args), getattr(args, "rank", None))
    return args.accelerate_job


def wanted(args: argparse.Namespace) -> bool:
    """Whether the command is a distributed prediction (the options, or a torchrun, deepspeed or
    several-process `accelerate launch` command)."""
    job = accelerate_job(args)
    return (getattr(args, "nproc_per_node", None) is not None or getattr(args, "nnodes", None) is not None
            or getattr(args, "rank", None) is not None or is_torchrun(_target(args)) or is_deepspeed(_target(args))
            or (job is not None and job.launch is not None))


def launch_and_script(args: argparse.Namespace) -> tuple[Launch, list[str]]:
    from .parser import existing_script as _script

    target = _target(args)
    if args.workload is not None:
        raise ValueError("--nproc-per-node/--nnodes/--rank and torchrun take a script, not --workload")
    job = accelerate_job(args)
    if job is not None and job.launch is not None:
        if args.nproc_per_node is not None or args.nnodes is not None:
            raise ValueError("give the job's shape once: accelerate launch's options, or amem's --nproc-per-node/--nnodes")
        return job.launch, _script(["python", *job.script])
    if is_torchrun(target) or is_deepspeed(target):
        if args.nproc_per_node is not None or args.nnodes is not None:
            raise ValueError(f"give the job's shape once: {target[0].rsplit('/', 1)[-1]}'s options, or amem's "
                             "--nproc-per-node/--nnodes")
        launch, script = (parse_torchrun if is_torchrun(target) else parse_deepspeed)(target, args.rank)
        script = _script(["python", *script])
    else:
        launch, script = make(args.nproc_per_node, args.nnodes, args.rank), _script(target)
    if script is None:
        raise ValueError("give the script: -- python train.py args... or -- torchrun --nproc-per-node N train.py args...")
    return launch, script


def predict_command(args: argparse.Namespace) -> int:
    from ..predict import api
    from ..predict.distributed.ranks import predict_ranks
    from . import predict_options

    launch, script = launch_and_script(args)
    if getattr(args, "what_if", None):   # not silently dropped: the trials run one process
        raise ValueError(f"--what-if predicts one process, not the {launch.world_size} ranks of a distributed job; "
                         "predict the job without it")
    predict_options.check(args, workload=False)
    if args.trace and "{rank}" not in args.trace and len(launch.chosen()) > 1:
        raise ValueError(f"--trace {args.trace}: put {{rank}} in the path for one file per rank")
    gpu = predict_options.card(args)
    policies = api.resolve_policies(args.policy)
    steps, timeout = predict_options.script_limits(args)
    result = _failures(lambda: predict_ranks(launch, script, gpu, policies, steps, timeout, args.strict,
                                             write_repeats=args.write_repeats, shapes=args.shapes), args.debug,
                       args.json)
    if isinstance(result, int):
        return result
    from ..report.prediction_text import format_ranks

    written = predict_options.write_outputs(args, result.write_json, result.write_traces,
                                            lambda path: _write_report(result, path))
    data = result.to_dict()
    print(format_ranks(data, written=written))  # its last lines: the worst rank's verdict
    failing = args.check and any(predict_options.does_not_fit(e["policies"]) for e in data["ranks"])
    return exit_status.DOES_NOT_FIT if failing else 0


def _failures(call: Any, debug: bool = False, json_path: str | None = None) -> Any:
    """The prediction, or the exit status one process gives the same failure (predict_exits)."""
    from . import predict_exits

    try:
        return call()
    except predict_exits.failures() as failure:
        return predict_exits.status_of(failure, debug=debug, json_path=json_path)


def _write_report(result: Any, path: str) -> list[Any]:
    """The HTML report of each rank ({rank} in the path), or one page: the worst rank's, with every
    rank's timeline side by side."""
    from ..predict.distributed.per_rank import RANK_FIELD
    from ..report import predict as report_page

    if RANK_FIELD in path:
        return [report_page.write(path.replace(RANK_FIELD, str(x.rank)), x.prediction.to_dict(), x.prediction.snapshot())
                for x in result.ranks]
    worst = result.worst.prediction
    ranks = result.rank_snapshots() if len(result.ranks) > 1 else None
    own = next(snap for rank, snap in ranks if rank == result.worst.rank) if ranks else worst.snapshot()
    return [report_page.write(path, worst.to_dict(), own, ranks)]
