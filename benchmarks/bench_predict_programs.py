"""Real programs predicted: how long `amem predict` takes on each program of tests/programs/ (HF
Trainer, a GQA Llama loop, ResNet-50 with AMP, a DataLoader with workers, fused and foreach AdamW, a
compiled step, nanoGPT's own train.py), and what it answers.

    python benchmarks/bench_predict_programs.py            # the larger sizes; prints the table
    python benchmarks/bench_predict_programs.py --write    # ... and writes its section of RESULTS.md
    python benchmarks/bench_predict_programs.py --quick    # the test suite's small sizes (a smoke)
    python benchmarks/bench_predict_programs.py nanogpt hf_trainer   # some programs only

Each prediction is `amem predict --gpu H100 --json ... -- python PROGRAM ARGS` in a child process,
run from the program's folder exactly as a user would. Wall time is the child's from start to exit
(importing torch and the libraries, fake execution, the analysis under the five policies); CPU
time and peak resident memory come from wait4() on that child (its CPU time includes the
DataLoader workers it waited for; peak RSS is the child's own). Target: every program under 60 s
on this 2-core machine. The amem used is whichever `amem_alloc` this interpreter imports.
"""
from __future__ import annotations

import argparse
import importlib.util
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
from results_file import cpu_model, replace_section  # noqa: E402

RESULTS = HERE / "RESULTS.md"
BEGIN = "<!-- BEGIN real programs predicted: written by `python benchmarks/bench_predict_programs.py --write`; do not edit inside -->"
END = "<!-- END real programs predicted -->"
TARGET_S = 60.0
MiB, GiB = 1 << 20, 1 << 30


def amem_path() -> str:
    spec = importlib.util.find_spec("amem_alloc")
    if spec is None or not spec.origin:
        raise SystemExit("amem_alloc is not importable")
    return str(Path(spec.origin).resolve().parent.parent)


def measure(program: pf.Program, size: str, scratch: Path, timeout: float) -> dict:
    """One prediction in a child process: its times, peak RSS and answer (or its error)."""
    args = program.args(size)
    out = scratch / program.name
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / "prediction.json"
    argv = [sys.executable, "-m", "amem_alloc", "predict", "--gpu", "H100", "--json", str(json_path), "--",
            "python", program.script, *args]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMEM_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (amem_path(), os.environ.get("PYTHONPATH")) if p)
    env["HF_HUB_OFFLINE"] = env["TRANSFORMERS_OFFLINE"] = "1"
    row = {"program": program.name, "args": " ".join(args), "size": size}
    with open(out / "stdout", "w") as so, open(out / "stderr", "w") as se:
        started = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=program.workdir(scratch), env=env, stdout=so, stderr=se)
        deadline = started + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.05)
        wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    row.update(wall_s=wall, cpu_s=usage.ru_utime + usage.ru_stime, maxrss=usage.ru_maxrss * 1024,
               exit=proc.returncode)
    if proc.returncode == 0 and json_path.exists():
        data = json.loads(json_path.read_text())
        torch_row = next(r for r in data["policies"] if r["policy"] == "torch")
        fig = program.expected(size)
        row.update(peak_allocated=torch_row["peak_allocated"], peak_reserved=torch_row["peak_reserved"],
                   fits=torch_row["fits"], at_peak=data["at_peak"], recording_s=data["seconds"].get("recording"),
                   analysis_s=data["seconds"].get("analysis"), notes=len(data.get("notes", [])),
                   first_principles={"parameter": fig.parameter, "gradient": fig.gradient,
                                     "optimizer_state": fig.optimizer_state, "activation": fig.activation})
    else:
        lines = [ln for ln in (out / "stderr").read_text().splitlines() if ln.strip()]
        row["error"] = lines[-1][:200] if lines else f"exit {proc.returncode}"
    return row


