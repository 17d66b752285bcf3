"""amem against torch's native CUDA allocator on a GPU, in one run.

    python benchmarks/bench_gpu.py [--quick]     # prints the figures as JSON

Two figures, each timed in a fresh process per allocator (amem can only be enabled before CUDA
starts), the processes alternating native, amem, native, amem, ... so drift hits both alike:

* `gpu.empty_del`: a torch.empty/del loop over mixed sizes (512 B .. 64 MiB) with 16 tensors
  live at a time, ns per iteration (the allocator's whole cost seen from Python, including
  torch's CUDAPluggableAllocator wrapper for amem);
* `gpu.train_step`: forward, backward and Adam step of a small MLP (8 x 2048 wide, batch 512,
  batch size varying by step so blocks are reused at different sizes), ms per step.

Where torch sees no CUDA device the figures are reported as skipped, with the reason; the child
script still runs once on the CPU with the native allocator so it cannot rot unseen.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = textwrap.dedent(r"""
    import json, statistics, sys, time
    allocator, device, quick = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
    if allocator == "amem":
        import amem_alloc
        amem_alloc.enable()
    import torch

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    KiB, MiB = 1024, 1024 * 1024
    SIZES = [512, 4 * KiB, 64 * KiB, 700 * KiB, 1 * MiB + 512, 3 * MiB, 9 * MiB, 12 * MiB, 64 * MiB, 2 * KiB]

    def empty_del(n):
        live = [None] * 16
        sync()
        started = time.perf_counter()
        for i in range(n):
            live[i % 16] = None                     # del the oldest: its block goes back
            live[i % 16] = torch.empty(SIZES[(i * 7) % len(SIZES)], dtype=torch.uint8, device=device)
        sync()
        seconds = time.perf_counter() - started
        live.clear()
        return seconds / n * 1e9

    torch.manual_seed(0)
    width, depth = (256, 2) if quick else (2048, 8)
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)

    def train_steps(n, first):
        sync()
        started = time.perf_counter()
        for step in range(first, first + n):
            batch = 512 - 64 * (step % 4)              # shapes vary: blocks are reused at other sizes
            x = torch.randn(batch, width, device=device)
            loss = model(x).square().mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        sync()
        return (time.perf_counter() - started) / n * 1e3

    reps, loop, steps = (1, 500, 2) if quick else (7, 20000, 30)
    empty_del(loop // 10)
    train_steps(5, 0)                                  # warm-up: kernels chosen, caches filled
    out = {"empty_del": statistics.median(empty_del(loop) for _ in range(reps)),
           "train_step": statistics.median(train_steps(steps, 5 + i * steps) for i in range(reps))}
    print(json.dumps(out))
""")


def _child(allocator: str, device: str, quick: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMEM_")}
    proc = subprocess.run([sys.executable, "-c", CHILD, allocator, device, "1" if quick else "0"], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"the {allocator} run on {device} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(quick: bool = False, reps: int | None = None) -> dict:
    import torch

    if not torch.cuda.is_available():
        _child("native", "cpu", True)  # the script itself still runs
        return {"skipped": f"torch.cuda.is_available() is False (torch {torch.__version__}): no CUDA device "
                           "on this machine; run `python benchmarks/run.py` on a GPU machine",
                "figures": []}
    reps = reps or (1 if quick else 5)
    samples: dict[str, list[float]] = {f"gpu.{k}.{a}": [] for k in ("empty_del", "train_step") for a in ("native", "amem")}
    for _ in range(reps):
        for allocator in ("native", "amem"):
            result = _child(allocator, "cuda", quick)
            samples[f"gpu.empty_del.{allocator}"].append(result["empty_del"])
            samples[f"gpu.train_step.{allocator}"].append(result["train_step"])
    units = {"empty_del": "ns/iteration", "train_step": "ms/step"}
    figures = [{"id": name, "unit": units[name.split(".")[1]], "iterations": 1, "samples": s}
               for name, s in samples.items()]
    return {"device": torch.cuda.get_device_name(0), "figures": figures}


def ratios(result: dict) -> str:
    """The side-by-side table: per figure, amem / native of each interleaved pair, their median and
    range, against the 1.05x target."""
    if "skipped" in result:
        return f"skipped: {result['skipped']}"
    by = {f["id"]: f["samples"] for f in result["figures"]}
    lines = [f"GPU benchmark on {result['device']}: amem (its default policy) vs torch's native allocator, "
             "fresh processes interleaved", "", "| figure | native (median) | amem (median) | ratio per pair "
             "(median) | pairs' range | target | verdict |", "|---|---|---|---|---|---|---|"]
    for fig, unit in (("empty_del", "ns/iteration"), ("train_step", "ms/step")):
        native, amem = by[f"gpu.{fig}.native"], by[f"gpu.{fig}.amem"]
        pairs = sorted(a / n for a, n in zip(amem, native))
        mid = statistics.median(pairs)
        lines.append(f"| {fig} ({unit}) | {statistics.median(native):.1f} | {statistics.median(amem):.1f} | "
                     f"{mid:.3f}x | {pairs[0]:.3f}-{pairs[-1]:.3f} | <= 1.05x | {'meets' if mid <= 1.05 else 'misses'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tiny model and short loops (a smoke run)")
    parser.add_argument("--reps", type=int, default=None, help="process pairs (native, amem) to run")
    parser.add_argument("--table", action="store_true", help="print the ratios as a table after the JSON")
    args = parser.parse_args(argv)
    result = measure(args.quick, args.reps)
    print(json.dumps(result))
    if args.table:
        print(ratios(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
