"""amem_alloc.predict / predicting: per-policy peaks, the smallest capacity, fits and headroom,
what holds memory at the peak, and the JSON / trace / report outputs, on allocation sequences
known in advance (the engine replaced by tests/predict_double.py)."""
import json

import pytest

torch = pytest.importorskip("torch")

import amem_alloc  # noqa: E402
from amem_alloc import policies  # noqa: E402
from amem_alloc.predict import gpus  # noqa: E402
from predict_double import DoubleSession  # noqa: E402

MiB = 1 << 20


def _cache_then_bigger():
    """100 MiB parameter kept; a 60 MiB block freed, then a 70 MiB one: the cached 60 MiB segment
    cannot serve it, so an unlimited device reserves both, but a tight one frees the cache first."""
    s = DoubleSession.last
    s.alloc(100 * MiB, "parameter", module="net.lin", op="aten::empty")
    a = s.alloc(60 * MiB, "activation", module="net.lin", op="aten::mm", frames=(("train.py", 9, "fwd"),))
    s.free(a)
    s.alloc(70 * MiB, "gradient", module="net.lin", op="MmBackward0")


def test_predict_answers_per_policy():
    p = amem_alloc.predict(_cache_then_bigger, capacity_gb=0.2, session_factory=DoubleSession)
    assert [r.policy for r in p.rows] == list(policies.DEFAULT_COMPARE)
    torch_row = p.row("torch")
    assert torch_row.peak_allocated == 170 * MiB
    assert torch_row.peak_reserved == 230 * MiB                       # 100 + 60 (cached) + 70
    assert torch_row.min_capacity == 170 * MiB                        # OOM frees the cached 60, retries
    assert torch_row.fits and torch_row.headroom == int(0.2 * (1 << 30)) - 230 * MiB < 0
    # One stream: cross-stream handover changes nothing. Both growing segments reuse the freed 60 MiB
    # at their end and map the other 10 MiB in pages: one 20 MiB page for torch-expandable. amem maps
    # a segment's first 128 MiB in 2 MiB pages and 10 MiB pages after (fine_pages_mb:128,
    # large_page_mb:10): the 60 MiB block at 100 MiB maps up to 168 MiB, the 70 MiB one a page more.
    assert p.row("torch-expandable").peak_reserved == (100 + 60 + 20) * MiB
    assert p.row("amem").peak_reserved == (128 + 40 + 10) * MiB
    assert p.row("amem-roundup4").peak_allocated > torch_row.peak_allocated
    text = amem_alloc.format_prediction(p)
    assert "PREDICTION without a GPU" in text and "yes*" in text and "emptying its cache" in text
    tight = amem_alloc.predict(_cache_then_bigger, capacity_gb=0.16, session_factory=DoubleSession)
    assert not tight.row("torch").fits and "NO" in amem_alloc.format_prediction(tight)


def test_what_holds_memory_at_the_peak():
    p = amem_alloc.predict(_cache_then_bigger, session_factory=DoubleSession)
    assert p.at_peak.categories == {"parameter": 100 * MiB, "gradient": 70 * MiB}
    assert p.at_peak.modules == {"net.lin": 170 * MiB}
    assert p.at_peak.ops == {"aten::empty": 100 * MiB, "MmBackward0": 70 * MiB}
    assert p.at_peak.allocated == 170 * MiB and p.at_peak.op == 3


def test_json_has_the_documented_schema(tmp_path):
    p = amem_alloc.predict(_cache_then_bigger, gpu="h100", policies="torch,torch-expandable",
                           session_factory=DoubleSession)
    data = json.loads(p.write_json(tmp_path / "p.json").read_text())
    card = gpus.get("H100-80GB")
    assert data["gpu"]["name"] == card.name and data["gpu"]["capacity_bytes"] == card.total_memory
    assert [r["policy"] for r in data["policies"]] == ["torch", "torch-expandable"]
    for row in data["policies"]:
        assert {"policy", "peak_allocated", "peak_reserved", "min_capacity", "fits"} <= set(row)
        assert isinstance(row["fits"], bool) and row["min_capacity"] <= row["peak_reserved"]
    assert data["at_peak"] == {"parameter": 100 * MiB, "gradient": 70 * MiB}
    assert data["predicted"] is True and "without a GPU" in data["note"]


def test_trace_opens_in_torch_memory_viz_and_in_amem(tmp_path):
    from torch.cuda import _memory_viz

    from amem_alloc.replay.trace import format_text, replay_trace
    from amem_alloc.snapshot import load_snapshot

    p = amem_alloc.predict(_cache_then_bigger, session_factory=DoubleSession)
    path = p.write_trace(tmp_path / "t.pickle")
    snap = load_snapshot(path)
    html = _memory_viz.trace_plot(snap)
    assert "<html" in html.lower() and len(html) > 1000
    assert "segments: " in _memory_viz.segsum(snap)
    text = format_text(replay_trace(str(path), ["torch"]))
    assert "230.00 MiB" in text                                       # replayed: the same peak reserved
    out = amem_alloc.write_report(path, tmp_path / "r.html")
    assert "<html" in out.read_text()[:200].lower()
    page = amem_alloc.write_prediction_report(p, tmp_path / "p.html").read_text()
    assert "Prediction (no GPU)" in page and "parameter" in page


def test_context_manager_form_and_errors_pass_through():
    assert not amem_alloc.predict.is_predicting()
    with amem_alloc.predicting(gpu="L4", policies=["torch"], session_factory=DoubleSession) as run:
        assert amem_alloc.predict.is_predicting()
        DoubleSession.last.alloc(4 * MiB, "activation")
        run.marker("step")
    assert run.result.row("torch").peak_allocated == 4 * MiB and run.result.markers == [(1, "step")]
    assert run.result.gpu.key == "L4" and not amem_alloc.predict.is_predicting()
    with pytest.raises(ValueError, match="choose one of"):
        amem_alloc.predict(_cache_then_bigger, gpu="H1000", session_factory=DoubleSession)
    with pytest.raises(ValueError, match="not both"):
        amem_alloc.predicting("H100", capacity_gb=10, session_factory=DoubleSession)
    with pytest.raises(ValueError, match="unknown policy"):
        amem_alloc.predicting(policies="torch,nope", session_factory=DoubleSession)
    with pytest.raises(TypeError, match="callable"):
        amem_alloc.predict(42, session_factory=DoubleSession)


def test_gpu_table():
    assert gpus.get("h100_80gb") is gpus.get("H100") is gpus.GPUS["H100-80GB"]
    for g in gpus.GPUS.values():
        assert 8 << 30 < g.total_memory < 200 << 30 and 0 < g.context < 1 << 30 and g.usable < g.total_memory
        assert g.memory_source and g.context_source.startswith(("measured", "estimated"))
    assert gpus.custom(12).usable == 12 << 30
    for bad in (0, -1, "12", True, float("nan")):
        with pytest.raises(ValueError):
            gpus.custom(bad)
