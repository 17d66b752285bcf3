"""A benchmark's measured side in a fresh process: the benchmark script runs itself with --child
and prints its figures as JSON on its last line (so imports and caches of the parent never leak
into what is measured)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_child(script: str, args: list[str], what: str, timeout: float, extra_paths: tuple[str, ...] = ()) -> tuple[dict, float]:
    """(the child's JSON, its wall seconds); SystemExit naming `what` with the child's stderr when it fails."""
    path = os.pathsep.join(p for p in (str(ROOT), *extra_paths, os.environ.get("PYTHONPATH")) if p)
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, str(Path(script).resolve()), "--child", *args], capture_output=True,
                          text=True, env=dict(os.environ, PYTHONPATH=path), timeout=timeout, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{what} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1]), time.perf_counter() - started
