"""Traces on a real GPU: recording through torch's CUDA calls, dumps torch's tools read, and
always-on mode writing the trace of an out-of-memory error. Each scenario runs in a fresh process
(amem can be swapped in only before CUDA starts). Skipped without a GPU (tests/gpu/conftest.py)."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from helpers import run_command, run_python  # noqa: E402

pytestmark = pytest.mark.gpu
AMEM = str(Path(sys.executable).parent / "amem")

TRAIN_AND_DUMP = """
import json, sys
import amem_alloc
amem_alloc.enable()
amem_alloc.record(stacks="python")
import torch

def train_step(model, opt, x):
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)

model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 512)).cuda()
opt = torch.optim.Adam(model.parameters())
s = torch.cuda.Stream()
for step in range(5):
    with amem_alloc.tag("forward-backward"):
        train_step(model, opt, torch.randn(64 + step, 512, device="cuda"))
with torch.cuda.stream(s):
    y = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
amem_alloc.dump_snapshot(sys.argv[1])
print(json.dumps(amem_alloc.memory_stats(0)))
"""


def test_dump_on_gpu_is_read_by_torch_and_matches_amem_stats(tmp_path):
    path = tmp_path / "gpu.pickle"
    proc = run_python(TRAIN_AND_DUMP, args=[str(path)], timeout=300)
    assert proc.returncode == 0, proc.stderr
    stats = json.loads(proc.stdout.strip().splitlines()[-1])
    import pickle

    from torch.cuda import _memory_viz

    import amem_alloc
    from amem_alloc.timeline import build_timeline

    data = pickle.loads(path.read_bytes())
    text = _memory_viz.segsum(data)
    assert f"total_reserved: {_memory_viz.Bytes(stats['reserved_bytes.all.current'])}" in text
    assert f"total_allocated: {_memory_viz.Bytes(stats['requested_bytes.all.current'])}" in text
    _memory_viz.trace(data)
    loaded = amem_alloc.load_snapshot(path)
    allocs = [e for e in loaded["device_traces"][0] if e["action"] == "alloc"]
    assert any(f["name"] == "train_step" for e in allocs for f in e["frames"])
    assert "forward-backward" in {e["user_metadata"] for e in allocs}
    assert len({e["stream"] for e in allocs}) >= 2
    tl = build_timeline(loaded, 0)
    assert tl.allocated[-1] == stats["allocated_bytes.all.current"]
    assert tl.reserved[-1] == stats["reserved_bytes.all.current"]
    assert max(tl.allocated) == stats["allocated_bytes.all.peak"]
    out = amem_alloc.write_report(path, tmp_path / "r.html")
    assert "forward-backward" in out.read_text()
    amem_alloc.chrome_trace(loaded)
    amem_alloc.rmm_csv(loaded)


OOM = """
import amem_alloc, torch
amem_alloc.enable()
keep = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
try:
    torch.empty(1 << 50, dtype=torch.uint8, device="cuda")   # a petabyte: out of memory
except torch.OutOfMemoryError:
    print("caught torch.OutOfMemoryError")
"""


def test_always_on_writes_the_trace_of_an_oom_and_at_exit(tmp_path):
    path = tmp_path / "trace.pickle"
    proc = run_python(OOM, env={"AMEM_TRACE": str(path), "AMEM_TRACE_STACKS": "python"}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "caught torch.OutOfMemoryError" in proc.stdout
    import amem_alloc

    oom = amem_alloc.load_snapshot(tmp_path / "trace.oom.pickle")
    last = oom["device_traces"][0][-1]
    assert last["action"] == "oom" and last["size"] >= 1 << 50 and last["frames"]
    final = amem_alloc.load_snapshot(path)
    assert any(e["action"] == "oom" for e in final["device_traces"][0])


def test_amem_run_with_amem_trace_and_report(tmp_path):
    script = tmp_path / "job.py"
    script.write_text("import torch\nx = torch.ones(1 << 20, device='cuda')\ny = x * 2\nprint(float(y.sum()))\n")
    path = tmp_path / "run.pickle"
    proc = run_command([AMEM, "run", str(script)], env={"AMEM_TRACE": str(path)}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    proc = run_command([AMEM, "report", str(path), "-o", str(tmp_path / "r.html")])
    assert proc.returncode == 0, proc.stderr
    assert 'id="timeline-0"' in (tmp_path / "r.html").read_text()
