"""Replay fidelity on real traces: the shared torch snapshots in ../shared/traces carry the native
allocator's own segment events; replaying their requests under the policy that emulates the
native settings must make the same decisions. The thresholds are the figures measured when this
was written (benchmarks/RESULTS.md, "Replay fidelity (issue 6)"), so a regression fails here.
Also: amem's own traces replay exactly, also when cut to start mid-run; `amem replay` prints it."""
import json
import random
from pathlib import Path

import pytest

from amem_alloc import Allocator, record, replay
from amem_alloc.cli import main as amem
from amem_alloc.replay import fidelity
from amem_alloc.snapshot import build_snapshot, parse_snapshot

from helpers import shared_traces_dir

MiB = 1 << 20
ROOT = Path(__file__).resolve().parents[1]
TRACES = shared_traces_dir() if shared_traces_dir().is_dir() else None
needs_traces = pytest.mark.skipif(TRACES is None, reason="../shared/traces is not present")

# trace -> per device (start state, lowest segment-event match rate accepted); measured: all 100%
# except multistream_4dev, 98.8% (1162 of 1163 native events matched, 26 extra: see docs/replay.md)
EXPECTED = {
    "tiny_grad.pickle": {0: ("empty", 1.0)},
    "small_train.pickle": {0: ("empty", 1.0)},
    "lm_ctx128_fullstep.pickle": {0: ("rebuilt", 1.0)},
    "lm_medium_ctx128_training.pickle": {0: ("rebuilt", 1.0)},
    "multistream_4dev.pickle": {0: ("rebuilt", 0.985)},
    "expandable_oom.pickle": {0: ("empty", 1.0), 1: ("empty", 1.0), 2: ("empty", 1.0)},
}


@pytest.fixture(scope="module")
def measured():
    return {name: {f.device: f for f in fidelity.measure(TRACES / name)} for name in EXPECTED}


@needs_traces
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_shared_trace_fidelity(measured, name):
    rows = measured[name]
    assert sorted(rows) == sorted(EXPECTED[name])
    for device, (start, min_match) in EXPECTED[name].items():
        f = rows[device]
        assert f.start == start and f.reproducible, (device, f.start_reason)
        assert f.match_rate >= min_match, (device, f.match_rate)
        assert abs(f.peak_delta) <= 0.01, (device, f.peak_delta)          # the bar: within 1%
        assert f.final_identical == f.final_segments, device              # every final segment, block for block
        if min_match == 1.0:
            assert f.replay_events == f.native_events == f.matched


@needs_traces
def test_expandable_trace_is_emulated_with_expandable_segments(measured):
    assert {f.policy for f in measured["expandable_oom.pickle"].values()} == {"torch-expandable"}
    assert measured["expandable_oom.pickle"][1].ooms == 1 and measured["expandable_oom.pickle"][1].releases == 1


@needs_traces
def test_every_shared_trace_replays_under_every_policy():
    for path in sorted(TRACES.glob("*.pickle")):
        from amem_alloc.snapshot import load_snapshot

        for tp in replay.trace_programs(load_snapshot(path)):
            for conf in ("", "expandable_segments:True", "roundup_power2_divisions:4"):
                run = replay.run(tp.program, conf)
                assert run.peak_reserved >= run.peak_allocated > 0 and run.unknown_frees == 0, (path.name, conf)


@needs_traces
def test_amem_replay_command(tmp_path, capsys):
    out_json, out_png = tmp_path / "r.json", tmp_path / "r.png"
    assert amem(["replay", str(TRACES / "small_train.pickle"), "--policy", "torch,amem-roundup4",
                 "--json", str(out_json), "--plot", str(out_png)]) == 0
    text = capsys.readouterr().out
    assert "simulated" in text and "9/9 segment events matched (100.0% match rate" in text
    assert "native (trace)" in text and "amem-roundup4" in text
    report = json.loads(out_json.read_text())
    runs = report["devices"][0]["rows"]
    assert [r["policy"] for r in runs] == ["torch", "amem-roundup4"] and runs[0]["timeline"]
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------------------- amem's own traces
def _amem_trace(seed: int, n: int = 3000) -> dict:
    rng, a, live = random.Random(seed), Allocator("sim"), []
    record(max_entries=1 << 20, allocator=a)
    for _ in range(n):
        r = rng.random()
        if live and r < 0.45:
            a.free(live.pop(rng.randrange(len(live))))
        elif r > 0.995:
            a.empty_cache()
        else:
            size = rng.choice([rng.randint(1, MiB), rng.randint(MiB, 30 * MiB), rng.randint(1, 4096)])
            live.append(a.malloc(size, rng.randrange(2)))
    return parse_snapshot(build_snapshot(a))


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_amem_traces_replay_exactly_and_mid_run_cuts_nearly(seed):
    snap = _amem_trace(seed)
    whole = fidelity.measure_program("whole", snap, replay.trace_program(snap, 0))
    assert whole.start == "empty" and whole.match_rate == 1.0 and whole.peak_delta == 0.0
    assert whole.final_identical == whole.final_segments
    events = snap["device_traces"][0]
    cut = {"segments": snap["segments"], "device_traces": [events[len(events) // 2:]]}
    half = fidelity.measure_program("cut", cut, replay.trace_program(cut, 0))
    # measured: 100%, 95.3%, 100%, 100% of segment events; peaks within 0.4%
    assert half.start == "rebuilt" and half.match_rate >= 0.95 and abs(half.peak_delta) <= 0.005


# ---------------------------------------------------------------------------- real runs kept in the repository
H200_RUNS = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_runs" / "h200-2026-11-27"


def test_torchs_own_trace_from_an_h200_replays_event_for_event(tmp_path):
    """The bundled gpt workload at size 4 under torch's allocator on an H200 (torch 2.11): replayed
    under torch's policy, every segment_alloc is torch's own and the peak reserved is torch's. With
    ascending simulated addresses one 22 MiB segment was missed (103 of 104 events, peak -1.2%):
    cudaMalloc's addresses descend there, and torch's best fit breaks ties by address (Note
    [segment addresses descend] in csrc/backends/sim_backend.cpp)."""
    import tarfile

    from amem_alloc.replay import fidelity

    with tarfile.open(H200_RUNS / "snapshots.tar.gz") as tar:
        tar.extractall(tmp_path, members=[m for m in tar.getmembers() if m.name.startswith("native/")],
                       filter="data")
    for name, policy, segments in (("trace-torch.pickle", "torch", 104),
                                   ("trace-torch-expandable.pickle", "torch-expandable", 85)):
        (f,) = fidelity.measure(tmp_path / "native" / name)
        assert (f.policy, f.native_events, f.matched, f.peak_delta) == (policy, segments, segments, 0.0), f.to_dict()
        assert f.final_identical == f.final_segments
