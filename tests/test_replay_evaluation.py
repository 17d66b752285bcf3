"""replay/evaluation.py: one program under several policies (peaks, fragmentation, the smallest
capacity, fits, under a capacity or by it) and the one row type amem replay, compare and predict
print. The expected figures follow from torch's policy (large requests get a segment of their
own, a cached 60 MiB segment cannot serve 70 MiB, an OOM frees the cache and retries)."""
import json

from amem_alloc import policies, replay
from amem_alloc.replay import evaluation

MiB = 1 << 20


def cache_then_bigger() -> replay.Program:
    """100 MiB kept; 60 MiB freed; then 70 MiB, which the cached 60 MiB segment cannot serve."""
    return replay.Program(replay.pack([(replay.ALLOC, 1, 100 * MiB, 0), (replay.ALLOC, 2, 60 * MiB, 0),
                                       (replay.FREE, 2, 0, 0), (replay.ALLOC, 3, 70 * MiB, 0)]))


def test_unlimited_rows_have_the_peaks_and_no_verdict():
    torch_row, = evaluation.evaluate(cache_then_bigger(), [policies.get("torch")])
    assert (torch_row.peak_allocated, torch_row.peak_reserved) == (170 * MiB, 230 * MiB)
    assert torch_row.allocated_at_peak == 170 * MiB and torch_row.device_mallocs == 3
    assert abs(torch_row.fragmentation_at_peak - 60 / 230) < 1e-9
    assert torch_row.fits is None and torch_row.headroom is None and torch_row.min_capacity is None
    assert torch_row.ooms == 0 and torch_row.ops == 4 and torch_row.timeline


def test_by_the_smallest_capacity_the_peaks_stay_unlimited():
    """amem predict's question: the cache is freed on an OOM, so 170 MiB suffices although 230 is reserved."""
    row, = evaluation.evaluate(cache_then_bigger(), [policies.get("torch")], 200 * MiB, search_min_capacity=True)
    assert row.min_capacity == 170 * MiB and row.peak_reserved == 230 * MiB
    assert row.fits and row.headroom == -30 * MiB
    tight, = evaluation.evaluate(cache_then_bigger(), [policies.get("torch")], 168 * MiB, search_min_capacity=True)
    assert tight.fits is False


def test_under_a_capacity_failures_are_counted_with_the_unlimited_need():
    """amem replay's question: run on the device itself; a failing policy says what it needs."""
    fits, fails = (evaluation.evaluate(cache_then_bigger(), [policies.get("torch")], cap)[0]
                   for cap in (170 * MiB, 160 * MiB))
    assert fits.ooms == 0 and fits.fits and fits.peak_reserved == 170 * MiB  # the cached 60 MiB was freed
    assert fails.ooms == 1 and fails.fits is False and fails.unlimited_peak_reserved == 230 * MiB


def test_a_row_crosses_a_process_as_json_and_prints_the_same():
    row = evaluation.evaluate(cache_then_bigger(), [policies.get("amem")], 300 * MiB, search_min_capacity=True)[0]
    data = json.loads(json.dumps(row.to_dict()))
    back = evaluation.PolicyRow.from_dict(data)
    assert back == row and data["fits"] is True and data["fragmentation_at_peak"] == row.fragmentation_at_peak
    columns = tuple(evaluation.COLUMNS)
    assert evaluation.cells(row.to_dict(), columns) == evaluation.cells(data, columns)


def test_the_table_aligns_and_says_a_failed_run():
    rows = [r.to_dict() for r in evaluation.evaluate(cache_then_bigger(), [policies.get("torch")])]
    rows.append({"policy": "amem", "error": "the child process died"})
    header, first, failed = evaluation.format_table(rows, ("configuration", "peak reserved", "OOMs"))
    assert header.split() == ["configuration", "peak", "reserved", "OOMs"]
    assert first.split()[:3] == ["torch", "230.00", "MiB"] and len(first) == len(header)
    assert failed.split()[:3] == ["amem", "failed:", "the"]
