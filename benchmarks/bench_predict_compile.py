"""A compiled program predicted against the same program predicted eager: how much longer
`amem predict` takes when the program calls torch.compile (issue 33, item 6: at most 2x).

    python benchmarks/bench_predict_compile.py            # nanoGPT's train.py and a small MLP
    python benchmarks/bench_predict_compile.py --quick    # the MLP only (a smoke)
    python benchmarks/bench_predict_compile.py --write    # ... and writes its section of RESULTS.md

Each program is predicted twice, side by side in one run, with only its own compile switch
changed: nanoGPT's `--compile=False` / its default compile=True (config/train_shakespeare_char.py,
the test suite's iterations), the MLP's `--compile 0/1` (Linear-GELU-Linear, AdamW, 3 steps). Each
prediction is `amem predict --gpu H100 --json ... -- python PROGRAM ARGS` in a child process; wall
is the child's from start to exit (imports included), CPU its user+system time (wait4). The
compiled prediction traces each region with dynamo, AOTAutograd and inductor on torch's fake
tensors (no kernel is compiled). The compiled program is predicted twice: first with an empty
wrapper cache (engine/wrapper_cache.py: a program predicted for the first time on a machine),
then again with the wrappers the first run kept (the same program predicted again), and both
must give the same peak. The amem used is whichever `amem_alloc` this interpreter imports.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests"))
import program_figures as pf  # noqa: E402  (tests/ is on sys.path)
from bench_predict_programs import amem_commit, amem_path  # noqa: E402
from results_file import cpu_model, replace_section  # noqa: E402

RESULTS = HERE / "RESULTS.md"
BEGIN = "<!-- BEGIN compiled programs predicted: written by `python benchmarks/bench_predict_compile.py --write`; do not edit inside -->"
END = "<!-- END compiled programs predicted -->"
TARGET = 2.0
MiB = 1 << 20

MLP = '''
import argparse
import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--compile", type=int, default=1)
args = parser.parse_args()
model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)).cuda()
run = torch.compile(model) if args.compile else model
optimizer = torch.optim.AdamW(model.parameters())
for step in range(3):
    x = torch.randn(256, 1024, device="cuda")
    run(x).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
'''
NANOGPT_ARGS = ["config/train_shakespeare_char.py", "--max_iters=2", "--eval_iters=2"]


def pairs(scratch: Path, quick: bool) -> list[tuple]:
    """(program, folder, script, eager arguments, compiled arguments)."""
    (scratch / "mlp.py").write_text(MLP)
    rows = [("mlp", scratch, "mlp.py", ["--compile", "0"], ["--compile", "1"])]
    if not quick:
        rows.insert(0, ("nanogpt", pf.nanogpt_workdir(scratch), "train.py", [*NANOGPT_ARGS, "--compile=False"],
                        NANOGPT_ARGS))
    return rows


def measure(cwd: Path, script: str, args: list, out: Path, timeout: float, cache: Path) -> dict:
    """One prediction in a child process (inductor's wrappers kept in `cache`): wall and CPU
    seconds, the torch policy's peak, the notes on compiled regions."""
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / "prediction.json"
    argv = [sys.executable, "-m", "amem_alloc", "predict", "--gpu", "H100", "--json", str(json_path), "--",
            "python", script, *args]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMEM_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (amem_path(), os.environ.get("PYTHONPATH")) if p)
    env["AMEM_COMPILE_CACHE"] = str(cache)
    with open(out / "stdout", "w") as so, open(out / "stderr", "w") as se:
        started = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=so, stderr=se)
        status, usage = _wait(proc, started + timeout)
        wall = time.perf_counter() - started
    row = {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "exit": os.waitstatus_to_exitcode(status)}
    if row["exit"] == 0 and json_path.exists():
        data = json.loads(json_path.read_text())
        row["peak_allocated"] = next(r for r in data["policies"] if r["policy"] == "torch")["peak_allocated"]
        row["compiled"] = sorted({n["what"] for n in data["notes"] if "torch.compile" in n["what"]})
    return row


def _wait(proc, deadline: float):
    """The child's exit status and resource usage (wait4), killed past the deadline."""
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            return status, usage
        if time.perf_counter() > deadline:
            proc.kill()
            return os.wait4(proc.pid, 0)[1:]
        time.sleep(0.05)


