"""`amem doctor --calibrate`: the device memory a process holds outside torch's caching allocator,
measured on this machine's GPU, for this torch and driver.

Design note
-----------
What nvidia-smi shows for a training process is torch's reserved memory plus what the allocator
never sees: the CUDA context (its size depends on the card, the driver, and whether kernels load
lazily, CUDA_MODULE_LOADING=LAZY, torch's default since CUDA 11.7, or eagerly), the cuBLAS and
cuBLASLt handles, cuDNN's handle and the kernels it loads, NCCL's communicator buffers, and every
kernel module loaded on first use. No published figure covers every card and stack, so this
measures them where they run.

Each stage runs in a fresh process (a context cannot be unloaded) that does the least work that
brings the part in, then reads what NVML shows for the process (nvidia-smi's per-process figure;
without it, the device's used memory against NVML's reading before CUDA started) and subtracts
what torch's allocator reserved. Stages, each on top of the
CUDA context:

    context          torch.empty(1, device="cuda"): the context alone (lazy loading)
    context_eager    the same with CUDA_MODULE_LOADING=EAGER: every kernel of torch loaded
    cublas           fp32 and bf16 matrix products (cuBLAS and cuBLASLt handles)
    cudnn            a convolution forward and backward (cuDNN's handle and kernels)
    training_step    an MLP and an attention layer trained one step under bf16 autocast with AdamW:
                     what a typical training process holds beside the allocator
    inference_step   the same layers' forward pass only, under torch.inference_mode: what an
                     inference loop holds
    nccl             a one-rank NCCL process group and an all-reduce

The GPU must be otherwise idle: other processes' memory would be counted (checked: NVML's used
memory before each stage must equal the first stage's within 2 MiB, or the result is refused).
Results go to a JSON file (calibration_path()), one entry per (card, driver, torch, CUDA); every
prediction for that card takes what the process holds outside the allocator from there
(predict/gpus.py `with_calibration`, predict/context.py), and says so.
"""
from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

MiB = 1 << 20
STAGES = ("context", "context_eager", "cublas", "cudnn", "training_step", "inference_step", "nccl")
IDLE_TOLERANCE = 2 * MiB


# ---------------------------------------------------------------------------- where results live
def calibration_path() -> Path:
    """$AMEM_CALIBRATION, else $XDG_CACHE_HOME/amem_alloc/calibration.json (~/.cache by default)."""
    if os.environ.get("AMEM_CALIBRATION"):
        return Path(os.environ["AMEM_CALIBRATION"])
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "amem_alloc" / "calibration.json"


def load(path: Path | None = None) -> list[dict]:
    """Every calibration entry written on this machine (an unreadable file reads as none)."""
    path = path or calibration_path()
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    return [e for e in data.get("entries", []) if isinstance(e, dict)] if isinstance(data, dict) else []


def for_device(name: str, path: Path | None = None) -> dict | None:
    """The latest entry measured on a card torch names `name`, or None."""
    entries = [e for e in load(path) if e.get("device") == name]
    return max(entries, key=lambda e: e.get("date", "")) if entries else None


def _save(entry: dict, path: Path) -> None:
    from .atomic_write import write_text

    key = ("device", "driver", "torch", "cuda")
    kept = [e for e in load(path) if tuple(e.get(k) for k in key) != tuple(entry.get(k) for k in key)]
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps({"entries": [*kept, entry]}, indent=1) + "\n")


# ---------------------------------------------------------------------------- one stage, in a child
def _nvml_used() -> int | None:
    """The device's used memory as NVML reads it (starts no CUDA context), or None without NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).used)
    except Exception:  # noqa: BLE001
        return None


def _nvml_process_used() -> int | None:
    """This process's device memory as NVML lists it (what nvidia-smi shows per process), or None."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        return next((int(p.usedGpuMemory) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
                     if p.pid == os.getpid() and p.usedGpuMemory is not None), None)
    except Exception:  # noqa: BLE001
        return None


def _work(stage: str, torch) -> None:
    x = torch.empty(1, device="cuda")
    if stage in ("cublas", "training_step", "inference_step"):
        a = torch.randn(1024, 1024, device="cuda")
        (a @ a).sum().item()
        (a.bfloat16() @ a.bfloat16()).sum().item()
    if stage == "cudnn":
        conv = torch.nn.Conv2d(16, 32, 3).cuda()
        conv(torch.randn(4, 16, 32, 32, device="cuda", requires_grad=True)).sum().backward()
    if stage == "training_step":
        _training_step(torch)
    if stage == "inference_step":
        with torch.inference_mode():
            _forward(torch)
    if stage == "nccl":
        _nccl(torch)
    torch.cuda.synchronize()
    del x


def _forward(torch):
    """An MLP and an attention layer under bf16 autocast: (their parameters, the loss)."""
    from torch import nn

    model = nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 512), nn.LayerNorm(512)).cuda()
    attn = nn.MultiheadAttention(512, 8, batch_first=True).cuda()
    x = torch.randn(8, 128, 512, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        h = model(x)
        y, _ = attn(h, h, h, need_weights=False)
        loss = torch.nn.functional.cross_entropy(y.flatten(0, 1).float(), torch.zeros(8 * 128, dtype=torch.long,
                                                                                       device="cuda"))
    return [*model.parameters(), *attn.parameters()], loss


def _training_step(torch) -> None:
    params, loss = _forward(torch)
    opt = torch.optim.AdamW(params)
    loss.backward()
    opt.step()


def _nccl(torch) -> None:
    import tempfile

    import torch.distributed as dist

    store = dist.FileStore(tempfile.mktemp(prefix="amem-calibrate-"), 1)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=torch.device("cuda", 0))
    t = torch.ones(1 << 20, device="cuda")
    dist.all_reduce(t)
    torch.cuda.synchronize()
    dist.destroy_process_group()


