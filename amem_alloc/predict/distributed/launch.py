"""The shape of a distributed job under prediction: nodes, processes per node, which ranks to
predict — from amem's options or from a torchrun command line (parsed, never executed).

Design note
-----------
torchrun (torch/distributed/run.py) starts `--nproc-per-node` processes on each of `--nnodes`
nodes; rank r sees RANK=r, LOCAL_RANK=r % nproc, WORLD_SIZE=nnodes*nproc (environment.py).
Prediction runs each rank's script itself (ranks.py, recording.py), so only the options that
decide the ranks' shape matter here; rendezvous, restarts and monitoring options are accepted and
ignored. An elastic range (`--nnodes 1:4`) or `--nproc-per-node gpu|auto` has no fixed shape and
is refused with one line.
"""
from __future__ import annotations

from dataclasses import dataclass

MAX_WORLD = 4096
TORCHRUNS = ("torchrun",)
TORCHRUN_MODULES = ("torch.distributed.run", "torch.distributed.launch")
_SHAPE = {"--nproc-per-node": "nproc_per_node", "--nproc_per_node": "nproc_per_node",
          "--nnodes": "nnodes", "--node-rank": "node_rank", "--node_rank": "node_rank",
          "--master-addr": "master_addr", "--master_addr": "master_addr",
          "--master-port": "master_port", "--master_port": "master_port"}
_NO_VALUE = {"--standalone", "--no-python", "--no_python", "--run-path", "--run_path"}


@dataclass(frozen=True)
class Launch:
    """nnodes x nproc_per_node ranks; `ranks` to predict (None: every one)."""
    nproc_per_node: int = 1
    nnodes: int = 1
    ranks: tuple[int, ...] | None = None
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    launcher: str = "torchrun"     # or "deepspeed" (deepspeed_launcher.py): the environment each rank gets
    local_rank_arg: bool = False   # DeepSpeed's launcher passes `--local_rank=N` to the script
    env: tuple = ()                # (name, value) a launcher adds for every rank (accelerate_launcher.py)

    def script_for(self, script: list[str], rank: int) -> list[str]:
        """The rank's argv: `--local_rank=N` first where the launcher passes it."""
        if not self.local_rank_arg:
            return script
        at = 2 if script[:1] == ["-m"] else 1
        return [*script[:at], f"--local_rank={rank % self.nproc_per_node}", *script[at:]]

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes

    def chosen(self) -> list[int]:
        return list(self.ranks) if self.ranks is not None else list(range(self.world_size))


def _count(option: str, value: str) -> int:
    if not value.isdigit() or not 1 <= int(value) <= MAX_WORLD:
        raise ValueError(f"{option} {value}: give a whole number of processes from 1 to {MAX_WORLD} "
                         "(prediction needs a fixed shape: no 'gpu', 'auto' or elastic 'MIN:MAX')")
    return int(value)


def parse_ranks(text: str | None, world_size: int) -> tuple[int, ...] | None:
    """--rank R | R,S | all -> the ranks (None: none named, symmetry.py chooses; all: every one)."""
    if text is None:
        return None
    if text == "all":
        return tuple(range(world_size))
    out = []
    for part in text.split(","):
        if not part.strip().isdigit() or int(part) >= world_size:
            raise ValueError(f"--rank {text}: give 'all' or ranks from 0 to {world_size - 1}, comma-separated")
        out.append(int(part))
    return tuple(sorted(set(out)))


def make(nproc_per_node: int | str | None, nnodes: int | str | None, rank: str | None) -> Launch | None:
    """The Launch of amem's own --nproc-per-node / --nnodes / --rank options (None: none given)."""
    if nproc_per_node is None and nnodes is None and rank is None:
        return None
    nproc = _count("--nproc-per-node", str(nproc_per_node or 1))
    nodes = _count("--nnodes", str(nnodes or 1))
    return Launch(nproc, nodes, parse_ranks(rank, nproc * nodes))


def is_torchrun(target: list[str]) -> bool:
    """Whether a target command is torchrun (`torchrun ...`, `python -m torch.distributed.run ...`)."""
    if target and target[0].rsplit("/", 1)[-1] in TORCHRUNS:
        return True
    return len(target) >= 3 and target[1] == "-m" and target[2] in TORCHRUN_MODULES


def parse_torchrun(target: list[str], rank: str | None = None) -> tuple[Launch, list[str]]:
    """torchrun's command line -> (Launch, [script, args...] or ["-m", module, args...]).
    ValueError (one line) on what prediction cannot take (an elastic shape)."""
    args = target[1:] if target[0].rsplit("/", 1)[-1] in TORCHRUNS else target[3:]
    shape: dict[str, str] = {}
    i, module = 0, False
    while i < len(args) and args[i].startswith("-"):
        name, _, inline = args[i].partition("=")
        if name in ("-m", "--module"):   # the script is a module's name (python -m)
            module = True
            i += 1
            continue
        if name in _NO_VALUE:
            i += 1
            continue
        value = inline if inline else (args[i + 1] if i + 1 < len(args) else "")
        i += 1 if inline else 2
        if name in _SHAPE:
            shape[_SHAPE[name]] = value
    script = (["-m"] if module else []) + args[i:]
    if not args[i:]:
        raise ValueError("torchrun: no script given (torchrun --nproc-per-node N train.py args...)")
    nproc = _count("--nproc-per-node", shape.get("nproc_per_node", "1"))
    nodes = _count("--nnodes", shape.get("nnodes", "1"))
    port = shape.get("master_port", "29500")
    return Launch(nproc, nodes, parse_ranks(rank, nproc * nodes), shape.get("master_addr", "127.0.0.1"),
                  int(port) if port.isdigit() else 29500), script
