"""One program run for real on a GPU, under torch's native allocator at default settings, and what
it held: torch's peaks and the device total a user sees in nvidia-smi.

    python benchmarks/real_run.py --out result.json [--snapshot trace.pickle] -- SCRIPT [ARGS...]

The script runs in this process (runpy, as `python SCRIPT ARGS` would: its own sys.argv and
__main__), unchanged. Written to --out as JSON:

* `peak_allocated`, `peak_reserved`: torch.cuda.memory_stats() at the end (peaks over the run);
* `process_used_peak`: the most device memory NVML ever showed for this process (what nvidia-smi
  lists per process), sampled every 2 ms by a thread, and `process_used_end` at the end;
* `device_used_delta_end`: the device's used memory at the end less before CUDA started
  (cudaMemGetInfo against NVML's reading before); right only while nothing else uses the GPU;
* `outside_allocator_end`: process_used_end less torch's reserved memory at the end: the CUDA
  context, library handles and their kernels, what torch's allocator does not hold;
* `device_total_peak`: peak_reserved + outside_allocator_end, the peak nvidia-smi would show if
  the libraries' memory was all there at the peak (it grows only while new kernels load).

With --snapshot, torch's memory history is recorded (python stacks) and written there at the end:
the real allocator's own trace of the run, to compare with a prediction event by event.
A script that raises is reported with its traceback and exit status 1; the JSON then has `error`.
"""
from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
import threading
import time
import traceback
from pathlib import Path


class Nvml:
    """The few NVML readings this needs, through pynvml (nvidia-ml-py) where it is installed."""

    def __init__(self, index: int = 0):
        self.ok = False
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nv = pynvml
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self.ok = True
        except Exception as err:  # noqa: BLE001  (no NVML: figures that need it are left out)
            self.why = f"{type(err).__name__}: {err}"

    def device_used(self) -> int | None:
        return int(self.nv.nvmlDeviceGetMemoryInfo(self.handle).used) if self.ok else None

    def process_used(self, pid: int) -> int | None:
        if not self.ok:
            return None
        try:
            for p in self.nv.nvmlDeviceGetComputeRunningProcesses(self.handle):
                if p.pid == pid and p.usedGpuMemory is not None:
                    return int(p.usedGpuMemory)
        except Exception:  # noqa: BLE001
            return None
        return 0


class Sampler(threading.Thread):
    """The largest per-process NVML reading seen, every `period` seconds."""

    def __init__(self, nvml: Nvml, period: float = 0.002):
        super().__init__(daemon=True)
        self.nvml, self.period, self.peak, self.stop = nvml, period, 0, threading.Event()

    def run(self):
        pid = os.getpid()
        while not self.stop.is_set():
            used = self.nvml.process_used(pid)
            if used:
                self.peak = max(self.peak, used)
            time.sleep(self.period)


def run_script(script: str, args: list[str]) -> str | None:
    """Runs the script as __main__; the error's text if it raised (its traceback on stderr)."""
    sys.argv = [script, *args]
    sys.path.insert(0, str(Path(script).resolve().parent))
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exit_:
        if exit_.code not in (None, 0):
            return f"SystemExit({exit_.code!r})"
    except BaseException as err:  # noqa: BLE001  (the user's error: shown, kept in the JSON)
        traceback.print_exc()
        return f"{type(err).__name__}: {err}"
    return None


def measure(script: str, args: list[str], snapshot: Path | None) -> dict:
    nvml = Nvml()
    before = nvml.device_used()
    import torch

    if snapshot:
        torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="python")
    sampler = Sampler(nvml)
    sampler.start()
    started = time.perf_counter()
    error = run_script(script, args)
    seconds = time.perf_counter() - started
    torch.cuda.synchronize()
    sampler.stop.set()
    sampler.join()
    stats = torch.cuda.memory_stats()
    free, total = torch.cuda.mem_get_info()
    end = nvml.process_used(os.getpid())
    out = {"script": script, "args": args, "seconds": seconds, "error": error,
           "device": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda,
           "total_memory": torch.cuda.get_device_properties(0).total_memory,
           "peak_allocated": stats.get("allocated_bytes.all.peak", 0),
           "peak_reserved": stats.get("reserved_bytes.all.peak", 0),
           "reserved_end": stats.get("reserved_bytes.all.current", 0),
           "process_used_peak": max(sampler.peak, end or 0) if nvml.ok else None, "process_used_end": end,
           "device_used_delta_end": (total - free - before) if before is not None else None,
           "nvml": nvml.ok or nvml.why, "module_loading": os.environ.get("CUDA_MODULE_LOADING", "")}
    if end:
        out["outside_allocator_end"] = end - out["reserved_end"]
        out["device_total_peak"] = out["peak_reserved"] + out["outside_allocator_end"]
    if snapshot:
        torch.cuda.memory._dump_snapshot(str(snapshot))
        torch.cuda.memory._record_memory_history(enabled=None)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="where to write the JSON")
    parser.add_argument("--snapshot", type=Path, help="record torch's memory history and write it here")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- SCRIPT [ARGS...]")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the script to run after --")
    result = measure(command[0], command[1:], args.snapshot)
    args.out.write_text(json.dumps(result, indent=1))
    return 1 if result["error"] else 0


if __name__ == "__main__":
    sys.exit(main())
