"""`amem predict`: a script's or a bundled workload's GPU memory, predicted without a GPU.

    amem predict [--gpu NAME | --capacity-gb N] [--context-mb MIB | --calibration-file FILE]
                 [--policy LIST] [--json PATH] [--trace PATH] [--report PATH] [--steps N] [--timeout S]
                 [--strict] [--shapes expected|upper] [--check] [--debug] -- python SCRIPT ARGS...
    amem predict --workload NAME [--size N] [--steps N] [...]

The script runs unchanged in this process (script.py: runpy, sys.argv set, as __main__): real
CPU, fake CUDA tensors. The text ends with the answer: the verdict per policy and, when one does
not fit, the next step. Exit status: 0 with a prediction (5 under --check when a policy does not
fit); the script's own status if it exits
non-zero or raises (its traceback printed as Python would); 2 for bad arguments (one line); 3
when, under --strict, the code needs a value (one line naming the file and line), or an output's
size depends on values with no upper bound; 4 when the run cannot be predicted (CUDA graphs,
CUDA in a child process: one line naming amem's limit), or amem itself failed inside the script
("cannot model ...; please report it": predict_exits.py; --debug adds the traceback); 124 past
--timeout.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any

from .. import policies as policies_mod
from . import exit_status, parser, predict_options


def _fail(message: str) -> None:
    print(f"amem predict: {message}", file=sys.stderr)
    raise SystemExit(exit_status.BAD_INPUT)


def _run_workload(run: Any, name: str, size: int, steps: int | None) -> None:
    from .. import workloads

    workloads.get(name)(size, steps, "cuda", 0, lambda i: run.marker("step"))


def _check(args: argparse.Namespace, script: list[str] | None) -> None:
    if (args.workload is None) == (script is None):
        raise ValueError("give --workload NAME, or -- python script.py args... (one of the two)")
    predict_options.check(args, workload=args.workload is not None)


def _predict(args: argparse.Namespace, script: list[str] | None, gpu: Any, policies: list) -> Any:
    """The prediction (run.result), or an exit status when there is none."""
    from ..predict import api
    from ..predict import script as script_mod
    from ..predict.distributed.spawn import Spawns
    from . import predict_exits

    target = f"script {' '.join(script)}" if script else f"workload {args.workload} (size {args.size})"
    steps, timeout = predict_options.script_limits(args)
    run = api.predicting(gpu, policies=policies, target=target, strict=args.strict, shapes=args.shapes,
                         write_decode=not args.run_every_decode_step)
    try:
        with run, Spawns():   # a script that spawns its ranks: SpawnedRanks, predicted per rank
            if script:
                run.steps_run = script_mod.run(script, run, steps, timeout, args.write_repeats)
            else:
                _run_workload(run, args.workload, args.size, args.steps)
    except predict_exits.failures() as failure:
        return predict_exits.status_of(failure, run.child_reports, args.debug, args.json)
    if script:
        run.result.stopped_after = script_mod.stopped_after_line(run.steps_run, steps, run.written_out,
                                                                 getattr(run, "ended_by", None),
                                                                 getattr(run, "backward_steps", False))
    return run.result


def _spawned_ranks(args: argparse.Namespace, spawned: Any) -> int:
    """The script started its ranks itself (torch.multiprocessing.spawn): the job predicted again
    as one node of that many processes, each a rank (predict/distributed/spawn.py)."""
    from ..predict.distributed.fresh_libraries import forget_libraries
    from . import predict_ranks

    if args.what_if:
        raise ValueError(f"{spawned}: --what-if predicts one process; predict the ranks without it "
                         f"(--nproc-per-node {spawned.nprocs})")
    if spawned.script is not None:   # torchrun's agent started in the program: its ranks run its script
        shape = f"--nproc-per-node {spawned.nprocs}" + (f" --nnodes {spawned.nnodes}" if spawned.nnodes > 1 else "")
        print(f"amem predict: {spawned}: predicted as its ranks, as {shape} -- python "
              f"{' '.join(spawned.script)} does", file=sys.stderr, flush=True)
        args.target, args.nnodes = ["--", "python", *spawned.script], str(spawned.nnodes)
    else:
        print(f"amem predict: {spawned}: predicted as the ranks of one node, as --nproc-per-node {spawned.nprocs} "
              "does (give --nproc-per-node N for another count)", file=sys.stderr, flush=True)
    args.nproc_per_node = str(spawned.nprocs)
    forget_libraries()   # the ranks start as new processes do: without the libraries the script imported
    return predict_ranks.predict_command(args)


def predict_command(args: argparse.Namespace) -> int:
    from ..predict.engine.saved_files import whole_prediction
    from ..predict.stop_signals import unwinding

    # Ctrl-C and SIGTERM unwind the run (its scratch folders removed), one line; the files saved
    # from fake tensors go when every rank and what-if trial has run
    with unwinding(), whole_prediction():
        return _predict_command(args)


def _predict_command(args: argparse.Namespace) -> int:
    from . import predict_ranks

    if predict_ranks.wanted(args):   # --nproc-per-node / --nnodes / --rank, or -- torchrun ...
        return predict_ranks.predict_command(args)
    job = predict_ranks.accelerate_job(args)   # `accelerate launch` of one process: its script, its variables
    if job is not None:
        from ..predict.distributed.accelerate_launcher import launcher_environment

        args.target = ["python", *job.script]
        with launcher_environment(job.env):
            return _predict_one_process(args)
    return _predict_one_process(args)


def _predict_one_process(args: argparse.Namespace) -> int:
    from ..predict import api
    from ..predict.script import SpawnedRanks
    from . import predict_whatif as whatif

    script = parser.existing_script(args.target)
    _check(args, script)
    whatif.check_arguments(args)
    gpu = predict_options.card(args)
    policies = api.resolve_policies(args.policy)
    spawned = None
    try:
        result = _predict(args, script, gpu, policies)
    except SpawnedRanks as found:
        spawned = found.with_traceback(None)   # its frames would keep the script's modules alive
    if spawned is not None:   # out of the except block: the exception being handled holds them too
        return _spawned_ranks(args, spawned)
    if isinstance(result, int):
        return result
    whatif.from_cli(args, script, result, lambda run: _run_workload(run, args.workload, args.size, args.steps))
    from ..report import predict as report_page
    from ..report.prediction_text import format_prediction

    written = predict_options.write_outputs(args, result.write_json, result.write_trace,
                                            lambda path: report_page.write(path, result.to_dict(), result.snapshot()))
    data = result.to_dict()
    print(format_prediction(data, written=written))  # its last lines: the verdict, and the next step
    return exit_status.DOES_NOT_FIT if args.check and predict_options.does_not_fit(data["policies"]) else 0


def add(sub: argparse._SubParsersAction) -> None:
    from .. import workloads
    from ..predict import gpus
    from ..predict import options as predict_options_table
    from . import predict_options, predict_ranks
    from . import predict_whatif as whatif

    p = sub.add_parser("predict", help="predict a script's or workload's GPU memory under every allocator "
                       "policy, without a GPU",
                       description="Runs the code on fake CUDA tensors (no GPU, no compute), then replays its "
                       "allocations under each policy. Cards (--gpu):\n" + gpus.describe() + "\n\nPolicies:\n"
                       + policies_mod.describe() + "\n\nWorkloads: " + ", ".join(workloads.WORKLOADS),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    where = p.add_mutually_exclusive_group()
    where.add_argument("--gpu", help=f"the card to fit (default {gpus.DEFAULT}); see the list above")
    where.add_argument("--capacity-gb", type=float, help="instead of --gpu: usable device memory in GiB")
    predict_options.add_context_arguments(p)
    p.add_argument("--policy", "--policies", dest="policy", help="comma-separated policy names, 'all', or conf:<AMEM_CONF> (last); default: "
                   + ",".join(policies_mod.DEFAULT_COMPARE))
    p.add_argument("--workload", choices=list(workloads.WORKLOADS), help="a bundled workload instead of a script")
    p.add_argument("--size", type=int, default=1, help="the workload's size knob (default 1)")
    p.add_argument("--steps", type=int, help="a workload's steps (default: the workload's); a script is stopped "
                   "after this many optimizer steps (default 5; 0: run it to its end)")
    p.add_argument("--timeout", type=float, help="stop a script that runs longer than this many seconds, with "
                   "no prediction (default 600; 0: no limit)")
    p.add_argument("--write-repeats", action="store_true", help="where two steps in a row made the same "
                   "allocations, write the rest of the --steps out instead of running them (faster, for a loop "
                   "that runs on past --steps)")
    predict_options_table.add_arguments(p)   # --strict, --shapes: predict/options.py's table
    p.add_argument("--run-every-decode-step", action="store_true", help="run every step of a decode loop "
                   "(generate(), a range() loop under inference_mode) instead of writing the steps after a few "
                   "that grow alike out (the same program, slower; docs/predict.md)")
    p.add_argument("--debug", action="store_true", help="when amem itself fails inside the script, also print "
                   "the traceback, amem's frames included (for a report)")
    p.add_argument("--json", help="write the result as JSON")
    p.add_argument("--trace", help="write the predicted run as a torch memory snapshot (pickle)")
    p.add_argument("--report", help="write the HTML report of the predicted run")
    p.add_argument("--check", action="store_true", help="exit with status 5 when the run does not fit under "
                   "any policy predicted (for CI; give --policy for the one you run)")
    predict_ranks.add_arguments(p)
    whatif.add_arguments(p)
    p.add_argument("target", nargs=argparse.REMAINDER, help="-- python script.py args... (or -- torchrun ..., -- deepspeed ..., -- accelerate launch ...)")
    p.error = _fail  # type: ignore[method-assign]  - one line, no usage dump
    p.set_defaults(func=predict_command)  # bad input (ValueError): exit 2 in cli/main.py
