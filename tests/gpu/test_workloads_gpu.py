"""The harder bundled workloads on a real GPU, under torch's allocator and under amem (each run
in a fresh process): they run, and the FSDP one really allocates its gathered parameters on a
second CUDA stream and uses them on the compute stream. Skipped without a GPU (conftest.py)."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from helpers import run_python  # noqa: E402

pytestmark = pytest.mark.gpu

RUN = """
import json, sys
if sys.argv[2] == "amem":
    import amem_alloc
    amem_alloc.enable()
import torch
from amem_alloc import workloads
if sys.argv[2] == "native":
    torch.cuda.memory._record_memory_history(max_entries=1_000_000, context=None, stacks="python")
info = workloads.get(sys.argv[1])(1, 2, "cuda", 0)
torch.cuda.synchronize()
if sys.argv[2] == "native":
    events = torch.cuda.memory._snapshot()["device_traces"][0]
    allocs = [(e["size"], e["stream"]) for e in events if e["action"] == "alloc"]
else:
    allocs = []
print(json.dumps({"info": {k: v for k, v in info.items() if isinstance(v, (int, float))},
                  "allocs": allocs, "peak": torch.cuda.max_memory_reserved()}))
"""


def _run(workload: str, allocator: str) -> dict:
    proc = run_python(RUN, args=[workload, allocator], timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("allocator", ["native", "amem"])
@pytest.mark.parametrize("workload", ["fsdp", "moe", "pipeline", "serving"])
def test_hard_workload_runs_on_cuda(workload, allocator):
    out = _run(workload, allocator)
    assert out["info"]["steps"] == 2 and out["peak"] > 0


def test_fsdp_gathers_on_a_second_cuda_stream():
    out = _run("fsdp", "native")
    gathered = out["info"]["gathered_bytes"]
    streams = {s for _, s in out["allocs"]}
    assert len(streams) == 2, streams
    # torch's trace stream ids: the gathers go to the stream that is not the one of the first
    # (compute-stream) allocation, the shards
    compute = out["allocs"][0][1]
    on_comm = [size for size, s in out["allocs"] if s != compute]
    assert on_comm.count(gathered) >= 2 * 6 * 2  # two gathers per layer and step
