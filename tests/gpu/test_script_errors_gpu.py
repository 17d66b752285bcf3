"""On a GPU, a real CUDA out-of-memory error in the user's script under `amem run` is the script's:
its traceback (file and line) and exit status 1, never an "amem: ..." line; amem's OOM dump
(AMEM_TRACE) is still written, and `amem replay` of it says the capacity the oom event shows."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from helpers import run_command  # noqa: E402

pytestmark = pytest.mark.gpu
AMEM = [sys.executable, "-m", "amem_alloc"]

SCRIPT = """\
import torch
keep = torch.empty(1 << 30, device="cuda")
def step():
    return torch.empty(1 << 50, device="cuda")   # far more than any GPU
step()
"""


def test_a_real_cuda_oom_keeps_the_scripts_traceback_and_the_trace_survives(tmp_path):
    script = tmp_path / "oom.py"
    script.write_text(SCRIPT)
    trace = tmp_path / "trace.pickle"
    proc = run_command([*AMEM, "run", str(script)], env={"AMEM_TRACE": str(trace)}, timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert f'File "{script}", line 4, in step' in proc.stderr and "OutOfMemoryError" in proc.stderr
    assert not proc.stderr.startswith("amem")
    oom = tmp_path / "trace.oom.pickle"
    assert oom.exists()
    replayed = run_command([*AMEM, "replay", str(oom)], timeout=300)
    assert replayed.returncode == 0, replayed.stderr
    assert "from the trace's oom event" in replayed.stdout
