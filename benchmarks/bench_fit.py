"""`amem fit` on GPT-2 small: how many predictions and how long the search for nanoGPT's largest
batch takes, and what it answers.

    python benchmarks/bench_fit.py              # prints the table
    python benchmarks/bench_fit.py --write      # ... and writes its section of RESULTS.md
    python benchmarks/bench_fit.py --quick      # a 2-layer GPT (a smoke)

The program is nanoGPT's own train.py (tests/programs/nanogpt, vendored unchanged) at GPT-2 small's
shape (12 layers, 12 heads, 768 wide, 1024 tokens, vocabulary 50304), bf16 autocast, AdamW, one
micro-step per optimizer step (--gradient_accumulation_steps=1), --compile=False, on random tokens
(memory does not depend on their values). The search is `amem fit --gpu GPU --arg batch_size
--steps 2 -- python train.py ...` in a child process from the program's folder, as a user would run
it; wall time is the child's from start to exit (importing torch once, every trial, the analysis
under each policy). Goal: under 3 minutes on this machine.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
NANOGPT = ROOT / "tests" / "programs" / "nanogpt"
RESULTS = HERE / "RESULTS.md"
sys.path.insert(0, str(HERE))
from results_file import cpu_model, replace_section  # noqa: E402

BEGIN = "<!-- BEGIN amem fit: written by `python benchmarks/bench_fit.py --write`; do not edit inside -->"
END = "<!-- END amem fit -->"
GPT2_SMALL = ["--n_layer=12", "--n_head=12", "--n_embd=768", "--block_size=1024"]
QUICK = ["--n_layer=2", "--n_head=4", "--n_embd=256", "--block_size=256"]
COMMON = ["--dataset=owt", "--compile=False", "--eval_iters=1", "--gradient_accumulation_steps=1",
          "--max_iters=4", "--log_interval=1000"]


def workdir(root: Path) -> Path:
    """nanoGPT's scripts and data/owt/{train,val}.bin of random GPT-2 token ids (no meta.pkl: vocab 50304)."""
    work = root / "nanogpt"
    (work / "data" / "owt").mkdir(parents=True, exist_ok=True)
    for name in ("train.py", "model.py", "configurator.py"):
        shutil.copy(NANOGPT / name, work / name)
    rng = np.random.default_rng(0)
    rng.integers(0, 50257, size=400_000, dtype=np.uint16).tofile(work / "data" / "owt" / "train.bin")
    rng.integers(0, 50257, size=40_000, dtype=np.uint16).tofile(work / "data" / "owt" / "val.bin")
    return work


def amem_path() -> str:
    spec = importlib.util.find_spec("amem_alloc")
    return str(Path(spec.origin).resolve().parent.parent)


def search(work: Path, shape: list[str], gpu: str, policy: str) -> tuple[dict, float, str]:
    out = work / "fit.json"
    cmd = [sys.executable, "-m", "amem_alloc", "fit", "--gpu", gpu, "--arg", "batch_size", "--policy", policy,
           "--steps", "2", "--margin", "0",  # the very edge, as RESULTS.md has measured it (amem fit keeps 5%)
           "--json", str(out), "--", "python", "train.py", *shape, *COMMON]
    env = {**os.environ, "PYTHONPATH": amem_path()}
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"amem fit failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(out.read_text()), wall, proc.stdout


def section(data: dict, wall: float, gpu: str, model: str) -> str:
    lines = [f"`amem fit --gpu {gpu} --arg batch_size --steps 2 --margin 0` on nanoGPT's train.py at {model}; measured "
             f"on {cpu_model()} (2 cores shared with other work), {time.strftime('%Y-%m-%d')}, by "
             "`python benchmarks/bench_fit.py --write`.", "",
             f"{len(data['trials'])} predictions (trials), wall time {wall:.0f} s for the whole search "
             f"({sum(t['seconds'] for t in data['trials']) / len(data['trials']):.1f} s per trial on average); "
             "goal: under 3 minutes.", "",
             "| policy | largest batch_size that fits | it needs (min capacity) | its peak reserved | headroom | first failing | it needs |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    gib = 2 ** 30
    for p in data["policies"]:
        need = f"{p['needed_at_first_failing'] / gib:.2f} GiB" if p["needed_at_first_failing"] else "-"
        lines.append(f"| {p['policy']} | {p['largest']} | {p['needed'] / gib:.2f} GiB | {p['peak_reserved'] / gib:.2f} GiB | "
                     f"{p['headroom'] / gib:.2f} GiB | {p['first_failing']} | {need} |")
    lines += ["", "A policy fits when the smallest capacity on which its replay finishes (min capacity) is within "
              "the card's usable memory; a negative headroom (usable less the peak reserved of an unlimited "
              "replay) means it fits only by emptying its cache when a cudaMalloc fails, as torch retries.",
              "", "Trials in order: " + ", ".join(str(t["value"]) for t in data["trials"]) + "."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--gpu", default="H100")
    ap.add_argument("--policy", default="torch,torch-expandable,amem")
    a = ap.parse_args()
    shape, model = (QUICK, "a 2-layer GPT") if a.quick else (GPT2_SMALL, "GPT-2 small (124M parameters, 1024 tokens)")
    with tempfile.TemporaryDirectory() as tmp:
        data, wall, stdout = search(workdir(Path(tmp)), shape, a.gpu, a.policy)
    print(stdout)
    text = section(data, wall, a.gpu, model)
    print(text)
    if a.write and not a.quick:
        replace_section(RESULTS, BEGIN, END, "## amem fit (issue 23)\n\n" + text)


if __name__ == "__main__":
    main()
