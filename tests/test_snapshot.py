"""Snapshots in torch's format: what amem dumps after a host-backend run, read back by amem and by
torch's own tools (torch.cuda._memory_viz: stats, trace, segments, memory, trace_plot,
segment_plot), whose figures must equal amem's stats; round trips ours -> load -> ours; and every
real torch snapshot in ../shared/traces loads."""
import json
import os
import pickle
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import amem_alloc
from amem_alloc import Allocator, SnapshotError, load_snapshot
from amem_alloc.snapshot import FORMAT_VERSION, amem_events, build_snapshot, save_snapshot

from helpers import ROOT, shared_traces_dir

memory_viz = pytest.importorskip("torch.cuda._memory_viz")

SEGMENT_KEYS = {"device", "address", "total_size", "allocated_size", "active_size", "requested_size", "stream",
                "segment_type", "segment_pool_id", "is_expandable", "frames", "blocks"}
BLOCK_KEYS = {"address", "size", "requested_size", "state", "frames"}
TRACE_KEYS = {"action", "size", "stream", "time_us", "frames", "compile_context", "user_metadata"}


def shared_traces() -> list[Path]:
    folder = shared_traces_dir()
    return sorted(folder.glob("*.pickle")) if folder.is_dir() else []


TRACES = shared_traces()
needs_traces = pytest.mark.skipif(not TRACES, reason="../shared/traces is not present")


def host_run(record_stacks=None):
    """A host-backend sequence: two streams, small and large pools, splits, frees, empty_cache."""
    a = Allocator(backend="host", limit_bytes=1 << 30)
    a.record(stacks=record_stacks)
    with amem_alloc.tag("warmup"):
        small = [a.malloc(s) for s in (1000, 4096, 100_000, 700)]
    big = a.malloc(30 << 20, stream=1)
    mid = a.malloc(3 << 20)
    with amem_alloc.tag("step"):
        for p in small[:2]:
            a.free(p)
        extra = a.malloc(2 << 20, stream=1)
    a.free(big)
    a.empty_cache()
    keep = [small[2], small[3], mid, extra, a.malloc(512)]
    return a, keep


@pytest.fixture()
def dumped(tmp_path):
    a, _ = host_run(record_stacks="python")
    path = a.dump_snapshot(tmp_path / "ours.pickle")
    return a, path


