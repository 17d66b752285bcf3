"""The predicted page leads with the answer and reads as the run did (issue 37 item 4):

* the answer (per policy: fits or not, the one "needs" figure; the next step when one does not fit)
  is the first thing under the title;
* the time axis is the program's allocator calls, numbered as `amem predict`'s text numbers them,
  so the page and the text name one peak ("after allocator call N");
* the axis marks the phases (setup, train, eval, optimizer: predict/analysis/phases.py) and the end
  of each optimizer step;
* the largest-allocations table folds repeats (an eval loop's equal batches are one row, "x N").

The page in a real browser, and its screenshots, are tests/test_report_screens.py's.
"""
from __future__ import annotations

import re

import pytest

torch = pytest.importorskip("torch")

import amem_alloc  # noqa: E402
from amem_alloc import replay  # noqa: E402
from amem_alloc.predict.analysis import phases  # noqa: E402
from amem_alloc.report import predict as predict_page  # noqa: E402
from amem_alloc.report.prediction_text import format_prediction  # noqa: E402

WIDTH, BATCH, EVALS = 256, 64, 6


def train_and_eval(p) -> None:
    """Two optimizer steps, each followed by an eval loop of EVALS equal batches under no_grad."""
    model = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, WIDTH)).cuda()
    opt = torch.optim.AdamW(model.parameters())
    for _ in range(2):
        model(torch.randn(BATCH, WIDTH, device="cuda")).sum().backward()
        opt.step()
        opt.zero_grad()
        p.marker("step")
        with torch.no_grad():
            for _ in range(EVALS):
                model(torch.randn(4 * BATCH, WIDTH, device="cuda")).sum()


@pytest.fixture(scope="module")
def predicted():
    with amem_alloc.predicting(capacity_gb=0.05, policies="torch,amem") as p:
        train_and_eval(p)
    return p.result


@pytest.fixture(scope="module")
def page(predicted, tmp_path_factory):
    return amem_alloc.write_prediction_report(predicted, tmp_path_factory.mktemp("page") / "p.html").read_text()


def test_phases_cover_every_call_in_order(predicted):
    spans = phases.spans(predicted.ops, predicted.infos)
    assert [p for _, _, p in spans] == ["setup", "train", "optimizer", "eval", "train", "optimizer", "eval"]
    assert spans[0][0] == 1 and spans[-1][1] == len(predicted.ops)
    assert all(b[0] == a[1] + 1 for a, b in zip(spans, spans[1:]))       # contiguous, no call left out
    steps = [n for n, name in predicted.markers if name == "step"]
    assert phases.steps(predicted.markers) == steps and len(steps) == 2
    for (_, end, phase), step in zip([s for s in spans if s[2] == "optimizer"], steps):
        assert phase == "optimizer" and end == step    # each step ends where its optimizer phase does
    data = predicted.to_dict()["program"]
    assert data["phases"] == spans and data["steps"] == steps


def test_every_event_of_the_trace_knows_the_call_that_made_it(predicted):
    snap = predicted.snapshot()
    events, ops = snap["device_traces"][0], snap["amem"]["devices"][0]["columns"]["op"]
    assert len(events) == len(ops) and ops == sorted(ops)
    key_at = {}
    for ev, i in zip(events, ops):
        kind, key, size, _ = predicted.ops[i]
        if ev["action"] == "alloc":
            assert kind == replay.ALLOC and size == ev["size"]
            key_at[ev["addr"]] = key
        elif ev["action"] in ("free_requested", "free_completed"):
            assert kind in (replay.ALLOC, replay.FREE) and key == key_at[ev["addr"]]


def test_the_answer_comes_first_and_the_page_names_the_texts_peak(predicted, page):
    body = page[page.index("<main>"):]
    answer = body[body.index('<ul class="answer">'):body.index("</ul>")]
    assert body.index('<ul class="answer">') < body.index("<table")
    for row in predicted.to_dict()["verdict"]["policies"]:
        assert row["says"].split(":")[0] in answer and row["says"].replace("'", "&#x27;") in answer
    assert not all(r.fits for r in predicted.rows), "the card is chosen small enough for one not to fit"
    assert 'class="next-step">Next step: ' in body      # what to do, with the answer
    call = predicted.at_peak.op + 1
    assert f"after allocator call {call} of {len(predicted.ops)}" in format_prediction(predicted)
    assert f"At the peak (after allocator call {call})" in page
    dev = predict_page.label_calls(_data(predicted), predicted.to_dict()["program"])["devices"][0]
    assert dev["time_unit"] == "call" and dev["peak"]["t"] == call
    assert dev["series"]["t"][0] >= 1 and dev["series"]["t"][-1] <= len(predicted.ops)   # absolute call numbers
    assert predict_page.REPLAY_ORDER in page and "no timestamps" not in page


def test_the_axis_data_carries_phases_and_steps(predicted, page):
    data = _page_json(page)["devices"][0]
    program = predicted.to_dict()["program"]
    assert [p[:3] for p in data["phases"]] == program["phases"] and data["steps"] == program["steps"]
    assert all(p[3] == predict_page.PHASE_COLOURS[p[2]] for p in data["phases"])
    assert 'class="legend phases-legend"' in page and "the end of each of the 2 optimizer steps" in page


def test_repeated_rows_of_the_largest_allocations_fold(predicted, page):
    top = _data(predicted)["devices"][0]["top"]
    keys = [(r["block"], r["size"], r["stream"], r["tag"], r["site"]) for r in top]
    assert len(keys) == len(set(keys))                    # no row twice
    evals = [r for r in top if r["size"] == 4 * BATCH * WIDTH * 4 and r["count"] > 1]
    assert evals and max(r["count"] for r in evals) >= EVALS     # an eval loop's batches: one row
    folded = re.findall(r'<span class="times">×(\d+)</span>', page)
    assert folded and "(repeats folded" in page and "(the first)" in page


def _data(predicted) -> dict:
    from amem_alloc.report.data import report_data
    from amem_alloc.snapshot import parse_snapshot

    snap = parse_snapshot(predict_page.readable_snapshot(predicted.snapshot()), "<prediction>")
    return report_data(snap, peak_time=predicted.at_peak.op + 1)


def _page_json(page: str) -> dict:
    import json

    raw = re.search(r'<script type="application/json" id="amem-data">(.*?)</script>', page, re.S).group(1)
    return json.loads(raw)
