"""Prediction at scale: a LLaMA-7B training step predicted without a GPU, its time and memory.

    python benchmarks/bench_predict.py            # the 7B step; prints the figures; --write updates RESULTS.md
    python benchmarks/bench_predict.py --quick    # a tiny config (CI smoke): checks it runs, judges nothing

The model is amem_alloc/workloads/llama.py (32 layers, d_model 4096, d_ff 11008, 32 heads,
sequence 2048, batch 1, bf16 autocast, AdamW: 6.74e9 parameters). The prediction runs in a child
process, so its peak resident memory (getrusage(RUSAGE_SELF).ru_maxrss, read in the child at the
end) is the prediction's own and not this driver's; the child also reports its resident memory
after importing torch and amem (the floor any prediction starts from) and the wall time of the
prediction itself: fake execution and recording, then the analysis under the five policies of
`amem predict` (a replay each, and the binary search for the smallest capacity). Targets: under
60 s and under 4 GiB on this 2-core machine.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_file import cpu_model, replace_section  # noqa: E402  (benchmarks/ is on sys.path)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "RESULTS.md"
BEGIN = "<!-- BEGIN prediction at scale: written by `python benchmarks/bench_predict.py --write`; do not edit inside -->"
END = "<!-- END prediction at scale -->"
TARGET_S, TARGET_RSS = 60.0, 4 << 30
GiB, MiB = 1 << 30, 1 << 20


def _rss_now() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def child(config: str, steps: int, batch: int) -> dict:
    """Runs in the child: one prediction; its figures as a dict."""
    import resource

    started = time.perf_counter()
    import torch  # noqa: F401 - the floor: what importing costs before any prediction

    import amem_alloc
    from amem_alloc.workloads import llama

    imported = time.perf_counter()
    rss_imported = _rss_now()
    cfg = llama.LLAMA_7B if config == "7b" else llama.TINY
    began = time.perf_counter()
    p = amem_alloc.predict(llama.run, batch, steps, "cuda", 0, None, cfg, gpu="H100-80GB")
    seconds = time.perf_counter() - began
    usage = resource.getrusage(resource.RUSAGE_SELF)
    maxrss = usage.ru_maxrss * 1024
    torch_row = p.row("torch")
    return {"config": config, "parameters": cfg.parameters, "steps": steps, "batch": batch,
            "seconds": seconds, "seconds_recording": p.seconds["recording"], "seconds_analysis": p.seconds["analysis"],
            "import_seconds": imported - started, "cpu_seconds": usage.ru_utime + usage.ru_stime, "rss_after_import": rss_imported, "maxrss": maxrss,
            "ops": len(p.ops), "allocations": sum(1 for op in p.ops if op[0] == 0),
            "peak_allocated": torch_row.peak_allocated, "peak_reserved": torch_row.peak_reserved,
            "min_capacity": torch_row.min_capacity, "fits_h100": torch_row.fits,
            "at_peak": p.at_peak.categories, "policies": [r.to_dict() for r in p.rows]}


def measure(quick: bool) -> dict:
    """Spawns the child; its result (with the load average before and after), or {"error": ...}."""
    load_before = os.getloadavg()[0]
    args = [sys.executable, str(Path(__file__).resolve()), "--child", "--config", "tiny" if quick else "7b"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=1800, check=False)
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        return {"error": lines[-1] if lines else f"exit status {proc.returncode}", "stderr": proc.stderr[-4000:]}
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["load"] = [load_before, os.getloadavg()[0]]
    return out


def _gib(n: int) -> str:
    return f"{n / GiB:.2f} GiB"


def render(r: dict, quick: bool) -> str:
    if "error" in r:
        return f"Prediction at scale: FAILED: {r['error']}"
    judged = not quick
    verdict = (lambda ok: ("meets" if ok else "misses") if judged else "not judged (--quick)")
    which = "LLaMA-7B" if r["config"] == "7b" else "tiny LLaMA config (smoke)"
    lines = [f"| figure | value | target | verdict |", "|---|---|---|---|",
             f"| {which} training step ({r['parameters']:.3g} parameters, batch {r['batch']}, "
             f"{r['steps']} step): prediction wall time | {r['seconds']:.1f} s (recording {r['seconds_recording']:.1f} s, "
             f"analysis of 5 policies {r['seconds_analysis']:.1f} s); CPU time of the whole child process "
             f"{r['cpu_seconds']:.1f} s; load average {r['load'][0]:.1f} before, {r['load'][1]:.1f} after, on "
             f"{os.cpu_count()} cores | < {TARGET_S:.0f} s | {verdict(r['seconds'] < TARGET_S)} |",
             f"| peak resident memory of the predicting process | {_gib(r['maxrss'])} (after importing torch and "
             f"amem: {_gib(r['rss_after_import'])}) | < 4 GiB | {verdict(r['maxrss'] < TARGET_RSS)} |",
             f"| allocator calls recorded | {r['ops']} ({r['allocations']} allocations) | — | — |",
             f"| predicted peak allocated / reserved (torch policy) | {_gib(r['peak_allocated'])} / "
             f"{_gib(r['peak_reserved'])} | — | — |",
             f"| smallest device it runs on (torch policy); fits an H100 80GB? | {_gib(r['min_capacity'])}; "
             f"{'yes' if r['fits_h100'] else 'no'} | — | — |"]
    lines.append("")
    lines.append("At the peak: " + ", ".join(f"{k} {_gib(v)}" for k, v in r["at_peak"].items()) + ".")
    lines.append("")
    lines.append("| policy | peak allocated | peak reserved | min capacity | fits H100 80GB |")
    lines.append("|---|---|---|---|---|")
    lines += [f"| {p['policy']} | {_gib(p['peak_allocated'])} | {_gib(p['peak_reserved'])} | "
              f"{_gib(p['min_capacity'])} | {'yes' if p['fits'] else 'no'} |" for p in r["policies"]]
    return "\n".join(lines)


def _machine() -> str:
    import platform

    cpu = cpu_model(platform.processor())
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}"


def write_results(table: str, r: dict, path: Path = RESULTS) -> None:
    import torch

    body = "\n".join(["## Prediction at scale", "",
                      f"Measured with `python benchmarks/bench_predict.py --write` on {_machine()}, torch "
                      f"{torch.__version__}, no GPU, {time.strftime('%Y-%m-%d')}. The prediction runs in a child "
                      "process; its peak RSS is getrusage(RUSAGE_SELF).ru_maxrss read in that child at the end. The wall time "
                      "is the whole amem_alloc.predict() call: starting the session (importing torch._dynamo and the "
                      "engine, a few seconds), building the model and running the step on fake tensors (recording), "
                      "and the analysis.",
                      "", table, ""])
    replace_section(path, BEGIN, END, body)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tiny config: smoke only, judges nothing")
    parser.add_argument("--write", action="store_true", help="update the section in benchmarks/RESULTS.md")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--config", default="7b", choices=("7b", "tiny"), help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.config, args.steps, args.batch)))
        return 0
    r = measure(args.quick)
    table = render(r, args.quick)
    print(table)
    if "error" in r:
        print(r.get("stderr", ""), file=sys.stderr)
        return 1
    if args.write and not args.quick:
        write_results(table, r)
        print(f"wrote {RESULTS}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
