"""Predicted vs real, on a GPU: each case predicted (no GPU used: its processes see no CUDA device),
then run for real with torch's native allocator (default settings), in fresh processes; one table of
peak allocated, peak reserved and the device total (what nvidia-smi shows for the process),
predicted vs real, and the error.

    python benchmarks/bench_predict_gpu.py OUT_DIR [--cases gpt,nanogpt,...] [--deadline SECONDS]

Writes OUT_DIR/predict_vs_real.json and OUT_DIR/predict_vs_real.md, and each program's real
snapshot (torch's own memory history) under OUT_DIR/real/. Without a CUDA device it prints
"skipped: no CUDA device" and exits 0 (so CI can smoke it). Cases:

* the bundled workloads (gpt, mlp, mlp-checkpoint, decode at size 1 with 3 steps; a LLaMA-shaped
  model of 0.5e9 parameters, 2 steps) and the five lm_medium scripts of the shared real traces
  (tests/predict_models/lm_medium.py), called in-process (amem_alloc.predict(fn));
* real programs, unchanged (tests/programs/, PROGRAMS below): `amem predict --json -- python
  SCRIPT ARGS` against benchmarks/real_run.py running the same command line. A prediction that
  fails or stops is a row that says so: the real figure stays for when it runs.

The predicted device total is the prediction's peak reserved (torch's policy) plus the memory
outside the allocator that `amem doctor --calibrate` measured on this card (its training-step
stage; cuDNN's part too for convolutional programs), when a calibration file is given
(--calibration) or found; the real one is benchmarks/real_run.py's device_total_peak.
Peaks are over the whole run, predicted and real alike.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PROGRAMS_DIR = ROOT / "tests" / "programs"
WORKLOAD_CASES = {"gpt": ("gpt", 1, 3), "mlp": ("mlp", 1, 3), "mlp-checkpoint": ("mlp-checkpoint", 1, 3),
                  "decode": ("decode", 1, 3), "moe": ("moe", 1, 3),
                  "llama-0.5b": ("llama7b", 1, 2)}
TIMEOUTS = {"predict": 420.0, "real": 600.0}   # seconds a child may take (--predict-timeout, --real-timeout)
ENDS = [float("inf")]                          # time.monotonic() by which every child has ended (--budget)


def _time_left(limit: float) -> float:
    return max(1.0, min(limit, ENDS[0] - time.monotonic()))


@dataclass(frozen=True)
class ProgramCase:
    script: str                      # relative to tests/programs (nanogpt/train.py runs in a prepared copy)
    args: tuple
    needs: tuple = ()
    cudnn: bool = False              # convolutions: cuDNN's handle and kernels count outside the allocator
    notes: str = ""                  # what the prediction is known not to model yet


PROGRAMS: dict[str, ProgramCase] = {
    "nanogpt": ProgramCase("nanogpt/train.py", ("config/train_shakespeare_char.py", "--max_iters=3",
                                                "--eval_iters=2", "--compile=False")),
    "nanogpt-compiled": ProgramCase("nanogpt/train.py", ("config/train_shakespeare_char.py", "--max_iters=3",
                                                         "--eval_iters=2"), notes="torch.compile, predicted eager"),
    "hf_trainer": ProgramCase("hf_trainer.py", ("--layers", "4", "--embd", "256", "--seq", "256", "--batch", "8",
                                                "--bf16"), needs=("transformers", "accelerate")),
    "hf_llama_gqa": ProgramCase("hf_llama_gqa.py", ("--hidden", "2048", "--intermediate", "5632", "--layers", "4",
                                                    "--seq", "1024", "--batch", "4"), needs=("transformers",)),
    "resnet50_amp": ProgramCase("resnet50_amp.py", ("--batch", "32"), needs=("torchvision",), cudnn=True),
    "resnet50_amp-cudnn-benchmark": ProgramCase("resnet50_amp.py", ("--batch", "32", "--cudnn-benchmark"),
                                                needs=("torchvision",), cudnn=True,
                                                notes="cudnn.benchmark: the search's workspaces"),
    "detection_fasterrcnn": ProgramCase("detection_fasterrcnn.py", ("--batch", "2", "--image", "512"),
                                        needs=("torchvision",), cudnn=True,
                                        notes="data-dependent shapes, predicted at their upper bound"),
    "fused_adamw": ProgramCase("fused_adamw.py", ("--impl", "fused", "--d-model", "512", "--layers", "6",
                                                  "--seq", "512")),
    "compiled_step": ProgramCase("compiled_step.py", ("--width", "4096", "--depth", "8", "--batch", "256"),
                                 notes="torch.compile, predicted eager"),
    "flex_attention_decoder": ProgramCase("flex_attention_decoder.py", ("--d-model", "1024", "--heads", "16",
                                                                        "--layers", "4", "--seq", "2048",
                                                                        "--batch", "4")),
    "hf_generate": ProgramCase("hf_generate.py", ("--new-tokens", "256"), needs=("transformers",)),
}


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
    """(fn, args, kwargs): the code of one in-process case, run as fn(*args, **kwargs) on device "cuda"."""
    from amem_alloc import workloads

    if name in WORKLOAD_CASES:
        workload, size, steps = WORKLOAD_CASES[name]
        kwargs = {"config": _llama_mid()} if name.startswith("llama") else {}
        return workloads.get(workload), (size, steps, "cuda", 0, None), kwargs
    extra = _extra_cases()
    if name not in extra:
        raise SystemExit(f"unknown case {name!r}; choose from {', '.join(all_cases())}")
    fn, args = extra[name]
    return fn, tuple(args), {}


def all_cases() -> list[str]:
    return [*PROGRAMS, *WORKLOAD_CASES, *_extra_cases()]


def child(what: str, name: str, gpu: str) -> dict:
    fn, args, kwargs = case(name)
    started = time.perf_counter()
    if what == "predict":
        import amem_alloc

        p = amem_alloc.predict(fn, *args, gpu=gpu, policies="torch", **kwargs)
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


# ============================================================================ running the children
def _env(predicting: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("AMEM_ENABLE", "AMEM_CONF", "PYTORCH_CUDA_ALLOC_CONF")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env["HF_HUB_OFFLINE"] = env["TRANSFORMERS_OFFLINE"] = "1"
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    if predicting:
        env["CUDA_VISIBLE_DEVICES"] = ""   # a prediction must not touch the GPU (nor count on its memory)
    return env


def _last_line_error(proc: subprocess.CompletedProcess) -> dict:
    lines = [ln for ln in (proc.stderr or "").strip().splitlines() if ln.strip()]
    return {"error": lines[-1] if lines else f"exit status {proc.returncode}", "returncode": proc.returncode}


def _run(argv: list[str], cwd: Path, predicting: bool, timeout: float, log: Path) -> subprocess.CompletedProcess:
    timeout = _time_left(timeout)
    try:
        proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, env=_env(predicting), timeout=timeout,
                              check=False)
    except subprocess.TimeoutExpired as err:
        out = err.stdout.decode(errors="replace") if isinstance(err.stdout, bytes) else (err.stdout or "")
        proc = subprocess.CompletedProcess(argv, -9, out, f"stopped after {timeout:.0f} s (timeout)")
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(f"$ {' '.join(map(str, argv))}\n(cwd {cwd})\nrc={proc.returncode}\n--- stdout\n{proc.stdout}\n"
                   f"--- stderr\n{proc.stderr}")
    return proc


def _spawn_inprocess(what: str, name: str, gpu: str, out: Path) -> dict:
    argv = [sys.executable, str(Path(__file__).resolve()), "--child", what, name, "--gpu", gpu]
    proc = _run(argv, ROOT, what == "predict", TIMEOUTS[what], out / "logs" / f"{what}-{name}.txt")
    return _last_line_error(proc) if proc.returncode != 0 else json.loads(proc.stdout.strip().splitlines()[-1])


def _workdir(name: str, out: Path, kind: str) -> Path:
    """Where the program runs: its own folder, or for nanoGPT a prepared copy (one per kind of run)."""
    if PROGRAMS[name].script.startswith("nanogpt/"):
        sys.path.insert(0, str(ROOT / "tests"))
        import program_figures as pf  # noqa: E402  (tests/ holds the nanoGPT data maker)

        return pf.nanogpt_workdir(out / "work" / f"{name}-{kind}")
    return PROGRAMS_DIR


def _predict_program(name: str, gpu: str, out: Path) -> dict:
    c = PROGRAMS[name]
    script = Path(c.script).name if c.script.startswith("nanogpt/") else c.script
    json_path = out / "predicted" / f"{name}.json"
    json_path.parent.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "amem_alloc", "predict", "--gpu", gpu, "--json", str(json_path), "--",
            "python", script, *c.args]
    started = time.perf_counter()
    proc = _run(argv, _workdir(name, out, "predict"), True, TIMEOUTS["predict"], out / "logs" / f"predict-{name}.txt")
    if proc.returncode != 0 or not json_path.exists():
        return _last_line_error(proc)
    data = json.loads(json_path.read_text())
    row = next(r for r in data["policies"] if r["policy"] == "torch")
    return {"peak_allocated": row["peak_allocated"], "peak_reserved": row["peak_reserved"],
            "seconds": time.perf_counter() - started}


def _real_program(name: str, out: Path) -> dict:
    c = PROGRAMS[name]
    script = Path(c.script).name if c.script.startswith("nanogpt/") else c.script
    json_path, snap = out / "real" / f"{name}.json", out / "real" / f"{name}.pickle"
    json_path.parent.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, str(HERE / "real_run.py"), "--out", str(json_path), "--snapshot", str(snap), "--",
            script, *c.args]
    proc = _run(argv, _workdir(name, out, "real"), False, TIMEOUTS["real"], out / "logs" / f"real-{name}.txt")
    if not json_path.exists():
        return _last_line_error(proc)
    data = json.loads(json_path.read_text())
    return data if not data.get("error") else {"error": data["error"], **data}


# ============================================================================ the table
def _err(pred: int | None, real: int | None) -> str:
    return f"{(pred - real) / real:+.2%}" if pred is not None and real else "n/a"


def _mib(n: int | None) -> str:
    return "—" if n is None else f"{n / (1 << 20):.1f} MiB"


def predicted_device_total(name: str, predicted: dict, calibration: dict | None) -> int | None:
    if calibration is None or "peak_reserved" not in predicted or calibration.get("context") is None:
        return None
    beyond = calibration.get("beyond_context", {})
    outside = calibration["context"] + (beyond.get("training_step") or 0)
    if name in PROGRAMS and PROGRAMS[name].cudnn:
        outside += beyond.get("cudnn") or 0
    return predicted["peak_reserved"] + outside


def table(rows: list[dict]) -> str:
    out = ["| case | predicted peak allocated | real | error | predicted peak reserved | real | error | "
           "predicted device total | real | error |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        p, g = r["predicted"], r["real"]
        if "error" in g:
            out.append(f"| {r['case']} | real run failed: {g['error']} | | | | | | | | |")
            continue
        if "error" in p:
            out.append(f"| {r['case']} | prediction failed: {p['error'][:160]} | {_mib(g['peak_allocated'])} | | | "
                       f"{_mib(g['peak_reserved'])} | | | {_mib(g.get('device_total_peak'))} | |")
            continue
        dt = r.get("predicted_device_total")
        out.append(f"| {r['case']} | {_mib(p['peak_allocated'])} | {_mib(g['peak_allocated'])} | "
                   f"{_err(p['peak_allocated'], g['peak_allocated'])} | {_mib(p['peak_reserved'])} | "
                   f"{_mib(g['peak_reserved'])} | {_err(p['peak_reserved'], g['peak_reserved'])} | "
                   f"{_mib(dt)} | {_mib(g.get('device_total_peak'))} | {_err(dt, g.get('device_total_peak'))} |")
    notes = [f"- {r['case']}: {PROGRAMS[r['case']].notes}" for r in rows if r["case"] in PROGRAMS
             and PROGRAMS[r["case"]].notes]
    return "\n".join(out + ([""] + notes if notes else []))


# ============================================================================ the command
def _cuda() -> bool:
    if not any(os.path.exists(p) for p in ("/dev/nvidiactl", "/proc/driver/nvidia")):
        return False
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


def _device_name() -> str:
    """The card's name as torch gives it, through NVML where it is (no CUDA context in this process)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
        return name.decode() if isinstance(name, bytes) else name
    except Exception:  # noqa: BLE001
        proc = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True, check=False)
        return proc.stdout.strip().splitlines()[0] if proc.stdout.strip() else "?"


