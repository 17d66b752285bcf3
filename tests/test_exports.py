"""Exports: Chrome trace / Perfetto JSON (counters for allocated and reserved, OOM markers, block
lifetimes) and RMM's logging CSV, checked against the rules of RMM's replay log parser, for our
dumps and every shared torch trace; and the `amem export` command."""
import csv
import io
import json
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from amem_alloc import Allocator, chrome_trace, load_snapshot, rmm_csv
from amem_alloc.snapshot import parse_snapshot
from amem_alloc.trace_export import RMM_HEADER, slice_name, write_export
from amem_alloc.timeline import build_timeline

from helpers import run_command
from test_snapshot import TRACES, host_run, needs_traces

AMEM = str(Path(sys.executable).parent / "amem")


@pytest.fixture(scope="module")
def ours():
    a, _ = host_run(record_stacks="python")
    return a, a.snapshot()


def check_chrome(trace: dict) -> dict:
    """The invariants a trace viewer relies on; returns counts per event kind."""
    json.dumps(trace, allow_nan=False)  # plain JSON
    events = trace["traceEvents"]
    counts = defaultdict(int)
    open_ids = {}
    for e in events:
        counts[e["ph"]] += 1
        assert e["ph"] in ("M", "C", "i", "b", "e")
        if e["ph"] == "C":
            assert e["name"] in ("allocated", "reserved") and e["args"]["bytes"] >= 0
        elif e["ph"] == "b":
            assert e["id"] not in open_ids
            open_ids[e["id"]] = e["ts"]
        elif e["ph"] == "e":
            assert e["ts"] >= open_ids.pop(e["id"])
    assert not open_ids  # every block lifetime ends
    return counts


