"""`accelerate launch` (Hugging Face Accelerate's launcher), read by Accelerate's own parser, never run.

Design note
-----------
`accelerate launch [options] train.py ARGS` decides the job from its options and the user's
config file (~/.cache/huggingface/accelerate/default_config.yaml, or `--config_file`), then
starts one process with Accelerate's variables set (ACCELERATE_MIXED_PRECISION, the dynamo and
FSDP or DeepSpeed settings, ...), or, for several processes, runs torchrun with them
(accelerate/commands/launch.py `simple_launcher` / `multi_gpu_launcher` / `deepspeed_launcher`).
Prediction takes the same decisions with the same code (`launch_command_parser`,
`_validate_launch_command`, accelerate/utils/launch.py's `prepare_*` functions), keeps the
variables they add to the environment, and predicts:
* one process: the script as `amem predict -- python train.py ARGS` does, with those variables;
* several (`--num_processes N`, `--multi_gpu`, FSDP, DeepSpeed): the ranks torchrun would start,
  N // `--num_machines` per node, each with those variables and torchrun's.
Where the launcher would count the machine's GPUs (`--num_processes` given nowhere), a prediction
cannot see them: one process, as torchrun's default, and `--num_processes N` says otherwise.
`--no_python`, `--tpu` and a non-local compute environment (SageMaker) are refused with one line.
"""
from __future__ import annotations

import contextlib
import io
import os
from dataclasses import dataclass, field

from ...patching import PatchSet, declare
from .launch import Launch, _count, parse_ranks

VARIABLES = declare("os.environ", "the variables `accelerate launch` sets (ACCELERATE_MIXED_PRECISION, ...)",
                    "a script predicted from an `accelerate launch` command sees them, as under the launcher")

# variables the launcher sets that are torchrun's (environment.py gives each rank its own) or the machine's
_NOT_ACCELERATES = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "OMP_NUM_THREADS")


@dataclass(frozen=True)
class AccelerateJob:
    launch: Launch | None            # None: one process (no torchrun)
    script: list[str]                # [script, args...] or ["-m", module, args...]
    env: dict = field(default_factory=dict)   # what the launcher adds to the environment


def is_accelerate(target: list[str]) -> bool:
    """Whether a target command is `accelerate launch ...`."""
    return len(target) >= 2 and target[0].rsplit("/", 1)[-1] == "accelerate" and target[1] == "launch"


def parse_accelerate(target: list[str], rank: str | None = None) -> AccelerateJob:
    """`accelerate launch` -> the job. ValueError (one line) on what prediction cannot take."""
    try:
        from accelerate.commands.launch import _validate_launch_command, launch_command_parser
        from accelerate.utils import launch as accelerate_launch
    except ImportError as e:
        raise ValueError(f"accelerate launch: Accelerate is not importable here ({e}); pip install accelerate") from e
    with contextlib.redirect_stderr(io.StringIO()) as errors:
        try:
            args = launch_command_parser().parse_args(target[2:])
        except SystemExit:
            lines = errors.getvalue().strip().splitlines()
            raise ValueError(f"accelerate launch: {lines[-1] if lines else 'bad arguments'}") from None
    if args.no_python or args.tpu or getattr(args, "tpu_use_cluster", False):
        raise ValueError("accelerate launch --no_python / --tpu: not predicted (give a Python script, for CUDA GPUs)")
    validated = _validate_launch_command(args)
    args, defaults, mp_from_config = validated if isinstance(validated, tuple) else (validated, None, False)
    if defaults is not None and str(getattr(defaults, "compute_environment", "")).endswith("AMAZON_SAGEMAKER"):
        raise ValueError("accelerate launch on SageMaker: not predicted (a local machine's launch is)")
    nproc = max(int(args.num_processes or 1), 1)
    nodes = max(int(args.num_machines or 1), 1)
    script = (["-m"] if args.module else []) + [args.training_script, *args.training_script_args]
    several = nproc > 1 or nodes > 1
    if args.machine_rank is None:   # every node is predicted: the launcher's own node's options need not be given
        args.machine_rank = 0
    args.main_process_ip = args.main_process_ip or "127.0.0.1"
    # as launch_command chooses its launcher (accelerate/commands/launch.py)
    if args.use_deepspeed and not args.cpu:
        fields = list(defaults.deepspeed_config.keys()) if defaults is not None else []
        args.deepspeed_fields_from_accelerate_config = ",".join(fields + (["mixed_precision"] if mp_from_config else []))
        env = accelerate_launch.prepare_deepspeed_cmd_env(args)[1]
    elif (args.use_fsdp or args.use_megatron_lm or args.multi_gpu or several) and not args.cpu:
        # (several processes and no --multi_gpu: on a machine with several GPUs the launcher sets it)
        args.multi_gpu = args.multi_gpu or not (args.use_fsdp or args.use_megatron_lm)
        env = accelerate_launch.prepare_multi_gpu_env(args)
    else:
        env = accelerate_launch.prepare_simple_launcher_cmd_env(args)[1]
    added = {k: str(v) for k, v in env.items() if os.environ.get(k) != str(v) and k not in _NOT_ACCELERATES}
    if not several:
        return AccelerateJob(None, script, added)
    per_node = _count("--num_processes", str(nproc // nodes)) if nproc >= nodes else 1
    port = str(getattr(args, "main_process_port", None) or 29500)
    launch = Launch(per_node, nodes, parse_ranks(rank, per_node * nodes),
                    args.main_process_ip, int(port) if port.isdigit() else 29500,
                    env=tuple(sorted(added.items())))
    return AccelerateJob(launch, script, added)


@contextlib.contextmanager
def launcher_environment(env: dict):
    """os.environ with the launcher's variables while a one-process job runs, restored after."""
    with PatchSet() as patches:
        for name, value in env.items():
            patches.setenv(VARIABLES, name, value)
        yield
