"""DeepSpeed's launcher command line (`deepspeed --num_gpus N train.py ARGS`), parsed, never run.

Design note
-----------
`deepspeed` (deepspeed/launcher/runner.py, then launch.py on each node) starts `--num_gpus`
processes on each of `--num_nodes` nodes; process r runs `python train.py --local_rank=L ARGS`
(L = r's index on its node; `--no_local_rank` leaves it out) with RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_SIZE, CROSS_RANK, CROSS_SIZE, MASTER_ADDR and MASTER_PORT set (environment.py). Prediction
runs each rank's script itself (ranks.py), so only the options that decide the ranks' shape
matter: `--num_gpus`, `--num_nodes`, `--include host:0,1@host2:0,1` (its slots), `--module`,
`--no_local_rank`, `--master_addr/--master_port`; the others (hostfile's ssh, launcher backends,
core binding, logs) are accepted and ignored. Without `--num_gpus` or `--include` the launcher
would take every GPU of the machine, which a prediction cannot see: one per node, as torchrun's
default, and `--num_gpus N` says otherwise. `--exclude`, `--no_python` and `--autotuning` have no
fixed shape or script, and are refused with one line.
"""
from __future__ import annotations

from .launch import Launch, _count, parse_ranks

LAUNCHERS = ("deepspeed",)
_VALUED = {"-H", "--hostfile", "-i", "--include", "-e", "--exclude", "--num_nodes", "--num_gpus", "--master_port",
           "--master_addr", "--node_rank", "--launcher", "--launcher_args", "--enable_each_rank_log",
           "--autotuning", "--bind_core_list", "--ssh_port", "--venv_script", "--log_level"}
_REFUSED = {"-e": "--exclude", "--exclude": "--exclude", "--no_python": "--no_python", "--autotuning": "--autotuning"}


def is_deepspeed(target: list[str]) -> bool:
    """Whether a target command is DeepSpeed's launcher (`deepspeed ...`)."""
    return bool(target) and target[0].rsplit("/", 1)[-1] in LAUNCHERS


def parse_deepspeed(target: list[str], rank: str | None = None) -> tuple[Launch, list[str]]:
    """DeepSpeed's command line -> (Launch, [script, args...] or ["-m", module, args...]).
    ValueError (one line) on what prediction cannot take."""
    args, options, flags = target[1:], {}, set()
    i = 0
    while i < len(args) and args[i].startswith("-"):
        name, _, inline = args[i].partition("=")
        if name in _REFUSED:
            raise ValueError(f"deepspeed {_REFUSED[name]}: not predicted (give --num_gpus N, and a Python script)")
        if name in _VALUED:
            options[name] = inline if inline else (args[i + 1] if i + 1 < len(args) else "")
            i += 1 if inline else 2
        else:
            flags.add(name)
            i += 1
    if not args[i:]:
        raise ValueError("deepspeed: no script given (deepspeed --num_gpus N train.py args...)")
    nproc, nodes = _shape(options)
    script = (["-m"] if "--module" in flags else []) + args[i:]
    port = options.get("--master_port", "29500")
    launch = Launch(nproc, nodes, parse_ranks(rank, nproc * nodes), options.get("--master_addr", "127.0.0.1"),
                    int(port) if port.isdigit() else 29500, launcher="deepspeed",
                    local_rank_arg="--no_local_rank" not in flags)
    return launch, script


def _shape(options: dict) -> tuple[int, int]:
    """(processes per node, nodes) from --num_gpus / --num_nodes, or --include's slots."""
    include = options.get("--include") or options.get("-i")
    if include and "--num_gpus" not in options:
        hosts = [h for h in include.split("@") if h]
        slots = [len(h.split(":", 1)[1].split(",")) if ":" in h else 0 for h in hosts]
        if not slots or 0 in slots or len(set(slots)) != 1:
            raise ValueError(f"deepspeed --include {include}: give each host's GPUs (host:0,1@host2:0,1), as many "
                             "on each, or --num_gpus N")
        return _count("--include", str(slots[0])), _count("--include", str(len(hosts)))
    return (_count("--num_gpus", options.get("--num_gpus", "1")),
            _count("--num_nodes", options.get("--num_nodes", "1")))
