"""The verdict at a glance (predict/analysis/verdict.py's data and text, report/verdict.py's panel), in `amem predict`'s text, JSON and report.

* the bar's parts are what is live at the peak of allocated memory, grouped, and add up to it
  exactly; parameters and autocast's copies against first principles;
* "fits: needs X, Y to spare" / "does not fit: needs X, Y more than usable", per policy, last in the
  text, then the next step; borderline within the context estimate; --check (tests/test_predict_verdict_cli.py);
* the report opens with the verdict panel, its bars drawn (checked in headless chromium where
  /usr/bin/chromium works, and in the HTML itself everywhere); its time axis is labelled replay
  order; call sites are relative to the script's folder, libraries shortened to the package;
* "(outside any module)" is broken down into what it holds.
"""
from __future__ import annotations

import json
import os
import re

import pytest

torch = pytest.importorskip("torch")

import amem_alloc  # noqa: E402
from amem_alloc.code_files import display_path  # noqa: E402
from amem_alloc.introspection import format_bytes  # noqa: E402
from amem_alloc.predict.analysis.prediction import script_folder  # noqa: E402
from amem_alloc.predict.analysis import verdict as verdict_mod  # noqa: E402
from amem_alloc.report import predict as predict_page  # noqa: E402

WIDTH, DEPTH, BATCH = 512, 4, 2048


def _model():
    return torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(DEPTH)])


def step():
    """bf16 autocast forward, backward, AdamW step, then a second forward+backward (the peak)."""
    model = _model().cuda()
    opt = torch.optim.AdamW(model.parameters())
    for _ in range(2):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(torch.randn(BATCH, WIDTH, device="cuda")).float().sum()
        loss.backward()
        opt.step()
        opt.zero_grad()


@pytest.fixture(scope="module")
def prediction():
    return amem_alloc.predict(step, policies="torch,amem", capacity_gb=0.03)


def _round(n: int) -> int:
    return max(512, (n + 511) // 512 * 512)


def test_the_parts_add_up_to_the_peak_and_match_first_principles(prediction):
    v = verdict_mod.verdict(prediction)
    params = sum(_round(p.numel() * 4) for p in _model().parameters())
    for row in v["policies"]:
        parts = row["parts"]
        assert sum(n for k, n in parts.items() if k != "cached but free") == prediction.at_peak.allocated
        assert parts["cached but free"] == max(0, row["peak_reserved"] - prediction.at_peak.allocated)
        assert parts["parameters"] == params
    copies = verdict_mod.parts_at_peak(prediction)["autocast copies"]
    weights = sum(_round(p.numel() * 2) for p in _model().parameters() if p.dim() == 2)
    assert copies >= weights      # the bf16 weight copies autocast caches for the forward, at least


def test_fits_or_not_by_how_much(prediction):
    usable = prediction.gpu.usable
    for row in prediction.rows:
        said = verdict_mod.says(row, usable)
        if row.fits:
            assert said.startswith("fits")
        else:
            assert said == (f"does not fit: needs {format_bytes(row.min_capacity)}, "
                            f"{format_bytes(row.min_capacity - usable)} more than usable")
    assert not all(r.fits for r in prediction.rows), "the card is chosen small enough for one not to fit"
    text = amem_alloc.format_prediction(prediction)
    tail = text[text.index("\nVerdict for "):]      # the answer comes last, after every table
    assert "Verdict for a 0.03 GiB device (usable" in tail and "\npolicy " not in tail
    assert all(re.search(rf"  {r.policy} +\[[PGOACTW. |]+\] ", tail) for r in prediction.rows), tail


def test_the_json_carries_the_verdict(prediction, tmp_path):
    data = json.loads(prediction.write_json(tmp_path / "p.json").read_text())
    assert data["verdict"]["usable_bytes"] == prediction.gpu.usable
    assert [r["policy"] for r in data["verdict"]["policies"]] == ["torch", "amem"]


def test_outside_any_module_is_broken_down(prediction):
    modules = prediction.at_peak.modules
    assert "(outside any module)" not in modules
    assert any(k.startswith("(outside any module: ") for k in modules)


def test_paths_read_relative_to_the_script_and_libraries_by_package(tmp_path):
    base = str(tmp_path)
    assert display_path(os.path.join(base, "pkg", "model.py"), base) == os.path.join("pkg", "model.py")
    site = os.path.dirname(os.path.dirname(torch.__file__))
    assert display_path(os.path.join(site, "torch", "nn", "linear.py"), base) == "torch/nn/linear.py"
    assert display_path("/elsewhere/x.py", base) == "/elsewhere/x.py"
    assert script_folder("script sub/train.py --x 1") == os.path.abspath("sub")
    assert script_folder("rank 1 of 2: sub/train.py --x 1") == os.path.abspath("sub")
    assert script_folder("step") is None and script_folder("workload mlp (size 1)") is None


def _panel(page: str) -> str:
    start = page.index('<section id="verdict">')
    return page[start:page.index("</section>", start)]


def test_the_report_opens_with_the_verdict(prediction, tmp_path):
    page = amem_alloc.write_prediction_report(prediction, tmp_path / "r.html").read_text()
    body = page[page.index("<body"):]
    assert body.index('id="verdict"') < body.index("Prediction (no GPU)")
    panel = _panel(page)
    for row in prediction.rows:
        assert format_bytes(row.peak_reserved) in panel
    widths = [float(w) for w in re.findall(r'<rect class="part"[^>]*width="([0-9.]+)"', panel)]
    assert len(widths) >= 4 * len(prediction.rows) and all(w > 0 for w in widths)
    assert predict_page.REPLAY_ORDER in page and "no timestamps" not in page


@pytest.mark.skipif(not os.path.exists("/usr/bin/chromium"), reason="/usr/bin/chromium is absent")
def test_the_verdict_panel_in_headless_chromium(prediction, tmp_path):
    from report_browser import render_pages

    page = amem_alloc.write_prediction_report(prediction, tmp_path / "r.html")
    dom = render_pages([page], tmp_path)[0]
    panel = _panel(dom)
    rects = re.findall(r'<rect class="part"[^>]*>', panel)
    assert len(rects) >= 4 * len(prediction.rows)
    assert all(float(re.search(r'width="([0-9.]+)"', r).group(1)) > 0 for r in rects)
    for row in prediction.rows:
        assert format_bytes(row.peak_reserved) in panel and verdict_mod.says(row, prediction.gpu.usable) in panel
    assert len(re.findall(r'<line class="usable"', panel)) == len(prediction.rows)
