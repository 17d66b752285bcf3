"""The report answers "where did my memory go?": call sites that are the user's (or the autograd
node), never the allocator's; what holds memory at the peak, grouped and stacked over time; every
segment in the map; the share live before recording; and for an out-of-memory error, a panel
that says why it failed and which policy would have avoided it, replayed. The pages are then
loaded in headless chromium (one launch for several pages; tests/report_browser.py checks every
shared trace and writes screenshots)."""
import functools
import re

import pytest

import amem_alloc
from amem_alloc import policies

from amem_alloc import Allocator, load_snapshot, render_report, write_report
from amem_alloc.snapshot.callsite import call_site
from amem_alloc.report.data import report_data
from amem_alloc.snapshot import parse_snapshot, save_snapshot

from report_browser import CHROMIUM, attribute, check_page, render_pages, start_tag
from test_snapshot import TRACES, host_run, needs_traces

MiB = 1 << 20
ALLOCATOR_INTERNALS = ("CUDACachingAllocator", "c10::", "at::detail", "unwind", "CapturedTraceback", "empty_cuda")


def trace(name: str):
    path = next((p for p in TRACES if p.name == name), None)
    if path is None:
        pytest.skip(f"{name} is not among the shared traces")
    return path


@functools.lru_cache(maxsize=None)
def data_of(name: str) -> dict:
    return report_data(load_snapshot(trace(name)), replay_ooms=name == "expandable_oom.pickle")


def frame(filename: str, name: str, line: int = 0) -> dict:
    return {"filename": filename, "line": line, "name": name}


# ============================================================================ call sites
def test_call_site_skips_the_allocator_and_torch_for_the_users_frame_or_the_autograd_node():
    alloc = [frame("CUDACachingAllocator.cpp", "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc("
                   "signed char, unsigned long, CUstream_st*)"),
             frame("??", "at::detail::empty_cuda(c10::ArrayRef<long>, c10::TensorOptions const&)"),
             frame("??", "at::_ops::bmm::call(at::Tensor const&, at::Tensor const&)")]
    node = [frame("??", "torch::autograd::generated::BmmBackward0::apply(std::vector<at::Tensor>&&)"),
            frame("", "torch::autograd::Node::operator()(std::vector<at::Tensor>&&)")]
    user = [frame("torch/nn/modules/module.py", "_call_impl", 1750), frame("module.py", "_wrapped_call_impl", 1739),
            frame("einops/einops.py", "einsum", 9), frame("model.py", "forward", 42), frame("train.py", "main", 7)]
    assert call_site(alloc + node) == ("BmmBackward0 (backward)", "autograd")
    assert call_site(alloc + user) == ("model.py:42 forward", "python")
    assert call_site(alloc) == ("aten::bmm", "op")
    div = [frame("", "at::_ops::div_Tensor::call(at::Tensor const&, at::Tensor const&)")]
    assert call_site(div)[0] == "aten::div.Tensor"
    # a Python frame before the node (a custom autograd.Function's backward): the user's code
    assert call_site(alloc + user[3:] + node)[0] == "model.py:42 forward"
    acc = [frame("??", "torch::autograd::AccumulateGrad::apply(std::vector<at::Tensor>&&)")]
    assert call_site(alloc + acc)[0] == "AccumulateGrad (backward)"
    assert call_site([])[1] == "none"
    assert call_site(user[:3])[1] == "python"  # only torch's frames: the innermost one, not nothing


@needs_traces
def test_small_trains_largest_allocations_name_the_autograd_node_not_the_allocator():
    top = data_of("small_train.pickle")["devices"][0]["top"]
    big = [r for r in top if r["block"] == 512 * MiB]   # the attention's 512 MiB blocks, forward then backward
    assert [r["count"] for r in big[:4]] == [1, 1, 2, 1]      # rows 1-4: the user's own frames (forward)
    for row in big[4:]:  # the 10 made in backward (rows 6-15 before repeats were folded), in 5 rows
        assert row["site"].endswith("(backward)") and "Backward0" in row["site"], row["site"]
    assert sum(r["count"] for r in big[4:]) == 10 and len(big) == 9
    assert next(r for r in big if r["site"] == "DivBackward0 (backward)")["count"] == 6   # one row, not six
    page = render_report(load_snapshot(trace("small_train.pickle")))
    assert '<code class="site">BmmBackward0 (backward)</code>' in page


