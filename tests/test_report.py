"""`amem report`: a self-contained HTML page for our dumps and torch's. Its figures (rebuilt from the
events) are checked against amem's stats; traces that start mid-run never go negative and say so;
nothing on the page reaches the network. The headless-browser check of these pages is in
test_report_forensics.py (one chromium launch for every page it loads)."""
import json
import re
import sys
from pathlib import Path

import pytest

from amem_alloc import Allocator, load_snapshot, render_report, write_report
from amem_alloc.report.data import report_data
from amem_alloc.timeline import build_timeline, segments_at
from amem_alloc.snapshot import parse_snapshot

from helpers import run_command
from test_snapshot import TRACES, host_run, needs_traces

AMEM = str(Path(sys.executable).parent / "amem")


@pytest.fixture(scope="module")
def ours():
    a, keep = host_run(record_stacks="python")
    return a, a.snapshot()


# ============================================================================ figures
def test_timeline_ends_at_amem_stats_and_peaks_match(ours):
    a, snap = ours
    stats = a.memory_stats()
    tl = build_timeline(parse_snapshot(snap), 0)
    assert tl.allocated[0] == 0 and tl.reserved[0] == 0  # recorded from the first allocation
    assert tl.allocated[-1] == stats["allocated_bytes.all.current"]
    assert tl.reserved[-1] == stats["reserved_bytes.all.current"]
    assert max(tl.allocated) == stats["allocated_bytes.all.peak"]
    assert max(tl.reserved) == stats["reserved_bytes.all.peak"]
    assert all(0 <= f <= 1 for f in tl.fragmentation())


def test_segment_map_at_the_end_is_the_allocators_segments(ours):
    a, snap = ours
    data = parse_snapshot(snap)
    tl = build_timeline(data, 0)
    segs, unplaced = segments_at(data, tl, len(tl.events))
    assert unplaced["count"] == 0
    assert [(s["address"], s["size"]) for s in segs] == sorted((s.address, s.total_size) for s in a.segments())
    start, _ = segments_at(data, tl, 0)
    assert start == []  # nothing was reserved before the first event


def test_segment_map_at_the_peak_is_what_the_allocator_held_then():
    """Replays a sequence, takes the allocator's own segments at its allocated peak, and compares
    them with the map rebuilt backwards from the end of the trace."""
    a = Allocator(backend="sim")
    a.record()
    live = [a.malloc(s) for s in (5 << 20, 700, 12 << 20, 3000, 25 << 20)]
    at_peak = sorted((s.address, s.total_size, tuple((b.address, b.state) for b in s.blocks if b.state != "inactive"))
                     for s in a.segments())
    for p in live[::2]:
        a.free(p)
    a.empty_cache()
    a.malloc(1 << 20)
    data = parse_snapshot(a.snapshot())
    tl = build_timeline(data, 0)
    segs, _ = segments_at(data, tl, tl.peak_point)
    rebuilt = sorted((s["address"], s["size"], tuple((addr, state) for addr, _, state in s["blocks"])) for s in segs)
    assert rebuilt == at_peak


def test_a_trace_that_starts_mid_run_counts_live_blocks_from_the_start():
    a = Allocator(backend="sim")
    early = [a.malloc(s) for s in (1 << 20, 3 << 20, 5000)]  # before recording
    a.record()
    a.free(early[0])
    x = a.malloc(2 << 20)
    a.free(x)
    data = parse_snapshot(a.snapshot())
    tl = build_timeline(data, 0)
    stats = a.memory_stats()
    assert tl.allocated[0] == sum(b.size for s in a.segments() for b in s.blocks if b.state != "inactive") + (1 << 20)
    assert tl.allocated[-1] == stats["allocated_bytes.all.current"] and min(tl.allocated) >= 0
    assert tl.reserved[-1] == stats["reserved_bytes.all.current"] == tl.reserved[0]
    page = render_report(data)
    assert "starts mid-run" in page and "live since before recording began" in page


# ============================================================================ the page
def external_references(page: str) -> list[str]:
    """Anything that would make the browser fetch: src/href to a URL, CSS url()/@import, fetch calls."""
    patterns = [r"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", r"url\(", r"@import", r"\bfetch\(",
                r"XMLHttpRequest", r"<link\b", r"<iframe\b", r"<img\b"]
    return [p for p in patterns if re.search(p, page, re.I)]


def test_our_report_shows_tags_stacks_and_no_external_resources(ours):
    _, snap = ours
    page = render_report(parse_snapshot(snap), title="ours")
    assert external_references(page) == []
    assert "default-src 'none'" in page  # the page's CSP forbids every fetch
    for text in ("Allocated vs reserved over time", "Fragmentation over time", "Segment map at the peak",
                 "largest allocations", "warmup", "test_snapshot.py", "Allocator settings",
                 "Allocated memory by call site over time", "What holds memory at the peak"):
        assert text in page
    data = json.loads(re.search(r'<script type="application/json" id="amem-data">(.*?)</script>', page, re.S).group(1))
    assert data["devices"][0]["segmap"]["rows"] and data["devices"][0]["series"]["allocated"]


