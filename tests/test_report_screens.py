"""Every page amem writes, as a user first sees it (issue 37 item 7): each page shown in headless
chromium in a 1280x900 window (report_browser.SCREEN), its answer measured to lie on that first
screen, nothing wider than the window, and a screenshot of that screen taken and checked (its size,
and that it is drawn, not blank).

Pages and their answers: the predicted run (`amem predict --report`: per policy fits or not, the
"needs" figure), a trace with an out-of-memory error (`amem report`: the error first, linked to its
forensics, then each device's peaks), the ranks side by side (`amem report A B`), compare.html
(`amem compare`: the configurations' table) and a Tracer's page (`provenance_html`: its headline
cards). Then the pages act (issue 37 item 4): the trace page's time plots zoom together (wheel, drag,
double-click out) and a segment-map block shows its stack on hover; the predicted page's eval
loops are one bar "×N" (report_browser.act: synthetic events in the framed page, no clock). Five
chromium launches in all; skipped where /usr/bin/chromium is absent (`make chromium`).
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import amem_alloc  # noqa: E402
from amem_alloc.snapshot import parse_snapshot  # noqa: E402
from report_browser import CHROMIUM, SCREEN, act, layout, png_size, screenshot  # noqa: E402

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


# ---------------------------------------------------------------------------- zoom, hover, folded repeats
ZOOM_AND_HOVER = """
var out = {}, host = doc.getElementById("timeline-0");
function at(el, fx) { var r = el.getBoundingClientRect(); return [r.left + r.width * fx, r.top + r.height / 2]; }
function mouse(el, type, p) { el.dispatchEvent(new w.MouseEvent(type, { clientX: p[0], clientY: p[1], bubbles: true,
                                                                    cancelable: true })); }
function zooms() { return ["timeline-0", "stacked-0", "fragmentation-0"].map(function (id) {
  var e = doc.getElementById(id); return e ? e.getAttribute("data-zoom") : null; }); }
out.start = zooms();
var svg = host.querySelector("svg");
svg.dispatchEvent(new w.WheelEvent("wheel", { deltaY: -100, clientX: at(svg, 0.5)[0], clientY: at(svg, 0.5)[1],
                                              bubbles: true, cancelable: true }));
out.wheel = zooms();
svg = host.querySelector("svg");
mouse(svg, "mousedown", at(svg, 0.3)); mouse(svg, "mousemove", at(svg, 0.6));
out.band = svg.querySelectorAll("rect.zoom-band").length;
mouse(svg, "mouseup", at(svg, 0.6));
out.drag = zooms();
out.zoomed = host.getAttribute("data-zoomed");
out.svgs = host.querySelectorAll(":scope > svg").length;
svg = host.querySelector("svg");
svg.dispatchEvent(new w.MouseEvent("dblclick", { bubbles: true }));
out.reset = zooms();
out.plotsDrawn = doc.body.getAttribute("data-plots-drawn");
out.error = doc.body.getAttribute("data-error");
if (arg.block >= 0) {
  var block = doc.querySelectorAll("#segmap-0 rect.block")[arg.block], tip = doc.querySelector("#segmap-0 .block-tip");
  out.tipBefore = tip.hidden;
  mouse(block, "mouseover", at(block, 0.5));
  out.tip = tip.textContent; out.tipHidden = tip.hidden; out.frames = tip.querySelectorAll("code").length;
  out.hovered = doc.getElementById("segmap-0").getAttribute("data-hovered");
  mouse(block, "mouseout", at(block, 0.5));
  out.tipAfter = tip.hidden;
}
var folded = doc.querySelectorAll("#timeline-0 rect.phase.folded");
out.folded = Array.prototype.map.call(folded, function (r) { return r.getAttribute("data-times"); });
out.foldedText = Array.prototype.map.call(doc.querySelectorAll("#timeline-0 text.phase-times"),
                                          function (t) { return t.textContent; });
return out;
"""


def _range(attr: str) -> tuple[float, float]:
    lo, hi = map(float, attr.split())
    return lo, hi


def test_the_trace_page_zooms_and_shows_a_blocks_stack_on_hover(tmp_path):
    """In headless chromium: the wheel and a drag zoom the device's time plots together (each redrawn
    over the narrower range), a double-click zooms out; hovering a block of the segment map shows its
    size, address and stack frames. And the predicted page's eval loops are one bar each, ×N."""
    from amem_alloc.report import render_report
    from amem_alloc.report.data import report_data
    from test_report_predicted import EVALS
    from test_snapshot import host_run

    snap = parse_snapshot(host_run(record_stacks="python")[0].snapshot())
    (tmp_path / "trace.html").write_text(render_report(snap, source="trace.pickle"))
    seg = report_data(snap, replay_ooms=False)["devices"][0]["segmap"]
    blocks = [b for row in seg["rows"] for b in row["blocks"]]
    k = next(i for i, b in enumerate(blocks) if b[5] >= 0)
    frames = seg["stacks"][blocks[k][5]]
    predicted, _ = _predicted_page(tmp_path)
    trace, pred = act([tmp_path / "trace.html", predicted], ZOOM_AND_HOVER, [{"block": k}, {"block": -1}], tmp_path)
    for page in (trace, pred):
        assert page["error"] is None, page
        full = _range(page["start"][0])
        assert len(set(page["start"])) == 1                 # one range for the device's time plots
        lo, hi = _range(page["wheel"][0])
        assert full[0] <= lo and hi <= full[1] and hi - lo < 0.7 * (full[1] - full[0]), page["wheel"]
        assert len(set(page["wheel"])) == 1                 # they zoom together
        assert page["band"] == 1                             # the dragged range is shown while dragging
        dlo, dhi = _range(page["drag"][0])
        assert lo < dlo < dhi < hi and dhi - dlo < 0.5 * (hi - lo), page["drag"]
        assert page["zoomed"] == "true" and page["svgs"] == 1  # redrawn, not drawn twice
        assert page["reset"] == page["start"]
    assert trace["tipBefore"] and not trace["tipHidden"] and trace["tipAfter"]
    assert blocks[k][4] in trace["tip"] and trace["hovered"] == blocks[k][4]
    assert trace["frames"] == len(frames) and all(f in trace["tip"] for f in frames)
    assert pred["folded"] == [str(EVALS)] * 2 and pred["foldedText"] == [f"eval ×{EVALS}"] * 2