@needs_traces
@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_no_call_site_of_a_shared_trace_is_the_allocators(path):
    data = data_of(path.name)
    for dev in data["devices"]:
        sites = [r["site"] for r in dev["top"]] + [g["key"] for g in dev["held"]["by_site"]]
        sites += [b["name"] for b in dev["stacked"]["bands"]]
        for site in sites:
            assert not any(s in site for s in ALLOCATOR_INTERNALS), (path.name, site)


# ============================================================================ held at the peak
@needs_traces
@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_held_at_the_peak_stacked_bands_and_segment_map_add_up(path):
    for dev in data_of(path.name)["devices"]:
        held = dev["held"]
        assert held["bytes"] == dev["peak"]["allocated"]
        assert sum(g["bytes"] for g in held["by_site"]) == held["bytes"]
        assert 0 <= held["before"] <= held["bytes"]
        bands = dev["stacked"]["bands"]
        for k, allocated in enumerate(dev["series"]["allocated"]):
            assert sum(b["values"][k] for b in bands) == allocated
        seg = dev["segmap"]
        assert sum(r["count"] for r in seg["rows"]) == seg["segments"]  # every segment is in the map
        assert sum(r["size"] for r in seg["rows"]) == seg["reserved"]
        assert len(seg["rows"]) <= 120


@needs_traces
def test_hundreds_of_segments_are_aggregated_not_dropped():
    seg = data_of("lm_ctx128_fullstep.pickle")["devices"][0]["segmap"]
    assert seg["segments"] == 1010 and sum(r["count"] for r in seg["rows"]) == 1010
    aggregated = [r for r in seg["rows"] if r.get("aggregate")]
    assert aggregated and sum(r["count"] for r in aggregated) == 1010 - 48
    assert all(r["smallest"] <= r["largest"] <= 2 * r["smallest"] for r in aggregated)  # one size class each


@needs_traces
def test_a_mid_run_trace_says_how_much_was_live_before_recording():
    dev = data_of("lm_medium_ctx128_training.pickle")["devices"][0]
    held = dev["held"]
    assert held["before_share"] > 0.5  # weights, gradients and optimizer state predate the recording
    assert dev["stacked"]["bands"][0]["name"] == "live before recording"
    assert dev["stacked"]["bands"][0]["values"][0] == dev["series"]["allocated"][0]
    page = render_report(load_snapshot(trace("lm_medium_ctx128_training.pickle")))
    assert f"{held['before'] / held['bytes']:.0%}) of it was live before recording began" in page
    assert "live before recording, at the peak" in page


def tagged_trace_and_tracer_rows() -> tuple[dict, dict]:
    """An amem trace with tags, and Tracer rows (joined by allocation number) for its blocks."""
    a = Allocator(backend="sim")
    a.record()
    with amem_alloc.tag("forward"):
        x, y = a.malloc(3 * MiB), a.malloc(5 * MiB)
    with amem_alloc.tag("optimizer"):
        z = a.malloc(7 * MiB)
    a.free(a.malloc(2 * MiB))  # made and freed: in the timeline, not at the end
    snap = parse_snapshot(a.snapshot())
    seqs = [s for e, s in zip(snap["device_traces"][0], snap["amem"]["devices"][0]["columns"]["alloc_seq"])
            if e["action"] == "alloc"]
    rows = [{"alloc_seq": seqs[0], "address": x, "category": "activation", "module": "encoder.0", "allocator_bytes": 3 * MiB},
            {"alloc_seq": seqs[1], "address": y, "category": "activation", "module": "encoder.1", "allocator_bytes": 5 * MiB},
            {"alloc_seq": seqs[2], "address": z, "category": "optimizer_state", "module": None, "allocator_bytes": 7 * MiB}]
    return snap, {"format": "amem_alloc.provenance/1", "activations": [], "allocations": rows}


