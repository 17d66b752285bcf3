"""Nothing under prediction reaches the CUDA driver (issue 32): real programs predicted with a
CUDA driver that writes down every call made to it, with the Python stack that made it
(tests/loud_driver/libcuda_loud.c, first on LD_LIBRARY_PATH), answering each as a machine with no
GPU does so the program goes on. A C++ entry point that allocates on CUDA by itself (c10d's barrier
with device_ids did: "Found no NVIDIA driver") shows up here even where a library catches its error.

The one call allowed: the C++ autograd engine starts its device threads at the first backward and
asks how many CUDA devices there are (cudaGetDeviceCount, through the driver's cuGetProcAddress):
a query that makes no context and allocates nothing, which a GPU machine answers without cost and
a machine with no GPU answers 0."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import environment_without_amem

pytest.importorskip("torch")
HERE = Path(__file__).resolve().parent
ALLOWED = {("torch/autograd/graph.py", "_engine_run_backward")}   # the engine's device-count query


@pytest.fixture(scope="module")
def loud_driver(tmp_path_factory):
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build the logging CUDA driver")
    folder = tmp_path_factory.mktemp("loud_driver")
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(folder / "libcuda.so.1"),
                    str(HERE / "loud_driver" / "libcuda_loud.c")], check=True)
    return folder


def _calls(log: Path) -> list[tuple[str, str, str]]:
    """(driver function, innermost Python file, its function) of each logged call."""
    if not log.exists():
        return []
    out = []
    for block in log.read_text().split("=== ")[1:]:
        name = block.splitlines()[0]
        frames = [f for f in re.findall(r'File "([^"]+)", line \d+, in (\S+)', block) if f[0] != "<string>"]
        where = frames[-1] if frames else ("?", "?")
        out.append((name, where[0], where[1]))
    return out


def _run(argv: list[str], driver: Path, log: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = environment_without_amem()
    env.update(LD_LIBRARY_PATH=f"{driver}:{env.get('LD_LIBRARY_PATH', '')}", AMEM_LOUD_DRIVER_LOG=str(log),
               PYTHONPATH=os.pathsep.join(p for p in (str(HERE.parent), env.get("PYTHONPATH")) if p))
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def _unexplained(calls) -> list:
    return [c for c in calls if not any(c[1].endswith(f) and c[2] == fn for f, fn in ALLOWED)]


def test_the_driver_log_sees_a_real_cuda_allocation(loud_driver, tmp_path):
    """The check can fail: torch making a CUDA tensor for real is logged, from a place not allowed."""
    log = tmp_path / "driver.log"
    _run([sys.executable, "-c", "import torch\ntry:\n    torch.empty(1, device='cuda')\nexcept RuntimeError:\n    pass"],
         loud_driver, log, tmp_path)
    assert _unexplained(_calls(log)), _calls(log)


PROGRAMS = [
    (["fused_adamw.py", "--impl", "foreach"], HERE / "programs"),
    (["torchrun", "--nproc-per-node", "2", str(HERE / "predict_models" / "dist_barrier.py")], HERE),
    (["torchrun", "--nproc-per-node", "2", str(HERE / "predict_models" / "dist_fsdp2.py")], HERE),
    (["torchrun", "--nproc-per-node", "2", str(HERE / "predict_models" / "dist_meta_init.py")], HERE),
]


@pytest.mark.parametrize("command,cwd", PROGRAMS, ids=["foreach_adamw", "barrier", "fsdp2", "meta_init"])
def test_a_prediction_reaches_the_driver_only_to_count_devices(loud_driver, tmp_path, command, cwd):
    log = tmp_path / "driver.log"
    argv = [sys.executable, "-m", "amem_alloc", "predict", "--gpu", "H100", "--"]
    argv += command if command[0] == "torchrun" else ["python", *command]
    proc = _run(argv, loud_driver, log, cwd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not _unexplained(_calls(log)), _calls(log)