def test_chrome_trace_of_our_dump(ours):
    a, snap = ours
    trace = chrome_trace(snap)
    counts = check_chrome(trace)
    stats = a.memory_stats()
    assert counts["b"] == stats["allocation.all.allocated"]  # one lifetime per allocation
    last = {e["name"]: e["args"]["bytes"] for e in trace["traceEvents"] if e["ph"] == "C"}
    assert last == {"allocated": stats["allocated_bytes.all.current"], "reserved": stats["reserved_bytes.all.current"]}
    slices = [e for e in trace["traceEvents"] if e["ph"] == "b"]
    assert {"warmup", "step"} <= {e["args"]["tag"] for e in slices}
    for e in slices:   # named by the user's call site, the tag in brackets: never "block", never torch's frame
        assert e["name"] == slice_name(e["args"]["call_site"], e["args"]["tag"])
        assert "test_snapshot.py:" in e["args"]["call_site"] and e["name"] != "block"
    assert any(e["name"].endswith(" [step]") for e in slices)
    assert any(e["args"]["frames"] for e in slices)
    assert trace["traceEvents"][0] == {"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "GPU 0"}}


def test_chrome_trace_marks_out_of_memory():
    a = Allocator(backend="sim", limit_bytes=64 << 20)
    a.record()
    a.malloc(40 << 20)
    with pytest.raises(MemoryError):
        a.malloc(40 << 20)
    ooms = [e for e in chrome_trace(a.snapshot())["traceEvents"] if e["ph"] == "i"]
    assert len(ooms) == 1 and ooms[0]["name"] == "out of memory"
    assert ooms[0]["args"]["requested_bytes"] == 40 << 20


@needs_traces
@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_chrome_trace_of_every_shared_trace(path):
    data = load_snapshot(path)
    trace = chrome_trace(data)
    counts = check_chrome(trace)
    n_alloc = sum(e["action"] == "alloc" for t in data["device_traces"] for e in t)
    assert counts["b"] >= n_alloc
    n_oom = sum(e["action"] == "oom" for t in data["device_traces"] for e in t)
    assert counts["i"] == n_oom
    if path.name == "expandable_oom.pickle":
        assert n_oom == 1


def test_every_device_is_on_one_clock():
    """Two GPUs' events at the same moment line up: one origin, the first event of any device."""
    def alloc(t, addr):
        return {"action": "alloc", "addr": addr, "size": 1 << 20, "stream": 0, "time_us": t, "frames": []}
    snap = parse_snapshot({"segments": [], "device_traces": [[alloc(1_000_000, 1 << 30), alloc(1_000_500, 2 << 30)],
                                                           [alloc(1_000_400, 3 << 30)]]}, "<two devices>")
    trace = chrome_trace(snap)
    starts = {e["pid"]: e["ts"] for e in trace["traceEvents"] if e["ph"] == "b" and e["args"]["address"] == hex(3 << 30)}
    assert starts == {1: 400.0}             # device 1's block began 400 us after device 0's first event
    assert [e["ts"] for e in trace["traceEvents"] if e["ph"] == "b" and e["pid"] == 0] == [0.0, 500.0]
    assert trace["otherData"]["start_time_us"] == 1_000_000
    assert trace["otherData"]["devices"]["1"]["offset_us"] == 400
    assert all(e["name"] == "block" for e in trace["traceEvents"] if e["ph"] == "b")   # no stack: no site


@needs_traces
def test_a_shared_traces_devices_on_one_clock_and_slices_by_call_site():
    data = load_snapshot(next(p for p in TRACES if p.name == "expandable_oom.pickle"))
    trace = chrome_trace(data)
    t0 = min(e["time_us"] for t in data["device_traces"] for e in t)
    oom = next(e for t in data["device_traces"] for e in t if e["action"] == "oom")
    marked = next(e for e in trace["traceEvents"] if e["ph"] == "i")
    assert marked["ts"] == oom["time_us"] - t0      # the error where it happened on the one clock
    for d, events in enumerate(data["device_traces"]):
        if events:
            first = min(e["ts"] for e in trace["traceEvents"] if e["pid"] == d and e["ph"] == "C")
            assert first == 0 if d == 0 else first > 1_000_000   # devices 1 and 2 began over a second later
    small = chrome_trace(load_snapshot(next(p for p in TRACES if p.name == "small_train.pickle")))
    names = {e["name"] for e in small["traceEvents"] if e["ph"] == "b"}
    assert "BmmBackward0 (backward)" in names and any(n.startswith("cs336_systems/trace_peak_memory.py:") for n in names)
    assert not any("CUDACachingAllocator" in n or "empty_cuda" in n for n in names)


# ============================================================================ RMM
def parse_like_rmm(text: str) -> list[dict]:
    """RMM's benchmarks/utilities/log_parser.hpp, in Python: the header's columns by name,
    Thread/Size/Stream as unsigned integers, Pointer as hex, Action 'allocate' or 'free'."""
    rows = list(csv.DictReader(io.StringIO(text)))
    out = []
    for r in rows:
        assert r["Action"] in ("allocate", "free")
        assert r["Pointer"].startswith("0x")
        out.append({"thread": int(r["Thread"]), "action": r["Action"], "pointer": int(r["Pointer"], 16),
                    "size": int(r["Size"]), "stream": int(r["Stream"]), "time": r["Time"]})
    return out


def check_replayable(rows: list[dict]) -> None:
    """What RMM's replay needs: every free matches a live allocation of the same pointer and size."""
    live = {}
    for r in rows:
        if r["action"] == "allocate":
            assert r["pointer"] not in live
            live[r["pointer"]] = r["size"]
        else:
            assert live.pop(r["pointer"]) == r["size"]


def test_rmm_csv_of_our_dump(ours):
    a, snap = ours
    text = rmm_csv(snap)
    assert text.splitlines()[0] == RMM_HEADER == "Thread,Time,Action,Pointer,Size,Stream"
    rows = parse_like_rmm(text)
    check_replayable(rows)
    stats = a.memory_stats()
    assert sum(r["action"] == "allocate" for r in rows) == stats["allocation.all.allocated"]
    assert sum(r["action"] == "free" for r in rows) == stats["allocation.all.freed"]
    live = sum(r["size"] if r["action"] == "allocate" else -r["size"] for r in rows)
    assert live == stats["requested_bytes.all.current"]
    assert {r["thread"] for r in rows} == {1} and {r["stream"] for r in rows} == {0, 1}
    assert all(len(r["time"]) == 15 and r["time"][2] == ":" and r["time"][8] == "." for r in rows)


@needs_traces
@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_rmm_csv_of_every_shared_trace_is_replayable(path):
    data = load_snapshot(path)
    for d, trace in enumerate(data["device_traces"]):
        if not trace:
            continue
        rows = parse_like_rmm(rmm_csv(data, d))
        check_replayable(rows)
        allocs = sum(e["action"] == "alloc" for e in trace)
        early = [lt for lt in build_timeline(data, d).lifetimes if lt.live_at_start and lt.freed_at is not None]
        assert sum(r["action"] == "allocate" for r in rows) == allocs + len(early)


def test_rmm_csv_needs_a_device_when_several_have_events():
    snap = {"segments": [], "device_traces": [[{"action": "alloc", "addr": 512, "size": 1, "stream": 0}]] * 2}
    from amem_alloc.snapshot import parse_snapshot

    with pytest.raises(ValueError, match="choose one"):
        rmm_csv(parse_snapshot(snap))
    assert rmm_csv(parse_snapshot(snap), 1).count("allocate") == 1


# ============================================================================ files and the command
def test_write_export_names_per_device_files_like_rmm(tmp_path):
    snap = {"segments": [], "device_traces": [[{"action": "alloc", "addr": 512, "size": 1, "stream": 0}]] * 2}
    from amem_alloc.snapshot import parse_snapshot

    paths = write_export(parse_snapshot(snap), tmp_path / "log.csv", "rmm")
    assert [p.name for p in paths] == ["log.dev0.csv", "log.dev1.csv"]
    with pytest.raises(ValueError, match="unknown export format"):
        write_export(parse_snapshot(snap), tmp_path / "x", "svg")


def test_amem_export_command(tmp_path, ours):
    _, snap = ours
    from amem_alloc.snapshot import save_snapshot

    src = save_snapshot(snap, tmp_path / "ours.pickle")
    proc = run_command([AMEM, "export", str(src), "-f", "chrome", "-o", str(tmp_path / "t.json")])
    assert proc.returncode == 0, proc.stderr
    check_chrome(json.loads((tmp_path / "t.json").read_text()))
    proc = run_command([AMEM, "export", str(src), "-f", "rmm", "-o", str(tmp_path / "t.csv")])
    assert proc.returncode == 0, proc.stderr
    check_replayable(parse_like_rmm((tmp_path / "t.csv").read_text()))
    bad = tmp_path / "bad.pickle"
    bad.write_bytes(b"\x80\x04garbage")
    proc = run_command([AMEM, "export", str(bad), "-o", str(tmp_path / "x.json")])
    assert proc.returncode == 2 and "bad.pickle" in proc.stderr and "Traceback" not in proc.stderr