def gpu_key(device_name: str) -> str:
    """The `--gpu` key amem knows for a card torch names `device_name` (H100-80GB when none matches)."""
    from amem_alloc.predict import gpus

    return next((g.key for g in gpus.GPUS.values() if g.name == device_name), gpus.DEFAULT)


def _usable(name: str) -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in PROGRAMS[name].needs) if name in PROGRAMS else True


def _real(name: str, gpu: str, out: Path, ends: float) -> dict:
    if time.monotonic() > ends:
        return {"error": "not run: the deadline passed"}
    result = _real_program(name, out) if name in PROGRAMS else _spawn_inprocess("real", name, gpu, out)
    print(f"{name}: real run done ({'failed' if 'error' in result else 'ok'})", file=sys.stderr, flush=True)
    return result


def run_all(names: list[str], out: Path, deadline: float, calibration: dict | None, real_jobs: int = 1) -> list[dict]:
    """Every case predicted (side by side on the CPU) and run for real (`real_jobs` at a time on the GPU:
    each real figure is the process's own, so runs side by side do not change them)."""
    gpu = gpu_key(_device_name())
    ends = time.monotonic() + deadline
    with ThreadPoolExecutor(max_workers=max(1, min(4, (os.cpu_count() or 2) // 3))) as predictors, \
            ThreadPoolExecutor(max_workers=real_jobs) as runners:
        predicted = {n: predictors.submit(_predict_program if n in PROGRAMS else _spawn_inprocess,
                                          *((n, gpu, out) if n in PROGRAMS else ("predict", n, gpu, out)))
                     for n in names}
        real = {n: runners.submit(_real, n, gpu, out, ends) for n in names}
        rows = []
        for n in names:
            p = predicted[n].result()
            rows.append({"case": n, "gpu": gpu, "predicted": p, "real": real[n].result(),
                         "predicted_device_total": predicted_device_total(n, p, calibration)})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", type=Path, default=Path("predict-vs-real"))
    parser.add_argument("--cases", help="comma-separated case names (default: all)")
    parser.add_argument("--deadline", type=float, default=3600.0, help="seconds after which no new real run starts")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds after which every child still running is stopped and the table written")
    parser.add_argument("--predict-timeout", type=float, default=TIMEOUTS["predict"], help="seconds per prediction")
    parser.add_argument("--real-timeout", type=float, default=TIMEOUTS["real"], help="seconds per real run")
    parser.add_argument("--real-jobs", type=int, default=1, help="real runs side by side on the GPU")
    parser.add_argument("--calibration", type=Path, help="amem doctor --calibrate's file (default: its own place)")
    parser.add_argument("--child", nargs=2, metavar=("WHAT", "CASE"), help=argparse.SUPPRESS)
    parser.add_argument("--gpu", default="H100-80GB", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    TIMEOUTS.update(predict=args.predict_timeout, real=args.real_timeout)
    if args.budget:
        ENDS[0] = time.monotonic() + args.budget
    if args.child:
        print(json.dumps(child(*args.child, args.gpu)))
        return 0
    if not _cuda():
        print("skipped: no CUDA device")
        return 0
    names = args.cases.split(",") if args.cases else [n for n in all_cases() if _usable(n)]
    unknown = [n for n in names if n not in all_cases()]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; choose from {', '.join(all_cases())}")
    from amem_alloc import calibration as calib

    device = _device_name()
    cal = calib.for_device(device, args.calibration)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = run_all(names, args.out, args.deadline, cal, args.real_jobs)
    real = next((r["real"] for r in rows if r["real"].get("torch")), {})
    header = (f"Predicted (no GPU used, `--gpu {rows[0]['gpu'] if rows else '?'}`) vs real on {device}, torch "
              f"{real.get('torch', '?')}, native allocator, default settings; device total: "
              + (f"calibrated context {cal['context'] / (1 << 20):.0f} MiB ({cal['date']})" if cal else
                 "no calibration found"))
    (args.out / "predict_vs_real.json").write_text(json.dumps({"calibration": cal, "rows": rows}, indent=1))
    (args.out / "predict_vs_real.md").write_text(header + "\n\n" + table(rows) + "\n")
    print(header + "\n\n" + table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
