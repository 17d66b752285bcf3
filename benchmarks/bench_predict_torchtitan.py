"""torchtitan's Llama 3.1 8B recipe predicted, unchanged: the tree behind its published memory figure
(commit 9dec370, train_configs/llama3_8b.toml: FSDP2, local batch 2, seq 8192, selective op
activation checkpointing) under

    amem predict --gpu H100 -- torchrun --nnodes N --nproc-per-node 8 train.py \\
        --job.config_file train_configs/llama3_8b.toml --training.batch_size 2 --training.dataset c4_test

on 8 ranks and on 128 (16 nodes of 8), timed end to end as a user runs it (wall and CPU seconds,
the machine's load beside them: other work on the machine slows the wall clock), with the worst
rank's peak allocated and reserved (torch policy) beside the reference figures: first principles
for 8 ranks on torch 2.14 (62.7 GiB allocated: cuDNN attention recomputed, the root resharded),
and torchtitan's published peak reserved (82.4 GiB on 8 x H100 96 GB, 67.0 GiB on 128).

    python benchmarks/bench_predict_torchtitan.py --tree PATH [--worlds 8 128] [--write]

PATH: torchtitan's tree at 9dec370 (e.g. `git archive 9dec370` of a clone) with a tiktoken
tokenizer of exactly 128,000 ranks at assets/tokenizer/original/tokenizer.model and a
c4_test-style JSON-lines file at tests/assets/c4_test (no internet; memory does not depend on the
text). Not part of `make test`: one prediction takes about a minute.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_file import cpu_model, replace_section  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "RESULTS.md"
BEGIN = "<!-- BEGIN torchtitan 8B predicted: written by `python benchmarks/bench_predict_torchtitan.py --write`; do not edit inside -->"
END = "<!-- END torchtitan 8B predicted -->"
GiB = 1 << 30
FIRST_PRINCIPLES_ALLOCATED = {8: 62.7}            # GiB, torch 2.14 (see the module docstring)
PUBLISHED_RESERVED = {8: 82.4, 128: 67.0}         # GiB, torchtitan's published peak memory
TARGET_S = 60.0
RECIPE = ["train.py", "--job.config_file", "train_configs/llama3_8b.toml", "--training.batch_size", "2",
          "--training.dataset", "c4_test"]


def predict(tree: Path, world: int) -> dict:
    """One prediction as a user runs it; its wall and CPU seconds and the worst rank's figures."""
    nodes = max(1, world // 8)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "prediction.json"
        cmd = [sys.executable, "-m", "amem_alloc", "predict", "--gpu", "H100", "--policy", "torch",
               "--json", str(out), "--", "torchrun", "--nnodes", str(nodes), "--nproc-per-node", str(world // nodes),
               *RECIPE]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        load = os.getloadavg()[0]
        started = time.perf_counter()
        proc = subprocess.run(cmd, cwd=tree, capture_output=True, text=True, timeout=1800,
                              env=dict(os.environ, PYTHONPATH=str(ROOT)))
        wall = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode != 0:
            raise SystemExit(f"{world} ranks: amem predict failed:\n{proc.stderr[-3000:]}")
        data = json.loads(out.read_text())
    worst = max(data["ranks"], key=lambda r: r["policies"][0]["peak_reserved"])
    policy = worst["policies"][0]
    recorded = [r["rank"] for r in data["ranks"] if r["recorded"]]
    return {"world": world, "wall": wall, "cpu": (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
            "load": load, "recorded": recorded, "allocated": policy["peak_allocated"] / GiB,
            "reserved": policy["peak_reserved"] / GiB}


def _versus(value: float, reference: float | None) -> str:
    return "" if reference is None else f"{reference:.1f} ({(value / reference - 1) * 100:+.1f}%)"


def table(rows: list[dict]) -> str:
    import torch

    lines = [f"Measured with `python benchmarks/bench_predict_torchtitan.py --write` on {cpu_model()} "
             f"({os.cpu_count()} cores), torch {torch.__version__}, no GPU, {time.strftime('%Y-%m-%d')}; "
             f"predicted for H100 80 GB, torch policy.", "",
             "| ranks | recorded | wall s | CPU s | load (1 min) | ≤ 60 s | peak allocated GiB | first principles | "
             "peak reserved GiB | published |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['world']} | {', '.join(map(str, r['recorded']))} | {r['wall']:.1f} | {r['cpu']:.1f} | "
                     f"{r['load']:.1f} | {'yes' if r['wall'] <= TARGET_S else 'no'} | {r['allocated']:.2f} | "
                     f"{_versus(r['allocated'], FIRST_PRINCIPLES_ALLOCATED.get(r['world']))} | {r['reserved']:.2f} | "
                     f"{_versus(r['reserved'], PUBLISHED_RESERVED.get(r['world']))} |")
    lines += ["", "Ranks whose programs are equal to rank 0's at both ends of the job are taken as rank 0's "
              "(amem predict's symmetry rule: ranks 0 and N-1 recorded together); `--rank all` records each.", ""]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", type=Path, required=True, help="torchtitan's tree at 9dec370, with its assets")
    ap.add_argument("--worlds", type=int, nargs="+", default=[8, 128])
    ap.add_argument("--write", action="store_true", help="write the section of benchmarks/RESULTS.md")
    args = ap.parse_args()
    if not (args.tree / "train.py").exists():
        raise SystemExit(f"--tree {args.tree}: no train.py there; give torchtitan's tree at 9dec370")
    rows = [predict(args.tree.resolve(), world) for world in args.worlds]
    text = "## torchtitan Llama 3.1 8B recipe predicted (issue 32)\n\n" + table(rows)
    print(text)
    if args.write:
        replace_section(RESULTS, BEGIN, END, text)


if __name__ == "__main__":
    main()