# ============================================================================ the format
def test_dump_has_torch_keys_and_protocol_4(dumped):
    a, path = dumped
    raw = path.read_bytes()
    assert raw[:2] == b"\x80\x04"  # protocol 4: torch's web viewer reads it
    data = pickle.loads(raw)  # plain pickle: what torch's tools do
    assert set(data) >= {"segments", "device_traces", "allocator_settings"}
    assert data["segments"] and all(set(s) == SEGMENT_KEYS for s in data["segments"])
    assert all(set(b) == BLOCK_KEYS for s in data["segments"] for b in s["blocks"])
    for s in data["segments"]:
        assert s["segment_pool_id"] == (0, 0) and s["is_expandable"] is False
        assert s["segment_type"] in ("small", "large")
        assert sum(b["size"] for b in s["blocks"]) == s["total_size"]
    trace = data["device_traces"][0]
    assert {e["action"] for e in trace} >= {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free"}
    for e in trace:
        assert set(e) == TRACE_KEYS | {"addr"}
    assert "empty_cache" not in {e["action"] for e in trace}  # torch has no such action: kept under "amem"
    assert data["amem"]["version"] == FORMAT_VERSION
    assert data["amem"]["devices"][0]["empty_cache"]
    assert data["allocator_settings"]["allocator"] == "amem_alloc"
    assert data["allocator_settings"]["AMEM_CONF"] == a.settings


def test_python_stacks_and_tags_reach_the_dump(dumped):
    _, path = dumped
    data = load_snapshot(path)
    trace = data["device_traces"][0]
    allocs = [e for e in trace if e["action"] == "alloc"]
    here = Path(__file__).name
    for e in allocs:  # innermost first, this file on top, amem's own frames left out
        assert e["frames"] and Path(e["frames"][0]["filename"]).name == here
        assert "host_run" in [f["name"] for f in e["frames"][:2]]
        assert all("amem_alloc" not in Path(f["filename"]).parts for f in e["frames"])
    assert [e["user_metadata"] for e in allocs[:4]] == ["warmup"] * 4
    assert "step" in {e["user_metadata"] for e in trace}
    assert set(data["amem"]["tags"].values()) >= {"warmup", "step"}
    frees = [e for e in trace if e["action"] == "free_requested"]
    assert all(e["frames"] for e in frees)  # a free shows the stack that allocated its block
    active = [b for s in data["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
    assert active and all(b["frames"] for b in active)


def test_round_trip_ours_load_ours(dumped, tmp_path):
    a, path = dumped
    loaded = load_snapshot(path)
    assert loaded == a.snapshot()
    events = json.loads(a._core.trace_json())["events"]
    assert amem_events(loaded, 0) == events  # every field of every event, empty_cache included
    again = save_snapshot(loaded, tmp_path / "again.pickle")
    assert again.read_bytes() == path.read_bytes()
    assert load_snapshot(again) == loaded


def test_saved_file_is_readable_by_others(dumped):
    _, path = dumped
    mode = stat.S_IMODE(os.stat(path).st_mode)
    assert mode & 0o044 == 0o044 & ~_umask()  # created like any file, not private like a temp file


def _umask() -> int:
    old = os.umask(0)
    os.umask(old)
    return old


def test_snapshot_of_an_allocator_without_recording_has_segments_only():
    a = Allocator(backend="sim")
    a.malloc(5 << 20)
    data = build_snapshot(a)
    assert data["device_traces"] == [[]] and len(data["segments"]) == 1
    assert data["amem"]["devices"][0]["recording"] is False


# ============================================================================ torch's tools read it
def _lines(text, prefix):
    return [line for line in text.splitlines() if line.startswith(prefix)]


def test_memory_viz_stats_equal_amem_stats(dumped):
    a, path = dumped
    stats = a.memory_stats()
    data = pickle.loads(path.read_bytes())
    text = memory_viz.segsum(data)
    Bytes = memory_viz.Bytes
    assert f"segments: {stats['segment.all.current']}" in text
    assert f"total_reserved: {Bytes(stats['reserved_bytes.all.current'])}" in text
    assert f"total_allocated: {Bytes(stats['requested_bytes.all.current'])}" in text
    free_external = stats["reserved_bytes.all.current"] - stats["allocated_bytes.all.current"]
    free_internal = stats["allocated_bytes.all.current"] - stats["requested_bytes.all.current"]
    assert f"total_free: {memory_viz._report_free(free_external, free_internal)}" in text


def test_memory_viz_trace_counts_equal_amem_stats(dumped):
    a, path = dumped
    stats = a.memory_stats()
    data = pickle.loads(path.read_bytes())
    text = memory_viz.trace(data)
    assert f"{len(data['device_traces'][0])} entries" in text
    assert len(re.findall(r"= cudaMalloc\(", text)) == stats["num_device_alloc"]
    assert len(_lines(text, "cudaFree(")) == stats["num_device_free"]
    assert len(re.findall(r"^\w+ = (seg_\d+|MEM|\w+)\[", text, re.M)) == stats["allocation.all.allocated"]
    assert len(_lines(text, "del ")) == stats["allocation.all.freed"]


def test_memory_viz_flamegraph_inputs_add_up_to_amem_stats(dumped):
    a, path = dumped
    stats = a.memory_stats()
    data = pickle.loads(path.read_bytes())
    for fn in (memory_viz.segments, memory_viz.memory):
        lines = fn(data, format_flamegraph=lambda text: text).splitlines()
        sizes = [(line.split(";")[1 if fn is memory_viz.memory else 2], int(line.rsplit(" ", 1)[1])) for line in lines]
        assert sum(n for _, n in sizes) == stats["reserved_bytes.all.current"]
        assert sum(n for state, n in sizes if state == "active_allocated") == stats["allocated_bytes.all.current"]
        assert any("test_snapshot.py" in line for line in lines)  # our stacks, as torch formats them


def test_memory_viz_plots_accept_it(dumped):
    _, path = dumped
    data = pickle.loads(path.read_bytes())
    for html in (memory_viz.trace_plot(data), memory_viz.trace_plot(data, plot_segments=True),
                 memory_viz.segment_plot(data)):
        assert "snapshot.pickle" in html and "base64" in html


@pytest.fixture()
def fake_flamegraph_home(tmp_path):
    """torch's segments/memory commands pipe into ~/.cache/flamegraph.pl (downloaded if missing):
    a stand-in that echoes its input keeps the test offline."""
    home = tmp_path / "home"
    (home / ".cache").mkdir(parents=True)
    script = home / ".cache" / "flamegraph.pl"
    script.write_text("#!/bin/sh\ncat\n")
    script.chmod(0o755)
    return home


VIZ_COMMANDS = ("stats", "trace", "segments", "memory", "trace_plot", "segment_plot")


RUN_AS_MAIN = """
import contextlib, runpy, sys
out_dir, path = sys.argv[1], sys.argv[2]
for command in sys.argv[3:]:
    sys.argv = ["_memory_viz", command, path]
    if command not in ("stats", "trace"):
        sys.argv += ["-o", f"{out_dir}/out.{command}"]
    with open(f"{out_dir}/stdout.{command}", "w") as f, contextlib.redirect_stdout(f):
        runpy.run_module("torch.cuda._memory_viz", run_name="__main__", alter_sys=True)
"""


def test_python_m_memory_viz_reads_our_dump(dumped, tmp_path, fake_flamegraph_home):
    """Every `python -m torch.cuda._memory_viz` subcommand: its __main__ code, in one child process
    (torch takes seconds to import)."""
    a, path = dumped
    env = {**os.environ, "HOME": str(fake_flamegraph_home)}
    proc = subprocess.run([sys.executable, "-c", RUN_AS_MAIN, str(tmp_path), str(path), *VIZ_COMMANDS],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    out = {c: (tmp_path / f"stdout.{c}").read_text() for c in VIZ_COMMANDS}
    reserved = memory_viz.Bytes(a.memory_stats()["reserved_bytes.all.current"])
    assert f"total_reserved: {reserved}" in out["stats"]
    assert "Device 0" in out["trace"] and "cudaMalloc" in out["trace"]
    for command in ("segments", "memory"):
        assert "active_allocated" in (tmp_path / f"out.{command}").read_text()
    for command in ("trace_plot", "segment_plot"):
        assert "base64" in (tmp_path / f"out.{command}").read_text()


# ============================================================================ torch's snapshots
@needs_traces
@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_every_shared_trace_loads_and_round_trips(path, tmp_path):
    data = load_snapshot(path)
    assert data["segments"] and isinstance(data["device_traces"], list)
    again = load_snapshot(save_snapshot(data, tmp_path / "copy.pickle"))
    assert again == data
    for d, trace in enumerate(data["device_traces"]):
        events = amem_events(data, d)
        assert len(events) == len(trace)
        assert all(e["rounded_size"] % 512 == 0 for e in events)


@needs_traces
def test_torch_tools_and_amem_agree_on_a_shared_trace():
    data = load_snapshot(next(p for p in TRACES if p.name == "small_train.pickle"))
    total = sum(s["total_size"] for s in data["segments"])
    assert f"total_reserved: {memory_viz.Bytes(total)}" in memory_viz.segsum(data)


def test_load_accepts_torchs_bare_segment_list(tmp_path):
    a = Allocator(backend="sim")
    a.malloc(1 << 20)
    segments = a.snapshot()["segments"]
    path = tmp_path / "segments.pickle"
    path.write_bytes(pickle.dumps(segments, protocol=4))
    data = load_snapshot(path)
    assert data["segments"] == segments and data["device_traces"] == []


def test_load_error_names_the_file(tmp_path):
    with pytest.raises(SnapshotError, match="missing.pickle"):
        load_snapshot(tmp_path / "missing.pickle")