def compare(name, cwd, script, eager_args, compiled_args, scratch: Path, timeout: float) -> dict:
    cache = scratch / name / "wrapper-cache"   # empty: nothing kept before this program's first run
    eager = measure(cwd, script, eager_args, scratch / name / "eager", timeout, cache)
    first = measure(cwd, script, compiled_args, scratch / name / "compiled", timeout, cache)
    again = measure(cwd, script, compiled_args, scratch / name / "compiled-again", timeout, cache)
    return {"program": name, "script": script, "eager_args": " ".join(eager_args),
            "compiled_args": " ".join(compiled_args), "eager": eager, "compiled": first, "compiled_again": again,
            "wall_ratio": first["wall_s"] / eager["wall_s"], "cpu_ratio": first["cpu_s"] / eager["cpu_s"],
            "wall_ratio_again": again["wall_s"] / eager["wall_s"], "cpu_ratio_again": again["cpu_s"] / eager["cpu_s"]}


def _gib(n) -> str:
    return f"{n / (1 << 30):.3f}" if isinstance(n, (int, float)) else "-"


def _status(r: dict) -> str:
    e, c, a = r["eager"], r["compiled"], r["compiled_again"]
    if not e["exit"] == c["exit"] == a["exit"] == 0:
        return f"exit {e['exit']} / {c['exit']} / {a['exit']}"
    if c.get("peak_allocated") != a.get("peak_allocated"):
        return "the kept wrappers changed the peak"
    return "; ".join(f"{what} {'ok' if ratio <= TARGET else f'over {TARGET:.0f}x'}"
                     for what, ratio in (("first", r["wall_ratio"]), ("again", r["wall_ratio_again"])))


def table(rows: list[dict]) -> list[str]:
    head = ["program", "eager wall s", "compiled wall s, first", "ratio", "compiled wall s, again", "ratio",
            "eager CPU s", "CPU ratio, first", "CPU ratio, again", "peak alloc. GiB eager",
            "peak alloc. GiB compiled (first = again)", "status"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        e, c, a = r["eager"], r["compiled"], r["compiled_again"]
        lines.append(f"| {r['program']} | {e['wall_s']:.1f} | {c['wall_s']:.1f} | {r['wall_ratio']:.2f} | "
                     f"{a['wall_s']:.1f} | {r['wall_ratio_again']:.2f} | {e['cpu_s']:.1f} | {r['cpu_ratio']:.2f} | "
                     f"{r['cpu_ratio_again']:.2f} | {_gib(e.get('peak_allocated'))} | "
                     f"{_gib(c.get('peak_allocated'))} | {_status(r)} |")
    return lines


def section(rows: list[dict]) -> str:
    import torch

    load = os.getloadavg()
    args = "\n".join(f"* `{r['program']}`: `{r['script']} {r['eager_args']}` / `{r['script']} {r['compiled_args']}`"
                     for r in rows)
    notes = "\n".join(f"* `{r['program']}` compiled: {'; '.join(r['compiled'].get('compiled', [])) or '-'}"
                      for r in rows)
    return "\n".join([
        "## Compiled programs predicted (issue 33)", "",
        f"`amem predict --gpu H100`, each program eager and compiled side by side, one child process each, "
        f"measured by benchmarks/bench_predict_compile.py on {cpu_model()} ({os.cpu_count()} cores, "
        f"load average {load[0]:.1f} at the end), torch {torch.__version__}, amem at {amem_commit()}, "
        f"{time.strftime('%Y-%m-%d')}. Wall: the child from start to exit (imports included); CPU: its "
        f"user+system time. Target: compiled at most {TARGET:.0f}x eager. First: the compiled program "
        f"predicted with no wrappers kept (as on a machine that never predicted it); again: the same "
        f"prediction run once more, inductor's wrappers kept by the first (engine/wrapper_cache.py).", "",
        *table(rows), "", "Arguments (each program's own command line):", "", args, "",
        "What the compiled predictions said of their regions:", "", notes, ""]) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the MLP only")
    ap.add_argument("--write", action="store_true", help="write the section of benchmarks/RESULTS.md")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--json", help="also write the rows here")
    opts = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="amem-bench-compile-") as scratch:
        for pair in pairs(Path(scratch), opts.quick):
            rows.append(compare(*pair, Path(scratch), opts.timeout))
            print(table(rows[-1:])[-1], flush=True)
    print("\n".join(table(rows)))
    if opts.json:
        Path(opts.json).write_text(json.dumps(rows, indent=1))
    if opts.write:
        replace_section(RESULTS, BEGIN, END, section(rows))
        print(f"wrote {RESULTS}")
    return 0 if all(not _status(r).startswith(("exit", "the kept")) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