def measure_stage(stage: str) -> dict:
    """Runs one stage in this (fresh) process; the device memory it took, and torch's part of it."""
    before = _nvml_used()
    import torch

    _work(stage, torch)
    free, total = torch.cuda.mem_get_info()
    out = {"stage": stage, "before": before, "after": _nvml_used(), "process_used": _nvml_process_used(),
           "cuda_used": total - free, "reserved": torch.cuda.memory_reserved(),
           "device": torch.cuda.get_device_name(0), "total_memory": total, "torch": torch.__version__,
           "cuda": torch.version.cuda}
    out["outside_allocator"] = outside_allocator(out)
    return out


def outside_allocator(stage: dict) -> int | None:
    """What the process holds beyond torch's reserved memory: NVML's figure for the process (what
    nvidia-smi lists), else the device's NVML reading after less before. Never cudaMemGetInfo's
    total less free against NVML's used: the two count from different totals (on an H200 with
    driver 580, NVML's total is 615 MiB above CUDA's, and its idle 'used' holds that reserve)."""
    if stage.get("process_used"):
        return stage["process_used"] - stage["reserved"]
    if stage.get("before") is not None and stage.get("after") is not None:
        return stage["after"] - stage["before"] - stage["reserved"]
    return None


# ---------------------------------------------------------------------------- the command
def _child(stage: str) -> dict:
    env = dict(os.environ)
    env.pop("AMEM_ENABLE", None)
    env["CUDA_MODULE_LOADING"] = "EAGER" if stage == "context_eager" else env.get("CUDA_MODULE_LOADING", "LAZY")
    proc = subprocess.run([sys.executable, "-m", "amem_alloc.calibration", stage], capture_output=True, text=True,
                          env=env, timeout=300, check=False)
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        return {"stage": stage, "error": lines[-1] if lines else f"exit status {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _idle_problem(results: list[dict]) -> str | None:
    befores = [r["before"] for r in results if r.get("before") is not None]
    if not befores:
        return "NVML could not be read (install nvidia-ml-py): the memory before CUDA started is unknown"
    if max(befores) - min(befores) > IDLE_TOLERANCE:
        return (f"the GPU's used memory moved by {(max(befores) - min(befores)) / MiB:.0f} MiB between stages: "
                "another process is using it; calibrate on an idle GPU")
    return None


def entry(results: list[dict]) -> dict:
    """The saved form: the context, and each stage's memory beyond it (bytes; None where it failed)."""
    first = next((r for r in results if "error" not in r), {})
    by = {r["stage"]: outside_allocator(r) for r in results if "error" not in r}
    context = by.get("context")
    parts = {k: (v - context if v is not None and context is not None else None) for k, v in by.items()
             if k != "context"}
    return {"device": first.get("device"), "total_memory": first.get("total_memory"),
            "driver": _driver_version(), "torch": first.get("torch"), "cuda": first.get("cuda"),
            "date": datetime.date.today().isoformat(), "context": context,
            "beyond_context": parts, "stages": results}


def _driver_version() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else version
    except Exception:  # noqa: BLE001
        return None


def describe(e: dict) -> str:
    def mib(v):
        return "failed" if v is None else f"{v / MiB:.0f} MiB"

    lines = [f"{e['device']}, driver {e['driver']}, torch {e['torch']} (CUDA {e['cuda']}), {e['date']}:",
             f"  CUDA context (lazy loading)   {mib(e['context'])}"]
    names = {"context_eager": "eager loading, beyond lazy", "cublas": "cuBLAS/cuBLASLt handles",
             "cudnn": "cuDNN handle and kernels", "training_step": "a training step's kernels and handles",
             "inference_step": "an inference loop's kernels", "nccl": "NCCL, one rank"}
    lines += [f"  + {names.get(k, k):<28} {mib(v)}" for k, v in e["beyond_context"].items()]
    errors = [f"  {r['stage']}: {r['error']}" for r in e["stages"] if "error" in r]
    return "\n".join(lines + (["stages that failed:", *errors] if errors else []))


def calibrate(path: Path | None = None, out=None) -> int:
    """Measures every stage and saves the entry; 1 with one line when there is no idle GPU."""
    out = out or sys.stdout
    try:
        import torch

        available = torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        available = False
    if not available:
        print("amem doctor --calibrate: no CUDA device here (torch.cuda.is_available() is False); run it on the "
              "GPU machine whose context you want predictions to use", file=sys.stderr)
        return 1
    results = [_child(stage) for stage in STAGES]
    problem = _idle_problem(results)
    if problem:
        print(f"amem doctor --calibrate: {problem}; nothing was saved", file=sys.stderr)
        return 1
    e = entry(results)
    if e["context"] is None:
        failed = "; ".join(f"{r['stage']}: {r.get('error', 'no reading')}" for r in results if r["stage"] == "context")
        print(f"amem doctor --calibrate: the CUDA context could not be measured ({failed}); nothing was saved",
              file=sys.stderr)
        return 1
    path = path or calibration_path()
    _save(e, path)
    print(describe(e) + f"\nsaved to {path}", file=out)
    return 0


if __name__ == "__main__":
    print(json.dumps(measure_stage(sys.argv[1])))
