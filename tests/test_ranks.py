"""Several ranks: under torchrun AMEM_TRACE writes one file per rank (`{rank}` in the path, or a
`.rank<N>` suffix by default), and `amem report` takes the files and lays the ranks side by side
(peak allocated/reserved per rank, the skew, the timelines on one time axis). The end-to-end test
runs torch.distributed.run with two real processes on the CPU (gloo), amem's CUDA registry on the
host backend."""
import json
import re
import sys
import textwrap

import pytest

import amem_alloc
from amem_alloc import Allocator, recording
from amem_alloc.cli import main as cli_main
from amem_alloc.report import render_ranks_report
from amem_alloc.report.ranks import load_ranks, rank_data

from helpers import run_command

pytest.importorskip("torch.distributed")
AMEM = [sys.executable, "-m", "amem_alloc"]
MiB = 1 << 20

RANK_SCRIPT = textwrap.dedent("""\
    import ctypes
    import torch
    import torch.distributed as dist
    import amem_alloc
    from amem_alloc import _C

    _C.registry_use_backend("host", 256 << 20)   # amem's CUDA registry, on host memory
    amem_alloc.enable()                          # AMEM_TRACE: always-on, one file per rank
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    lib = ctypes.CDLL(_C.__file__)
    lib.amem_malloc.restype = ctypes.c_void_p
    lib.amem_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    lib.amem_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    size = (rank + 1) * (24 << 20)               # rank 1 holds twice what rank 0 holds
    keep = lib.amem_malloc(size, 0, None)
    t = torch.ones(4)
    dist.all_reduce(t)                           # a real collective between the processes
    assert t[0] == dist.get_world_size()
    dist.barrier()
    lib.amem_free(keep, size, 0, None)
    dist.destroy_process_group()
    import os
    os.write(1, f"rank {rank} done\\n".encode())   # one write: two ranks share the pipe
""")


def test_rank_path_puts_the_rank_in_the_file_name():
    assert recording.rank_path("/t/trace.pickle", {}) == "/t/trace.pickle"
    assert recording.rank_path("/t/trace.pickle", {"RANK": "3"}) == "/t/trace.rank3.pickle"
    assert recording.rank_path("/t/trace", {"RANK": "1"}) == "/t/trace.rank1"
    assert recording.rank_path("/t/r{rank}/trace-{rank}.pickle", {"RANK": "2"}) == "/t/r2/trace-2.pickle"
    assert recording.rank_path("/t/trace-{rank}.pickle", {}) == "/t/trace-0.pickle"
    assert recording.trace_config_from_env({"AMEM_TRACE": "t.pickle", "RANK": "1"})["path"] == "t.rank1.pickle"
    with pytest.raises(ValueError, match="RANK: bad value"):
        recording.trace_config_from_env({"AMEM_TRACE": "t.pickle", "RANK": "first"})


def _rank_snapshot(rank, size, monkeypatch):
    monkeypatch.setenv("RANK", str(rank))
    a = Allocator(backend="sim")
    a.record()
    a.free(a.malloc(size))
    return a.snapshot()


def test_ranks_side_by_side_peaks_and_skew(monkeypatch):
    snaps = [("b.pickle", _rank_snapshot(1, 30 * MiB, monkeypatch)), ("a.pickle", _rank_snapshot(0, 10 * MiB, monkeypatch))]
    assert snaps[0][1]["amem"]["rank"] == 1
    data = rank_data(load_ranks(snaps))
    assert [r["label"] for r in data["ranks"]] == ["rank 0", "rank 1"]  # in rank order, whatever the file order
    assert [r["peak_allocated"] for r in data["ranks"]] == [10 * MiB, 30 * MiB]
    assert data["skew"]["allocated"] == {"ratio": 3.0, "gap": 20 * MiB}
    page = render_ranks_report(snaps)
    assert "2 ranks side by side" in page and "allocated 3.00x (gap 20.00 MiB)" in page
    assert page.count("<polyline") == 4  # reserved and allocated per rank, one axis


def test_one_rank_file_is_still_the_one_trace_report(tmp_path, monkeypatch):
    path = tmp_path / "t.pickle"
    amem_alloc.snapshot.save_snapshot(_rank_snapshot(0, MiB, monkeypatch), path)
    proc = run_command([*AMEM, "report", str(path), "-o", str(tmp_path / "r.html")])
    assert proc.returncode == 0 and "side by side" not in proc.stdout


@pytest.mark.skipif(not hasattr(amem_alloc._C, "registry_use_backend"), reason="this build has no registry_use_backend")
def test_torchrun_two_ranks_on_the_cpu_write_one_trace_each_and_report_side_by_side(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(RANK_SCRIPT)
    trace = tmp_path / "trace.pickle"
    proc = run_command([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        str(script)], env={"AMEM_TRACE": str(trace), "OMP_NUM_THREADS": "1"}, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rank 0 done" in proc.stdout and "rank 1 done" in proc.stdout
    files = sorted(tmp_path.glob("trace.rank*.pickle"))
    assert [f.name for f in files] == ["trace.rank0.pickle", "trace.rank1.pickle"] and not trace.exists()
    for rank, f in enumerate(files):
        assert amem_alloc.load_snapshot(f)["amem"]["rank"] == rank
    out = tmp_path / "ranks.html"
    assert cli_main(["report", *map(str, reversed(files)), "-o", str(out)]) == 0  # in this process: faster
    page = out.read_text()
    peaks = re.findall(r"<td>rank (\d)</td><td>[^<]*</td><td class='n' title='(\d+) bytes'>", page)
    assert peaks == [("0", str(24 * MiB)), ("1", str(48 * MiB))]
    assert "allocated 2.00x (gap 24.00 MiB)" in page
    assert "time since the first event of any rank" in page  # one job: the ranks share a time axis
    data = json.loads(re.search(r'<script type="application/json" id="amem-data">(.*?)</script>', page, re.S).group(1)
                      .replace("\\u003c", "<").replace("\\u003e", ">").replace("\\u0026", "&"))
    assert data["ranks"]["axis"] == "us"
