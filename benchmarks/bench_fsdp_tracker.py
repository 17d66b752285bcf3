"""amem's prediction side by side with torch's FSDPMemTracker on the same FSDP2 program.

    python benchmarks/bench_fsdp_tracker.py [--config small|tiny|7b] [--world 4] [--write]

`--write` measures the two cases RESULTS.md shows (the small config on 4 ranks, the 7B config on
8 ranks) and replaces its section.

The program is benchmarks/fsdp2_llama.py (a LLaMA, blocks checkpointed and fully_shard'ed, bf16
MixedPrecisionPolicy, AdamW). Both sides run rank 0 of `--world` ranks on torch's fake process group,
each in a child process of its own:

* amem: `predict_ranks` on the script, as `amem predict --nproc-per-node N --rank 0 -- python
  fsdp2_llama.py` does (fake CUDA; the peak is the torch policy's peak allocated, requests rounded
  to 512 B);
* torch: torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker around the same `build` and
  `train_step` under FakeTensorMode. FSDP2 needs CUDA streams, which a machine without a GPU cannot
  make even for fake tensors, so the tracker's run is on the CPU device (a CPU mesh: FSDP2's code is
  the same, its streams are torch.cpu's no-ops); the tracker reports bytes unrounded for the CPU.
  One step runs untracked first (FSDPMemTracker tracks one iteration) so that the tracked step has
  AdamW's state, as amem's second step does; amem's peak is in its second step too.

Prints both peaks, each side's breakdown at its peak, and the difference.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from child_process import run_child  # noqa: E402
from results_file import cpu_model, replace_section  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PROGRAM = HERE / "fsdp2_llama.py"
RESULTS = HERE / "RESULTS.md"
BEGIN = "<!-- BEGIN FSDPMemTracker side by side: written by `python benchmarks/bench_fsdp_tracker.py --write`; do not edit inside -->"
END = "<!-- END FSDPMemTracker side by side -->"
MiB = 1 << 20


def amem_side(config: str, world: int) -> dict:
    from amem_alloc.predict.distributed.launch import Launch
    from amem_alloc.predict.distributed.ranks import predict_ranks
    from amem_alloc.replay import ALLOC, FREE

    result = predict_ranks(Launch(world, 1, [0]), [str(PROGRAM), "--config", config, "--steps", "2"], "H100",
                           "torch", steps=5, timeout=1200)
    p = result.rank(0).prediction
    live: dict[int, tuple[int, int]] = {}
    for kind, key, size, stream in p.ops[:p.at_peak.op + 1]:   # what lives at the peak, by category and stream
        if kind == ALLOC:
            live[key] = ((size + 511) // 512 * 512, stream)
        elif kind == FREE:
            live.pop(key, None)
    streams = sorted({s for _, s in live.values()})
    parts: dict[str, int] = {}
    for key, (size, stream) in live.items():
        info = p.infos[key]
        name = "cublas_workspace" if info.op == "cublas_workspace" else info.category
        name += "" if stream == streams[0] else f" (stream {streams.index(stream)})"
        parts[name] = parts.get(name, 0) + size
    return {"peak": p.row("torch").peak_allocated, "parts": parts, "at_op": p.at_peak.op, "ops": len(p.ops),
            "markers": p.markers}


def torch_side(config: str, world: int) -> dict:
    import torch
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    import fsdp2_llama as program

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    cfg = program.CONFIGS[config]
    with FakeTensorMode():
        model, opt = program.build(cfg, "cpu", mesh)
        program.train_step(model, opt, cfg, "cpu")   # untracked: AdamW's state exists in the tracked step
        tracker = FSDPMemTracker(model, opt)
        with tracker:
            program.train_step(model, opt, cfg, "cpu")
        peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
    dist.destroy_process_group()
    parts = {str(k.value): v for k, v in peak.items() if k != "Total" and v}
    return {"peak": peak["Total"], "parts": parts}


def _child(side: str, config: str, world: int) -> dict:
    out, seconds = run_child(__file__, [side, "--config", config, "--world", str(world)], f"the {side} side",
                             1800, (str(HERE),))
    return {**out, "seconds": seconds}


def render(amem: dict, tracker: dict, config: str, world: int) -> str:
    workspace = amem["parts"].get("cublas_workspace", 0)
    remainders = amem["peak"] - sum(amem["parts"].values())   # whole blocks beyond the rounded requests
    rest = amem["peak"] - workspace - remainders
    diff = amem["peak"] / tracker["peak"] - 1
    lines = [f"FSDP2 LLaMA ({config} config of benchmarks/fsdp2_llama.py), rank 0 of {world}, torch's fake process group",
             "", "| | amem predict (torch policy) | FSDPMemTracker |", "|---|---|---|",
             f"| peak allocated | {amem['peak'] / MiB:.1f} MiB | {tracker['peak'] / MiB:.1f} MiB |",
             f"| difference | {diff:+.2%} of the tracker's | |",
             f"| of which cuBLAS workspaces (the tracker cannot see them) | {workspace / MiB:.1f} MiB | |",
             f"| of which block remainders torch's allocator does not split off (counted by memory_allocated) | "
             f"{remainders / MiB:.1f} MiB | |",
             f"| the rest: requests rounded to 512 B | {rest / MiB:.1f} MiB ({rest / tracker['peak'] - 1:+.2%}) | |",
             f"| wall time of the child process | {amem['seconds']:.1f} s | {tracker['seconds']:.1f} s |", "",
             "At each side's peak (MiB; amem's streams numbered from the compute stream, 0):", "",
             "| amem category | MiB | | FSDPMemTracker category | MiB |", "|---|---|---|---|---|"]
    a = sorted(amem["parts"].items(), key=lambda kv: -kv[1])
    t = sorted(tracker["parts"].items(), key=lambda kv: -kv[1])
    for i in range(max(len(a), len(t))):
        left = f"{a[i][0]} | {a[i][1] / MiB:.1f}" if i < len(a) else " | "
        right = f"{t[i][0]} | {t[i][1] / MiB:.1f}" if i < len(t) else " | "
        lines.append(f"| {left} | | {right} |")
    return "\n".join(lines)


EXPLANATION = """How the two breakdowns match (at the small config both peaks are in the second step's backward,
at 7B both in its optimizer step, where AdamW's foreach temporaries, one of the sharded size, are
amem's temporary and part of the tracker's OptState; the program asks for foreach=True, what AdamW
picks for CUDA parameters, because on the tracker's CPU tensors the default is the for-loop, which
holds no such temporaries and moved the tracker's peak into backward, 3.7% below the GPU's):
FSDPMemTracker's Temp + Reduce Scatter = amem's autograd_detail on the compute stream (gradients of
activations, the recomputed block, the reduce-scatter input FSDP2 copies the gradients into);
its Unsharded Param = amem's parameter (gathered) (FSDP2's all-gathered parameters: the storages
FSDP2 refills with `UntypedStorage.resize_`); Sharded Param + Buffer = amem's parameter;
All Gather and Sharded Grad = amem's all-gather buffer and reduce-scatter output on FSDP2's
all-gather and reduce-scatter streams; OptState and Activation agree.
The differences: the cuBLAS workspaces (32 MiB per cuBLAS handle on an H100: the forward thread's
and the autograd engine's), which CUDA allocates through the caching allocator
(torch.cuda.memory_allocated counts them) but no dispatch mode sees, so the tracker does not
model them; the remainders of large blocks that torch's allocator leaves unsplit (a remainder of
1 MiB or less stays with the block, CUDACachingAllocator.cpp `shouldSplit`, and allocated_bytes
counts whole blocks), which amem's replay of torch's policy has and a dispatch-level count cannot;
and the 512-byte rounding of each request, which amem applies as CUDA's allocator does and the
tracker's CPU run does not. What amem models and the tracker does
not — frees held for another stream until it is synchronised, reserved memory and segments per
policy — adds nothing at this peak (the held frees end before it); the tracker's run cannot use
CUDA streams without a GPU (see the script's docstring)."""


WRITTEN = [("small", 4), ("7b", 8)]   # the cases RESULTS.md shows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="small", choices=("small", "tiny", "7b"))
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--write", action="store_true", help="update the section in benchmarks/RESULTS.md")
    parser.add_argument("--child", choices=("amem", "torch"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        side = amem_side if args.child == "amem" else torch_side
        print(json.dumps(side(args.config, args.world)))
        return 0
    cases = WRITTEN if args.write else [(args.config, args.world)]
    tables = []
    for config, world in cases:
        amem, tracker = _child("amem", config, world), _child("torch", config, world)
        tables.append(render(amem, tracker, config, world))
    table = "\n\n".join(tables)
    print(table)
    print()
    print(EXPLANATION)
    if args.write:
        import platform

        import torch
        intro = (f"Measured with `python benchmarks/bench_fsdp_tracker.py --write` on {cpu_model(platform.processor())}, "
                 f"torch {torch.__version__}, no GPU, {time.strftime('%Y-%m-%d')}.")
        replace_section(RESULTS, BEGIN, END, "\n".join(["## FSDP2: amem predict beside torch's FSDPMemTracker (issue 26)",
                                                         "", intro, "", table, "", EXPLANATION, ""]))
        print(f"wrote {RESULTS}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
