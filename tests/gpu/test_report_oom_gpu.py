"""The report's out-of-memory panel on amem's own OOM dump from a real GPU (AMEM_TRACE writes
trace.oom.pickle at the error). Skipped without a GPU (tests/gpu/conftest.py)."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from helpers import run_python  # noqa: E402

pytestmark = pytest.mark.gpu

OOM = """
import amem_alloc, torch
amem_alloc.enable()
def make_activations():
    return [torch.empty(48 << 20, dtype=torch.uint8, device="cuda") for _ in range(3)]
keep = make_activations()
try:
    torch.empty(1 << 50, dtype=torch.uint8, device="cuda")   # a petabyte: out of memory
except torch.OutOfMemoryError:
    print("caught torch.OutOfMemoryError")
"""


def test_the_report_of_amems_oom_dump_explains_the_error(tmp_path):
    path = tmp_path / "trace.pickle"
    proc = run_python(OOM, env={"AMEM_TRACE": str(path), "AMEM_TRACE_STACKS": "python"}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    import amem_alloc
    from amem_alloc.report.data import report_data

    dump = tmp_path / "trace.oom.pickle"
    dev = report_data(amem_alloc.load_snapshot(dump))["devices"][0]
    (panel,) = dev["oom_panels"]
    assert panel["size"] >= 1 << 50 and panel["device_free"] > 0
    assert panel["allocated"] >= 3 * (48 << 20) and panel["reserved"] >= panel["allocated"]
    assert not panel["fragmentation"] and panel["verdict"].startswith("Not fragmentation")
    assert panel["held"]["bytes"] == panel["allocated"]
    assert any("make_activations" in g["key"] for g in panel["held"]["by_site"]), panel["held"]["by_site"]
    rows = panel["replay"]["rows"]
    from amem_alloc import policies

    assert [r["policy"] for r in rows] == list(policies.POLICIES)   # every policy replayed
    assert all(r["fits"] is False for r in rows)                     # no setting fits a petabyte
    page = amem_alloc.write_report(dump, tmp_path / "r.html").read_text()
    assert 'class="oom-panel"' in page and "no policy avoids it" in page
