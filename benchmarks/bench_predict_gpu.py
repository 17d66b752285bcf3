"""Predicted vs real, on a GPU: each case predicted (no GPU used), then run for real with torch's
native allocator (default settings), in fresh processes; one table of peak allocated and peak
reserved, predicted vs real, and the error.

    python benchmarks/bench_predict_gpu.py OUT_DIR [--cases gpt,mlp,...]

Writes OUT_DIR/predict_vs_real.json and OUT_DIR/predict_vs_real.md. Without a CUDA device it
prints "skipped: no CUDA device" and exits 0 (so CI can smoke it). Cases: the bundled workloads
(gpt, mlp, mlp-checkpoint, decode at size 1 with 3 steps; a LLaMA-shaped model of 0.5e9
parameters, 2 steps, that fits an 80 GB card), plus the five lm_medium scripts of the shared real
traces (tests/predict_models/lm_medium.py; `gpu_cases()` there, if defined, overrides the list).
Peaks are over the whole run, predicted and real alike (not the traces' recorded window).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WORKLOAD_CASES = {"gpt": ("gpt", 1, 3), "mlp": ("mlp", 1, 3), "mlp-checkpoint": ("mlp-checkpoint", 1, 3),
                  "decode": ("decode", 1, 3), "llama-0.5b": ("llama7b", 1, 2)}


def _llama_mid():
    from amem_alloc.workloads.llama import LlamaConfig

    return LlamaConfig(layers=8, d_model=2048, heads=16, d_ff=5504, vocab=32000, seq=2048)


def _extra_cases() -> dict:
    """The five lm_medium scripts (tests/predict_models/lm_medium.py: the documented script of the
    shared real traces), whole run with its 5 warm-up steps, autocast as each trace was made."""
    try:
        sys.path.insert(0, str(ROOT / "tests" / "predict_models"))
        import lm_medium  # type: ignore[import-not-found]
    except ImportError:
        return {}
    if hasattr(lm_medium, "gpu_cases"):
        return dict(lm_medium.gpu_cases())
    return {f"lm_medium_ctx{ctx}_{mode}": (lm_medium.run, (ctx, mode, "cuda", 5, autocast))
            for (ctx, mode), autocast in lm_medium.TRACES.items()}


def case(name: str):
    """(fn, args, kwargs): the code of one case, run as fn(*args, **kwargs) on device "cuda"."""
    from amem_alloc import workloads

    if name in WORKLOAD_CASES:
        workload, size, steps = WORKLOAD_CASES[name]
        kwargs = {"config": _llama_mid()} if name.startswith("llama") else {}
        return workloads.get(workload), (size, steps, "cuda", 0, None), kwargs
    extra = _extra_cases()
    if name not in extra:
        raise SystemExit(f"unknown case {name!r}; choose from {', '.join([*WORKLOAD_CASES, *extra])}")
    fn, args = extra[name]
    return fn, tuple(args), {}


def child(what: str, name: str) -> dict:
    fn, args, kwargs = case(name)
    started = time.perf_counter()
    if what == "predict":
        import amem_alloc

        p = amem_alloc.predict(fn, *args, gpu="H100-80GB", policies="torch", **kwargs)
        row = p.row("torch")
        return {"peak_allocated": row.peak_allocated, "peak_reserved": row.peak_reserved,
                "seconds": time.perf_counter() - started}
    import torch

    fn(*args, **kwargs)
    torch.cuda.synchronize()
    stats = torch.cuda.memory_stats()
    return {"peak_allocated": stats["allocated_bytes.all.peak"], "peak_reserved": stats["reserved_bytes.all.peak"],
            "seconds": time.perf_counter() - started, "device": torch.cuda.get_device_name(0),
            "torch": torch.__version__}


def _spawn(what: str, name: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("AMEM_ENABLE", "AMEM_CONF", "PYTORCH_CUDA_ALLOC_CONF")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", what, name],
                          capture_output=True, text=True, env=env, timeout=600, check=False)
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        return {"error": lines[-1] if lines else f"exit status {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _err(pred: int, real: int) -> str:
    return f"{(pred - real) / real:+.2%}" if real else "n/a"


def table(rows: list[dict]) -> str:
    out = ["| case | predicted peak allocated | real | error | predicted peak reserved | real | error |",
           "|---|---|---|---|---|---|---|"]
    mib = lambda n: f"{n / (1 << 20):.1f} MiB"  # noqa: E731
    for r in rows:
        p, g = r["predicted"], r["real"]
        if "error" in p or "error" in g:
            out.append(f"| {r['case']} | {p.get('error', '')} | {g.get('error', '')} | | | | |")
            continue
        out.append(f"| {r['case']} | {mib(p['peak_allocated'])} | {mib(g['peak_allocated'])} | "
                   f"{_err(p['peak_allocated'], g['peak_allocated'])} | {mib(p['peak_reserved'])} | "
                   f"{mib(g['peak_reserved'])} | {_err(p['peak_reserved'], g['peak_reserved'])} |")
    return "\n".join(out)


def _cuda() -> bool:
    if not any(os.path.exists(p) for p in ("/dev/nvidiactl", "/proc/driver/nvidia")):
        return False
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", type=Path, default=Path("predict-vs-real"))
    parser.add_argument("--cases", help="comma-separated case names (default: all)")
    parser.add_argument("--child", nargs=2, metavar=("WHAT", "CASE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(*args.child)))
        return 0
    if not _cuda():
        print("skipped: no CUDA device")
        return 0
    names = args.cases.split(",") if args.cases else [*WORKLOAD_CASES, *_extra_cases()]
    # predictions use no GPU: they run side by side while the real runs take the GPU one at a time
    with ThreadPoolExecutor(max_workers=max(1, min(8, (os.cpu_count() or 2) - 1))) as pool:
        predicted = {name: pool.submit(_spawn, "predict", name) for name in names}
        real = {}
        for name in names:
            real[name] = _spawn("real", name)
            print(f"{name}: real run done", file=sys.stderr, flush=True)
        rows = [{"case": name, "predicted": predicted[name].result(), "real": real[name]} for name in names]
    args.out.mkdir(parents=True, exist_ok=True)
    text = table(rows)
    device = next((r["real"].get("device") for r in rows if r["real"].get("device")), "?")
    torch_v = next((r["real"].get("torch") for r in rows if r["real"].get("torch")), "?")
    header = f"Predicted (no GPU used) vs real on {device}, torch {torch_v}, native allocator, default settings."
    (args.out / "predict_vs_real.json").write_text(json.dumps(rows, indent=1))
    (args.out / "predict_vs_real.md").write_text(header + "\n\n" + text + "\n")
    print(header + "\n\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
