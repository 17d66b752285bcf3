"""The tracer's outputs: the readable report, JSON (json.dumps must take all of it), the offline
HTML, and the overhead benchmark's quick mode (run here so it cannot rot; its speed is not judged)."""
import json
import re
import sys

import pytest
import torch

from amem_alloc import Tracer, provenance_html
from amem_alloc.report import provenance as html

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
from helpers import run_command  # noqa: E402


@pytest.fixture(scope="module")
def traced():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with Tracer(model) as t:
        model(torch.randn(8, 16)).sum().backward()
        opt.step()
    return t


def test_report_returns_the_text_and_a_repl_shows_it_once(traced, capsys):
    text = traced.report()
    assert capsys.readouterr().out == ""  # returned, not printed as well
    sys.displayhook(text)  # what the interactive prompt does with `t.report()`
    shown = capsys.readouterr().out
    assert shown.count("allocations inside the tracer") == 1 and shown.strip() == text.strip()
    assert "\\n" not in shown  # the text itself, not a quoted string with escaped newlines
    traced.report(file=sys.stdout)  # a file is still written to
    assert capsys.readouterr().out.strip() == text.strip()
    assert "allocations inside the tracer" in text and "Activation memory, step 1 of 1 [freed]" in text
    assert "ReluBackward0.result" in text and "AddmmBackward0.mat1" in text
    assert "shared with ReluBackward0.result" in text and "model state, not activation memory" in text
    assert "512-byte rounding" in text
    # total: the input (8x16 floats) and the ReLU output (8x32 floats)
    assert re.search(r"total: 1\.50 KiB nominal, 1\.50 KiB allocator, in 2 storages", text)


def test_everything_is_json(traced, tmp_path):
    data = json.loads(json.dumps(traced.to_dict()))
    assert data["format"] == "amem_alloc.provenance/1"
    assert data["headline"]["activation_nominal_bytes"] == [8 * 16 * 4 + 8 * 32 * 4]
    assert data["largest_saved"][0].startswith("ReluBackward0.result in 1: 1.00 KiB float32 8x32")
    act = data["activations"][0]
    assert set(act) >= {"step", "steps", "status", "message", "accounting", "total", "by_kind", "modules",
                        "nodes", "saved", "model_state_saved", "held_by_other_hooks"}
    row = act["saved"][0]
    assert set(row) >= {"node", "slot", "label", "module", "dtype", "shape", "kind", "what", "nominal_bytes",
                        "allocator_bytes", "counted", "note", "state"}
    alloc = data["allocations"][0]
    assert set(alloc) >= {"seq", "op", "module", "phase", "category", "nominal_bytes", "allocator_bytes"}
    path = tmp_path / "t.json"
    traced.to_json(path, indent=1)
    assert json.loads(path.read_text())["activations"] == data["activations"]
    assert json.loads(json.dumps(traced.activations().to_dict())) == act


def test_html_is_offline_and_shows_the_tables(traced, tmp_path):
    page = provenance_html(traced, tmp_path / "p.html")
    assert (tmp_path / "p.html").read_text() == page
    assert "<script" not in page and "http:" not in page and "https:" not in page
    assert "ReluBackward0.result" in page and '<table class="prov">' in page
    # styled like the report of allocator traces: its stylesheet, header, cards and footer
    from amem_alloc.report.html import HERE
    assert (HERE / "report.css").read_text() in page
    assert '<header>\n<h1>amem provenance: Sequential</h1>' in page and '<div class="cards">' in page
    assert "Written by amem_alloc" in page and "default-src 'none'" in page
    fragment = html.section(traced.to_dict())
    assert fragment.startswith('<section class="amem-prov">')
    assert html.section(traced.activations().to_dict()).count("<h3>") == 1


def test_html_escapes_what_it_shows():
    class Odd(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.add_module("<b>", torch.nn.Linear(2, 2))

        def forward(self, x):
            return getattr(self, "<b>")(x)

    model = Odd()
    with Tracer(model) as t:
        y = model(torch.randn(1, 2, requires_grad=True))
    assert "<b>" not in html.section(t.to_dict()) and "&lt;b&gt;" in html.section(t.to_dict())
    del y


def test_the_benchmark_runs_in_quick_mode():
    proc = run_command([sys.executable, "benchmarks/bench_tracer.py", "--quick", "--device", "cpu"], timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"^cpu\s+[\d.]+\s+[\d.]+\s+[\d.]+x$", proc.stdout, re.M), proc.stdout


def test_the_json_feeds_the_offline_html_report_of_traces(traced, tmp_path):
    import amem_alloc

    if not hasattr(amem_alloc, "write_report"):
        pytest.skip("the traces report is not in this tree")
    out = amem_alloc.write_report({"segments": [], "device_traces": [[]]}, tmp_path / "r.html",
                                  provenance=traced.to_dict(allocations=False))
    page = out.read_text()
    assert "Provenance" in page and "ReluBackward0.result in 1" in page and "1.50 KiB allocator" in page


def test_the_traces_report_shows_provenance_tables_for_tracer_json():
    import json

    import torch

    import amem_alloc
    from amem_alloc.report import render_report

    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    with amem_alloc.Tracer(model) as t:
        model(torch.randn(4, 32)).sum().backward()
    data = json.loads(t.to_json())
    alloc = amem_alloc.Allocator("sim")
    alloc.record()
    alloc.malloc(1000)
    html = render_report(alloc.snapshot(), provenance=data)
    assert 'class="amem-prov"' in html and "AddmmBackward0" in html     # the tracer's own tables
    plain = render_report(alloc.snapshot(), provenance={"note": "anything else"})
    assert 'class="amem-prov"' not in plain and "anything else" in plain


def test_a_layout_clone_under_autocast_is_not_an_autocast_copy():
    """matmul reshapes a non-contiguous 3-d input with a clone, and .contiguous() clones: under
    autocast these keep their dtype, so they are not autocast's copies."""

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 8)
            self.w = torch.nn.Parameter(torch.randn(8, 8))

        def forward(self, x):
            h = self.fc(x)  # bfloat16 under autocast
            c = h.transpose(0, 1).contiguous()
            m = torch.matmul(h.transpose(1, 2), self.w)
            return (c * c).sum() + m.sum()

    model = M()
    with Tracer(model) as t, torch.autocast("cpu", dtype=torch.bfloat16):
        model(torch.randn(4, 8, 8)).backward()
    saved = {r["label"]: r for r in t.activations().saved}
    for label in ("MmBackward0.self", "MulBackward0.self"):
        assert saved[label]["dtype"] == "bfloat16"
        assert "autocast" not in saved[label]["what"], saved[label]["what"]
        assert saved[label]["what"].endswith("(a layout copy: reshape or .contiguous())")
    # autocast's real copies still say so
    assert saved["MmBackward0.mat2"]["what"] == "autocast copy of parameter w (float32 -> bfloat16)"