def amem_commit() -> str:
    """The commit of the amem_alloc checkout measured (with "+changes" if its tree differs)."""
    import subprocess as sp
    where = amem_path()
    try:
        head = sp.run(["git", "-C", where, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                      check=True).stdout.strip()
        dirty = sp.run(["git", "-C", where, "status", "--porcelain", "--", "amem_alloc"], capture_output=True,
                       text=True).stdout.strip()
        return head + ("+changes" if dirty else "")
    except (OSError, sp.CalledProcessError):
        return "unknown"


def _mib(n) -> str:
    return f"{n / MiB:,.1f}" if isinstance(n, (int, float)) else "-"


def table(rows: list[dict]) -> list[str]:
    head = ["program", "wall s", "CPU s", "peak RSS MiB", "peak alloc. MiB (torch)", "peak reserved MiB",
            "params+grads+opt. at peak MiB", "params, opt. state = first principles", "status"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        ap = r.get("at_peak", {})
        state = sum(ap.get(k, 0) for k in ("parameter", "gradient", "optimizer_state")) if ap else None
        status = "ok" if r["exit"] == 0 else f"exit {r['exit']}: {r.get('error', '')}"
        fp = r.get("first_principles")
        exact = "-" if not fp else ("yes" if all(ap.get(k, 0) == fp[k] for k in ("parameter", "optimizer_state"))
                                    else "NO")
        if r["exit"] == 0 and r["wall_s"] > TARGET_S:
            status = f"ok, over {TARGET_S:.0f} s"
        lines.append(f"| {r['program']} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | {_mib(r['maxrss'])} | "
                     f"{_mib(r.get('peak_allocated'))} | {_mib(r.get('peak_reserved'))} | {_mib(state)} | {exact} | {status} |")
    return lines


def section(rows: list[dict], size: str) -> str:
    import torch

    load = os.getloadavg()
    args = "\n".join(f"* `{r['program']}`: `{pf.BY_NAME[r['program']].script} {r['args']}`" for r in rows)
    return "\n".join([
        "## Real programs predicted (issue 20)", "",
        f"`amem predict --gpu H100` on each program of tests/programs/ ({size} sizes), one child process each, "
        f"measured by benchmarks/bench_predict_programs.py on {cpu_model()} ({os.cpu_count()} cores, "
        f"load average {load[0]:.1f} at the end), torch {torch.__version__}, amem at {amem_commit()}, "
        f"{time.strftime('%Y-%m-%d')}. "
        f"Wall: the child from start to exit (imports included); CPU: its user+system time (DataLoader "
        f"workers included); RSS: its peak. Target: under {TARGET_S:.0f} s each.", "",
        *table(rows), "",
        "Each prediction stops the script after amem's default 5 optimizer steps (`--steps`), as a user's "
        "run of `amem predict` would. \"= first principles\": parameters (with buffers) and optimizer state "
        "at the predicted peak equal, to the byte, what tests/program_figures.py computes from the "
        "configuration alone; tests/test_predict_programs.py also checks gradients (exact) and activations "
        "(within each program's stated tolerance).", "",
        "Arguments (each program's own command line):", "", args, ""]) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("programs", nargs="*", help=f"some of: {', '.join(pf.BY_NAME)}")
    ap.add_argument("--quick", action="store_true", help="the test suite's small sizes")
    ap.add_argument("--write", action="store_true", help="write the section of benchmarks/RESULTS.md")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--json", help="also write the rows here")
    opts = ap.parse_args(argv)
    unknown = [n for n in opts.programs if n not in pf.BY_NAME]
    if unknown:
        ap.error(f"unknown program(s): {', '.join(unknown)}")
    size = "smoke" if opts.quick else "full"
    rows = []
    with tempfile.TemporaryDirectory(prefix="amem-bench-programs-") as scratch:
        for program in [pf.BY_NAME[n] for n in opts.programs] or pf.PROGRAM_LIST:
            if any(importlib.util.find_spec(m) is None for m in program.needs):
                print(f"{program.name}: skipped ({', '.join(program.needs)} not installed)")
                continue
            row = measure(program, size, Path(scratch), opts.timeout)
            rows.append(row)
            print(table([row])[-1], flush=True)
    print("\n".join(table(rows)))
    if opts.json:
        Path(opts.json).write_text(json.dumps(rows, indent=1))
    if opts.write:
        replace_section(RESULTS, BEGIN, END, section(rows, size))
        print(f"wrote {RESULTS}")
    return 0 if all(r["exit"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
