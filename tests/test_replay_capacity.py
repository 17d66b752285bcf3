"""`amem replay` is honest about capacity and OOM: it says what capacity each replay assumes; where
the trace has an oom event it takes the device's capacity from it (device_free + the native
allocator's reserved bytes then) and shows whether each policy would have hit it; a --limit-gb
below the start state is said, not replayed into thousands of OOMs. Checked on the real
expandable_oom trace (device 1 ran out of memory at 78.4 GiB on an H100)."""
from pathlib import Path

import pytest

from amem_alloc import replay
from amem_alloc.cli import main as amem
from amem_alloc.replay import trace as trace_replay

from helpers import shared_traces_dir

TRACES = shared_traces_dir()
OOM = TRACES / "expandable_oom.pickle"
MID_RUN = TRACES / "lm_ctx128_fullstep.pickle"
GiB = 1 << 30


@pytest.fixture(scope="module")
def oom_report():
    if not OOM.exists():
        pytest.skip("../shared/traces is not present")
    return trace_replay.replay_trace(OOM, ["torch-expandable", "torch"], device=1)


def test_the_capacity_comes_from_the_oom_event(oom_report):
    d = oom_report.devices[0]
    oom = d.trace.native.ooms[0]
    assert d.capacity.source == "oom event"
    assert d.capacity.bytes == oom["device_free"] + d.trace.native.reserved_at(oom)
    assert 78.4 * GiB < d.capacity.bytes < 78.6 * GiB  # an 80 GB H100 less the CUDA context


def test_each_policy_says_whether_it_would_have_hit_it(oom_report):
    d = oom_report.devices[0]
    runs = {r.policy: r for r in d.rows}
    # the policy that emulates the trace's own settings fails where the native run failed
    assert runs["torch-expandable"].ooms == 1
    assert all(r.ooms for r in runs.values())
    text = trace_replay.format_text(oom_report)
    assert "capacity: 78.51 GiB, from the trace's oom event at request 288" in text
    assert "native (trace): hit it at request 288" in text
    assert "torch-expandable: would hit it: 1 request fails; it needs 83.36 GiB reserved without a limit" in text
    assert oom_report.to_dict()["devices"][0]["capacity"]["source"] == "oom event"


def test_a_device_without_an_oom_event_says_it_assumed_unlimited_memory(capsys):
    if not OOM.exists():
        pytest.skip("../shared/traces is not present")
    assert amem(["replay", str(OOM), "--device", "0"]) == 0
    out = capsys.readouterr().out
    assert "capacity: unlimited: the trace has no oom event (--limit-gb N sets a capacity)" in out


def test_limit_gb_replaces_the_traces_capacity(oom_report):
    report = trace_replay.replay_trace(OOM, ["torch-expandable"], device=1, limit_bytes=90 * GiB)
    d = report.devices[0]
    assert d.capacity.source == "--limit-gb" and d.rows[0].ooms == 0
    assert "torch-expandable: would fit, with" in trace_replay.format_text(report)


def test_a_limit_below_the_start_state_is_said_not_replayed(capsys):
    if not MID_RUN.exists():
        pytest.skip("../shared/traces is not present")
    assert amem(["replay", str(MID_RUN), "--limit-gb", "1"]) == 0
    out = capsys.readouterr().out
    assert "not replayed: the capacity, 1.00 GiB, is below the start state" in out
    assert "give --limit-gb of at least 36.61" in out
    assert "match rate" not in out and "OOMs in the trace" in out


def test_failed_requests_are_tried_where_they_failed():
    ops = replay.pack([(replay.ALLOC, 1, 100, 0), (replay.FREE, 1, 0, 0), (replay.ALLOC, 2, 50, 0)])
    tp = replay.TraceProgram(0, replay.Program(ops, 0, 0), replay.Native([], 0, False, [{"op": 2, "size": 999,
                                                                                       "device_free": 0}]),
                             "empty", "", "free_completed", 4, 0)
    program = trace_replay.with_failed_requests(tp)
    assert program.ops[["kind", "size"]].tolist() == [(0, 100), (1, 0), (0, 999), (1, 0), (0, 50)]