def test_category_and_module_from_a_tracers_json_and_tags():
    snap, prov = tagged_trace_and_tracer_rows()
    rows = prov["allocations"]
    held = report_data(snap, provenance={"allocations": rows})["devices"][0]["held"]
    # at the peak: the three traced blocks and the 2 MiB one the Tracer did not see
    assert {g["key"]: g["bytes"] for g in held["by_category"]} == {
        "optimizer_state": 7 * MiB, "activation": 8 * MiB, "(not traced)": 2 * MiB}
    assert {g["key"]: g["bytes"] for g in held["by_module"]} == {
        "(outside the model)": 7 * MiB, "encoder.1": 5 * MiB, "encoder.0": 3 * MiB, "(not traced)": 2 * MiB}
    assert held["joined"] == {"seq": 3, "address": 0, "none": 1}
    assert {g["key"]: g["bytes"] for g in held["by_tag"]} == {"optimizer": 7 * MiB, "forward": 8 * MiB,
                                                             "(untagged)": 2 * MiB}
    dev = report_data(snap, provenance=prov)["devices"][0]
    bands = {b["name"]: b["values"] for b in dev["stacked_categories"]["bands"]}
    assert set(bands) == {"activation", "optimizer_state", "(not traced)"}
    assert bands["activation"][-1] == 8 * MiB and bands["optimizer_state"][-1] == 7 * MiB
    assert max(bands["(not traced)"]) == 2 * MiB and bands["(not traced)"][-1] == 0  # while it lived
    for k, allocated in enumerate(dev["series"]["allocated"]):
        assert sum(v[k] for v in bands.values()) == allocated
    page = render_report(snap, provenance=prov)
    for text in ("By category", "By module", "optimizer_state", "encoder.1", "By tag",
                 "Allocated memory by category over time"):
        assert text in page


# ============================================================================ out of memory
def fragmented_oom_dump() -> dict:
    """amem's own dump at an out-of-memory error: 80 MiB reserved in four 20 MiB segments, each
    two thirds free in pieces of 6 and 8 MiB; a 30 MiB request on a 100 MiB device fails."""
    from amem_alloc import OutOfMemoryError

    a = Allocator(backend="sim", limit_bytes=100 * MiB)
    a.record()
    blocks = [a.malloc(6 * MiB) for _ in range(12)]
    for i, p in enumerate(blocks):
        if i % 3 != 1:
            a.free(p)
    with pytest.raises(OutOfMemoryError):
        a.malloc(30 * MiB)
    return a.snapshot()


def test_an_oom_caused_by_fragmentation_names_the_setting_that_avoids_it(tmp_path):
    path = save_snapshot(fragmented_oom_dump(), tmp_path / "trace.oom.pickle")
    dev = report_data(load_snapshot(path))["devices"][0]
    (panel,) = dev["oom_panels"]
    assert (panel["size"], panel["device_free"], panel["reserved"]) == (30 * MiB, 20 * MiB, 80 * MiB)
    assert (panel["allocated"], panel["cache_free"], panel["largest_free"]) == (24 * MiB, 56 * MiB, 8 * MiB)
    assert panel["fragmentation"]
    assert "56.00 MiB free in the cache, largest block 8.00 MiB < the 30.00 MiB request" in panel["verdict"]
    assert panel["held"]["bytes"] == panel["allocated"]
    results = {r["policy"]: r for r in panel["replay"]["rows"]}
    assert set(results) == set(policies.POLICIES)  # every named policy replayed
    assert results["torch"]["fits"] is False  # the replay reproduces the error under the policy that made it
    assert results["torch-expandable"]["fits"] is True
    assert results["torch-expandable"]["text"].startswith("torch-expandable would have fit with ")
    page = write_report(path, tmp_path / "r.html").read_text()
    assert 'class="oom-panel"' in page and "torch-expandable would have fit with" in page
    assert "largest block 8.00 MiB &lt; the 30.00 MiB request" in page


@needs_traces
def test_the_shared_oom_trace_gets_a_panel_with_every_policy_replayed():
    dev = next(d for d in data_of("expandable_oom.pickle")["devices"] if d["ooms"])
    (panel,) = dev["oom_panels"]
    assert (dev["device"], panel["size"], panel["device_free"]) == (1, 5308694528, 95682560)
    assert not panel["fragmentation"] and panel["verdict"].startswith("Not fragmentation")
    assert panel["held"]["bytes"] == panel["allocated"]
    assert panel["held"]["by_site"][0]["key"].startswith("train/models.py:")
    assert panel["capacity"] == panel["reserved"] + panel["device_free"]
    rows = panel["replay"]["rows"]
    assert len(rows) == len(policies.POLICIES) and all(r["fits"] is False for r in rows)  # 4.9 GiB asked, 224 MiB free: no setting helps
    page = render_report(load_snapshot(trace("expandable_oom.pickle")))
    assert "no policy avoids it: the memory was in use" in page
    table = page[page.index('<table class="oom-replay">'):]
    table = table[:table.index("</table>")]
    shown = re.findall(r'<tr class="fails"><td><code>([^<]*)</code>', table)
    # the policies that fail alike (as many requests refused) share a row: 16 rows of "fails too" read as 3
    assert len(shown) == len({r["failed"] for r in rows}) < len(rows)
    assert sorted(n for row in shown for n in row.split(", ")) == sorted(r["policy"] for r in rows)
    assert re.search(r"all \d+ fail too \(1 request refused each\)", table)


