"""Shared helpers for the tests: running Python in a fresh process (the allocator can be swapped
into torch only once per process, before CUDA starts)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


# The start of a GPU script that runs under torch's allocator, or amem's when its first argument is
# "amem" (run_python(script, args=["amem"])), so the two can be compared.
ALLOCATOR_FROM_ARGV = """
import json, sys
if sys.argv[1] == "amem":
    import amem_alloc
    amem_alloc.enable()
import torch
"""

# The same for a training script: deterministic kernels and seeds, so two allocators give the same numbers.
DETERMINISTIC_TRAINING_START = """
import os
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
""" + ALLOCATOR_FROM_ARGV + """
torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
"""


SESSION_FILES = ("AMEM_CALIBRATION", "AMEM_COMPILE_CACHE")   # the test session's own (conftest)


def environment_without_amem() -> dict[str, str]:
    """This process's environment less amem's settings (a child starts as a user's would), but for
    the files the test session gives amem (conftest): the calibration a prediction reads and the
    folder a compiled prediction keeps inductor's wrappers in, never the developer's own."""
    return {k: v for k, v in os.environ.items() if not k.startswith("AMEM_") or k in SESSION_FILES}


def run_python(code: str, env: dict[str, str] | None = None, args: list[str] | None = None,
               timeout: float = 120) -> subprocess.CompletedProcess:
    """Runs `code` in a new interpreter; returns the completed process (text output)."""
    full_env = environment_without_amem()
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *(args or [])], env=full_env,
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def run_command(argv: list[str], env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    full_env = environment_without_amem()
    full_env.update(env or {})
    return subprocess.run(argv, env=full_env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def shared_traces_dir() -> Path:
    """../shared/traces beside the checkout (or inside it, or beside a worktree's parent folder)."""
    for folder in (ROOT.parent / "shared" / "traces", ROOT / "shared" / "traces",
                   ROOT.parent.parent / "shared" / "traces"):
        if folder.is_dir():
            return folder
    return ROOT.parent / "shared" / "traces"


def collector_callback_frame():
    """A frame inside the garbage collector's phase callback (predict/engine/collector.py), one of
    the callbacks whose exceptions Python drops: what the deadline and the stop signals test for."""
    from types import SimpleNamespace

    from amem_alloc.predict.engine.collector import CollectorWatch

    frames = []

    class Notes:
        def add(self, *args):
            frames.append(sys._getframe(1))   # the callback's own frame

    watch = CollectorWatch(Notes(), recording=None)
    watch.counting, watch.freed = True, [SimpleNamespace(requested=512, frames=[])]
    watch._phase("stop", {})
    assert frames, "the collector's callback noted nothing"
    return frames[0]