def test_strings_from_the_trace_are_escaped():
    evil = "<script>alert('x')</script>"
    snap = {"segments": [], "device_traces": [[{"action": "alloc", "addr": 4096, "size": 100, "stream": 0,
                                                "user_metadata": evil,
                                                "frames": [{"filename": evil, "line": 1, "name": evil}]}]],
            "allocator_settings": {evil: evil}}
    page = render_report(parse_snapshot(snap), provenance={evil: [evil]})
    assert evil not in page and "alert" in page  # present, but only as escaped text
    assert page.count("<script") == 2  # the data block and the page's own script


def test_provenance_section(ours):
    _, snap = ours
    prov = {"ops": [{"name": "aten::mm", "bytes": 1 << 20}] * 30, "modules": {"encoder": 123}, "version": 1}
    page = render_report(parse_snapshot(snap), provenance=prov)
    assert '<section class="provenance">' in page and "aten::mm" in page and "encoder" in page
    assert '<section class="provenance">' not in render_report(parse_snapshot(snap))
    with pytest.raises(ValueError, match="provenance must be a dict"):
        write_report(snap, "/dev/null", provenance=["not", "a", "dict"])


@needs_traces
@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_report_of_every_shared_trace(path, tmp_path):
    out = write_report(path, tmp_path / "r.html")
    page = out.read_text()
    assert external_references(page) == []
    data = load_snapshot(path)
    summary = report_data(data)
    assert summary["devices"]
    for dev in summary["devices"]:
        assert f'id="timeline-{dev["device"]}"' in page
        assert min(dev["series"]["allocated"]) >= 0 and min(dev["series"]["reserved"]) >= 0
        assert len(dev["series"]["t"]) <= 4100
    expected = {"lm_medium_ctx128_training.pickle": "starts mid-run",
                "multistream_4dev.pickle": "no timestamps",
                "lm_ctx128_fullstep.pickle": "live since before recording began",
                "expandable_oom.pickle": "out of memory"}
    if path.name in expected:
        assert expected[path.name] in page


@needs_traces
def test_report_figures_on_a_torch_trace_match_its_segments():
    data = load_snapshot(next(p for p in TRACES if p.name == "multistream_4dev.pickle"))
    dev = report_data(data)["devices"][0]
    reserved_at_dump = sum(s["total_size"] for s in data["segments"] if s["device"] == 0)
    assert dev["end"]["reserved"] == reserved_at_dump
    assert len(dev["streams"]) == 10


def test_amem_report_command(tmp_path, ours):
    _, snap = ours
    from amem_alloc.snapshot import save_snapshot

    src = save_snapshot(snap, tmp_path / "ours.pickle")
    prov = tmp_path / "prov.json"
    data = parse_snapshot(snap)
    live = {b["address"] for seg in data["segments"] for b in seg["blocks"] if b["state"] == "active_allocated"}
    seqs = [(e["addr"], s) for e, s in zip(data["device_traces"][0], data["amem"]["devices"][0]["columns"]["alloc_seq"])
            if e["action"] == "alloc" and e["addr"] in live]
    rows = [{"alloc_seq": s, "address": a, "category": "activation", "module": "encoder"} for a, s in seqs]
    prov.write_text(json.dumps({"format": "amem_alloc.provenance/1", "activations": [], "allocations": rows}))
    proc = run_command([AMEM, "report", str(src), "-o", str(tmp_path / "r.html"), "--provenance", str(prov)])
    assert proc.returncode == 0, proc.stderr
    page = (tmp_path / "r.html").read_text()
    assert "Provenance" in page and "By category" in page and "<code>encoder</code>" in page
    prov.write_text("[1, 2]")
    proc = run_command([AMEM, "report", str(src), "-o", str(tmp_path / "r.html"), "--provenance", str(prov)])
    assert proc.returncode == 2 and "not a provenance file" in proc.stderr and "Traceback" not in proc.stderr
    (tmp_path / "cut.pickle").write_bytes(src.read_bytes()[:100])
    proc = run_command([AMEM, "report", str(tmp_path / "cut.pickle"), "-o", str(tmp_path / "x.html")])
    assert proc.returncode == 2 and "truncated" in proc.stderr and "Traceback" not in proc.stderr


# In a real browser: tests/test_report_forensics.py loads our report, torch's and the new sections in
# one headless chromium launch (tests/report_browser.py).