# ============================================================================ in a real browser
needs_chromium = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="/usr/bin/chromium is absent: `make test-python` installs Debian's chromium (apt-get install chromium)")
BROWSER_TRACES = ("small_train.pickle", "expandable_oom.pickle", "lm_ctx128_fullstep.pickle", "multistream_4dev.pickle")


@needs_chromium
def test_the_browser_draws_every_section(tmp_path):
    """The one chromium launch of the test suite: amem's own dump (tags, stacks, two streams),
    amem's OOM dump, a trace with a Tracer's categories, and shared traces (an OOM on one of three
    devices, 1,010 segments, the autograd-node case, 4 devices and 10 streams).
    `python tests/report_browser.py OUT` checks every shared trace and writes screenshots."""
    ours = parse_snapshot(host_run(record_stacks="python")[0].snapshot())
    oom = parse_snapshot(fragmented_oom_dump())
    tagged, prov = tagged_trace_and_tracer_rows()
    pages, datas = [], []
    for name, snap, provenance in (("ours", ours, None), ("oom", oom, None), ("categories", tagged, prov)):
        pages.append(tmp_path / f"{name}.html")
        pages[-1].write_text(render_report(snap, provenance=provenance))
        datas.append(report_data(snap, provenance=provenance, replay_ooms=False))
    for name in BROWSER_TRACES:
        path = next((p for p in TRACES if p.name == name), None)
        if path is not None:
            pages.append(write_report(path, tmp_path / f"{path.stem}.html"))
            datas.append(data_of(name))
    doms = render_pages(pages, tmp_path)
    for dom, data in zip(doms, datas):
        check_page(dom, data)
        lines = re.findall(r'<path[^>]*class="plot-line"[^>]*>', dom)
        assert len(lines) == 3 * len(data["devices"]) and all(len(attribute(p, "d")) > 10 for p in lines)
    rects = int(attribute(start_tag(doms[0], "segmap-0"), "data-rects"))
    assert rects >= 4 and doms[0].count('class="block"') == rects  # every block of our dump drawn
    assert re.search(r'<g class="oom-marker">.*?OOM 30.0 MiB', doms[1], re.S)
    assert "torch-expandable would have fit with" in doms[1]


def test_a_tracers_rows_join_a_torch_trace_by_address_and_block_size():
    """torch's traces carry no allocation number: a Tracer row labels a live block when it is the
    only row at that address with that block size."""
    events = [{"action": "alloc", "addr": a, "size": n, "stream": 0} for a, n in ((1 << 30, 2 * MiB), (2 << 30, 4 * MiB))]
    snap = parse_snapshot({"segments": [], "device_traces": [events]})
    rows = [{"address": 1 << 30, "allocator_bytes": 2 * MiB, "category": "parameter", "module": "fc"},
            {"address": 2 << 30, "allocator_bytes": 4 * MiB, "category": "activation", "module": "fc"},
            {"address": 2 << 30, "allocator_bytes": 4 * MiB, "category": "temporary", "module": "fc"}]  # ambiguous
    held = report_data(snap, provenance={"allocations": rows})["devices"][0]["held"]
    assert {g["key"]: g["bytes"] for g in held["by_category"]} == {"(not traced)": 4 * MiB, "parameter": 2 * MiB}
    assert held["joined"] == {"seq": 0, "address": 1, "none": 1}


@needs_traces
def test_segment_map_blocks_name_their_call_site():
    seg = data_of("small_train.pickle")["devices"][0]["segmap"]
    labels = [b[3] for row in seg["rows"] for b in row["blocks"]]
    assert labels and not any(s in label for label in labels for s in ALLOCATOR_INTERNALS)
    assert any(label.endswith("(backward)") for label in labels)
