"""`amem compare` for real on a GPU: each bundled workload under torch's allocator (with and
without expandable_segments) and amem's policies, each configuration in a fresh process; the
simulated native figures (predicted without the GPU, replayed on the sim backend) agree with the real
native ones; a trace the native allocator writes on this GPU replays with its own decisions.
Skipped without a GPU (tests/gpu/conftest.py). With AMEM_RESULTS_DIR set, each workload's table
is written there as markdown (for benchmarks/RESULTS.md)."""
import os
from pathlib import Path

import pytest

from amem_alloc import policies
from amem_alloc.compare import compare, format_markdown, format_text
from amem_alloc.replay import fidelity
from conftest import save_artifact

pytestmark = pytest.mark.gpu
SIZE = 4  # large enough that one 20 MiB segment is well under 2% of the peak
WORKLOADS = ("gpt", "mlp", "mlp-checkpoint", "decode")


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    out = tmp_path_factory.mktemp("compare-real")
    if os.environ.get("AMEM_GPU_ARTIFACTS"):  # keep every run's traces and tables for offline diagnosis
        out = Path(os.environ["AMEM_GPU_ARTIFACTS"]) / "compare-real"
    results = {w: compare(workload=w, size=SIZE, mode="real", out_dir=out / w, progress=False) for w in WORKLOADS}
    for w, result in results.items():
        save_artifact(f"compare-real/{w}/table.txt", format_text(result))
    return results


@pytest.mark.parametrize("workload", WORKLOADS)
def test_every_configuration_runs_for_real_in_its_own_process(real, workload):
    result = real[workload]
    assert result.mode == "real"
    assert [r["policy"] for r in result.rows] == list(policies.DEFAULT_COMPARE)
    assert all(not r.get("error") for r in result.rows), [r.get("error") for r in result.rows]
    assert len({r["pid"] for r in result.rows}) == len(result.rows) and os.getpid() not in {r["pid"] for r in result.rows}
    for r in result.rows:
        assert r["allocator"] == ("torch" if r["native"] else "amem")
        assert r["peak_reserved"] >= r["peak_allocated"] > 0 and r["seconds_per_step"] > 0 and r["timeline"]
    print("\n" + format_text(result))
    if os.environ.get("AMEM_RESULTS_DIR"):
        path = Path(os.environ["AMEM_RESULTS_DIR"]) / f"compare-{workload}.md"
        env = result.environment
        path.write_text(f"{workload} (size {SIZE}) on {env['device']}, torch {env['torch']}, {env['date']}\n\n"
                        + format_markdown(result) + "\n")


@pytest.mark.parametrize("workload", WORKLOADS)
def test_simulated_native_peak_reserved_is_within_two_percent_of_real(real, workload, tmp_path):
    sim = compare(workload=workload, size=SIZE, mode="simulated", policies=["torch"], out_dir=tmp_path,
                  progress=False)
    simulated = sim.rows[0]["peak_reserved"]
    measured = next(r for r in real[workload].rows if r["policy"] == "torch")["peak_reserved"]
    assert abs(simulated - measured) / measured <= 0.02, (simulated, measured)


@pytest.mark.parametrize("workload", WORKLOADS)
def test_the_native_trace_of_each_run_replays_with_its_own_decisions(real, workload):
    for policy in ("torch", "torch-expandable"):
        rows = fidelity.measure(real[workload].out_dir / f"trace-{policy}.pickle")
        assert rows and all(f.start == "empty" for f in rows)
        for f in rows:
            assert f.match_rate >= 0.99 and abs(f.peak_delta) <= 0.01, (policy, f.to_dict())
