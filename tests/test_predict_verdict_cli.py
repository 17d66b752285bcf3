"""The answer last (issue 37): `amem predict`'s text ends with the verdict per policy and, when one
does not fit, the next step; one "needs" figure everywhere (table, verdict, JSON, amem fit);
borderline verdicts (within the context estimate) say so; --check exits 5 when a policy does not
fit; amem fit keeps a margin, stated, 5% by default.

The script allocates `--gib` GiB in one tensor, so what it needs is known by hand: its request
rounded to torch's 2 MiB large-segment step (replay/evaluation.py searches the min capacity in 2 MiB
steps too) plus cuBLAS's workspace, which this script never asks for (no matmul)."""
from __future__ import annotations

import json
import sys

import pytest

from helpers import run_command

pytest.importorskip("torch")
GiB, MiB = 1 << 30, 1 << 20

ONE_TENSOR = """import argparse, torch
ap = argparse.ArgumentParser(); ap.add_argument("--mib", type=int); a = ap.parse_args()
x = torch.empty(a.mib * 2**20, dtype=torch.uint8, device="cuda")
"""


def _predict(tmp_path, mib, *options):
    script = tmp_path / "one.py"
    script.write_text(ONE_TENSOR)
    out = tmp_path / "p.json"
    proc = run_command([sys.executable, "-m", "amem_alloc", "predict", "--policy", "torch", "--json", str(out),
                        *options, "--", "python", str(script), "--mib", str(mib)], timeout=300)
    return proc, (json.loads(out.read_text()) if out.exists() else None)


def test_it_ends_with_the_verdict_and_one_needs_figure(tmp_path):
    proc, data = _predict(tmp_path, 900, "--capacity-gb", "1")
    assert proc.returncode == 0, proc.stderr
    row, verdict = data["policies"][0], data["verdict"]["policies"][0]
    assert row["min_capacity"] == verdict["needs"] == 900 * MiB                 # by hand: one 900 MiB block
    assert verdict["spare"] == row["spare"] == GiB - 900 * MiB and verdict["borderline"] is False
    lines = proc.stdout.rstrip().splitlines()
    assert lines[-1].startswith("  torch ") and lines[-1].endswith("fits: needs 900.00 MiB, 124.00 MiB to spare")
    assert lines[-3].startswith("Verdict for a 1 GiB device (usable 1.00 GiB")
    table = next(ln for ln in lines if ln.startswith("torch "))
    assert "900.00 MiB" in table and "124.00 MiB" in table                      # the table's needs and spare
    assert lines.index(f"wrote {tmp_path / 'p.json'}") < len(lines) - 3         # the files, just before the answer


def test_a_run_that_does_not_fit_names_the_next_step_and_check_fails(tmp_path):
    proc, data = _predict(tmp_path, 1100, "--capacity-gb", "1", "--check")
    assert proc.returncode == 5, proc.stderr
    step = data["verdict"]["next_step"]
    assert step["kind"] == "explore" and step["failing"] == ["torch"] and step["script"][-2:] == ["--mib", "1100"]
    lines = proc.stdout.rstrip().splitlines()
    assert lines[-2].endswith("does not fit: needs 1.07 GiB, 76.00 MiB more than usable")
    assert lines[-1].startswith("Next step: see which change makes it fit: amem predict --capacity-gb 1 --what-if all "
                                f"-- python {tmp_path / 'one.py'} --mib 1100; or the largest batch that fits: amem fit")
    proc, _ = _predict(tmp_path, 1100, "--capacity-gb", "1")  # without --check: a prediction is a success
    assert proc.returncode == 0


def test_another_policy_that_fits_is_the_next_step(tmp_path):
    """When one policy does not fit and another does, the next step is the one that fits, said as the
    setting that selects it, and how to make the other fit (the script's batch argument named)."""
    from amem_alloc.predict.analysis.verdict import next_step

    class P:
        target = "script train.py --batch_size=8"
        what_if_json = {}
        rows = [type("R", (), {"policy": "torch", "conf": ""})(),
                type("R", (), {"policy": "torch-expandable", "conf": "expandable_segments:True"})()]

    rows = [{"policy": "torch", "fits": False, "spare": -MiB}, {"policy": "torch-expandable", "fits": True, "spare": MiB}]
    step = next_step(P(), rows)
    assert step["kind"] == "policy" and step["policy"] == "torch-expandable" and step["native"]
    assert step["batch_arg"] == "batch_size" and step["script"] == ["train.py", "--batch_size=8"]
    from amem_alloc.report.prediction_text import next_step_lines

    d = {"verdict": {"next_step": step}, "gpu": {"key": "H100-80GB", "memory_source": "torch printout",
                                                  "usable_bytes": 80 * GiB}}
    (line,) = next_step_lines(d)
    assert line.startswith("Next step: torch-expandable fits (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True); "
                           "to make torch fit, see which change makes it fit: amem predict --gpu H100-80GB --what-if all")
    assert "amem fit --gpu H100-80GB --arg batch_size -- python train.py --batch_size=8" in line
    assert next_step(P(), [dict(r, fits=True) for r in rows]) is None


def test_the_batch_argument_is_the_long_option_the_script_declares_beside_its_short_one(tmp_path):
    """timm's and torchvision's train.py take `-b 256`: the next step said `amem fit --arg batch_size`,
    whose `--batch_size=1` argparse refused ("the run fails at the smallest value"). The long option
    the script declares with the short one used is named; an evaluation's batch option is not."""
    from amem_alloc.predict.analysis.verdict import batch_argument

    script = tmp_path / "train.py"
    script.write_text("import argparse\nparser = argparse.ArgumentParser()\n"
                      "parser.add_argument('-b', '--batch-size', type=int, default=128)\n"
                      "parser.add_argument(\n    '-vb', \"--validation-batch-size\", type=int)\n")
    assert batch_argument(f"script {script} -b 256 --epochs 1") == "batch-size"
    assert batch_argument(f"script {script} -vb 64") == "validation-batch-size"
    assert batch_argument(f"script {script} --epochs 1") == "batch-size"   # the one not an evaluation's
    assert batch_argument(f"script {script} --batch-size=8") == "batch-size"
    script.write_text("import argparse\n")
    assert batch_argument(f"script {script} -b 256") is None


def test_within_the_context_estimate_is_borderline():
    """The band is the model's uncertainty for what the card's process holds outside the allocator
    (predict/context.py): an A100 is another architecture than the measured H200, so a share of the
    figure; nothing where the user gave the usable memory (--capacity-gb)."""
    from amem_alloc.predict import context, gpus
    from amem_alloc.predict.analysis.verdict import says

    card = gpus.get("A100-80GB")
    assert card.context_uncertainty == context.typical(card).uncertainty > context.MEASURED_SPREAD
    assert gpus.get("H200").context_uncertainty == context.MEASURED_SPREAD and gpus.custom(2).context_uncertainty == 0
    row = type("R", (), {"fits": True, "min_capacity": card.usable - 9 * MiB, "headroom": 9 * MiB,
                         "peak_reserved": card.usable - 9 * MiB})()
    assert says(row, card.usable, card.context_uncertainty).endswith(
        f"9.00 MiB to spare (borderline: within the ±{card.context_uncertainty / MiB:.2f} MiB uncertainty)")
    row.min_capacity = row.peak_reserved = card.usable - card.context_uncertainty - MiB
    assert "borderline" not in says(row, card.usable, card.context_uncertainty)


def test_fit_keeps_a_margin_and_says_so(tmp_path):
    """1 GiB usable, 1 MiB per --mib: with no margin 1024 fits; with 10% (102.4 MiB) the largest that
    leaves it free is 920 (920 MiB + 102.4 <= 1024 < 922 + 102.4, in the 2 MiB steps of the search)."""
    script = tmp_path / "one.py"
    script.write_text(ONE_TENSOR)

    def fit(*margin):
        proc = run_command([sys.executable, "-m", "amem_alloc", "fit", "--capacity-gb", "1", "--arg", "mib", "--lo",
                            "512", "--policy", "torch", "--json", str(tmp_path / "f.json"), *margin, "--", "python",
                            str(script)], timeout=600)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.rstrip().splitlines(), json.loads((tmp_path / "f.json").read_text())

    lines, data = fit("--margin", "10%")
    p = data["policies"][0]
    assert data["margin_bytes"] == int(GiB * 0.10) and p["largest"] == 920
    assert p["needed"] + data["margin_bytes"] <= GiB < p["needed_at_first_failing"] + data["margin_bytes"]
    assert "keeping a margin of 10% of usable memory, 102.40 MiB free (--margin)" in lines[-2]
    assert lines[-1].startswith(f"  torch: --mib {p['largest']} (needs ") and "does not fit with the margin" in lines[-1]
    lines, data = fit("--margin", "0")
    assert data["policies"][0]["largest"] == 1024 and "with no margin (--margin 0)" in lines[-2]
    lines, data = fit()
    assert data["margin"].startswith("5% of usable memory")                      # the default, stated


def test_a_bad_margin_is_one_line(tmp_path):
    script = tmp_path / "one.py"
    script.write_text(ONE_TENSOR)
    proc = run_command([sys.executable, "-m", "amem_alloc", "fit", "--capacity-gb", "1", "--arg", "mib", "--margin",
                        "lots", "--", "python", str(script)], timeout=300)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "amem fit: --margin 'lots': give a share of usable memory (5%) or GiB (1.5), at least 0"]


def test_the_cheapest_what_if_is_the_next_step_with_its_cost_in_text_and_page():
    """Where --what-if ran and a change makes the run fit, the next step is that change, with its run-time
    cost said as the what-if table says it; the report's what-if table carries the cost too."""
    from amem_alloc.predict.analysis.verdict import next_step
    from amem_alloc.report.prediction_text import next_step_lines
    from amem_alloc.report.html import esc
    from amem_alloc.report.verdict import html_panel
    from amem_alloc.report.what_if_cost import cost_text

    recompute = {"flops": 3e12, "forward_flops": 6e12, "share_of_step": 0.25, "stack": "model.h", "blocks": 12,
                 "blocks_per_segment": 1}
    row = {"policy": "torch", "peak_allocated": GiB, "peak_reserved": GiB, "min_capacity": GiB, "fits": True,
           "headroom": 0, "saving_allocated": MiB, "saving_reserved": MiB}
    what_if = {"what_if": [{"change": "checkpoint=blocks", "policies": [row], "notes": [], "failed": None,
                            "applied": True, "at_peak": {}, "recompute": recompute}],
               "cheapest_change": {"torch": "checkpoint=blocks"}}

    class P:
        target = "script train.py --batch_size=8"
        what_if_json = what_if
        rows = [type("R", (), {"policy": "torch", "conf": ""})()]

    step = next_step(P(), [{"policy": "torch", "fits": False, "spare": -MiB}])
    assert step["kind"] == "what_if" and step["change"] == "checkpoint=blocks" and step["policy"] == "torch"
    cost = cost_text(what_if["what_if"][0])
    assert cost == ("recomputes up to 3.0 TFLOP over the predicted run (12 blocks of model.h), about +25% of the "
                    "step's compute (backward taken as 2x forward)")
    d = {"verdict": {"next_step": step}, "gpu": {"key": "H100-80GB", "memory_source": "torch printout",
                                                  "usable_bytes": 80 * GiB}, **what_if}
    (line,) = next_step_lines(d)
    assert line.startswith(f"Next step: the cheapest change that makes it fit under torch is checkpoint=blocks ({cost}); ")
    assert "amem fit --gpu H100-80GB --arg batch_size -- python train.py --batch_size=8" in line
    assert "--what-if all" not in line                       # the what-ifs ran: no need to ask for them again
    v = {"card": "H100", "usable_bytes": 80 * GiB, "policies": []}
    panel = html_panel(v, what_if)
    shown = esc(cost)
    assert "<th>cost at run time</th>" in panel and f'<td class="cost">{shown}</td>' in panel
    assert f"<li>torch: checkpoint=blocks ({shown})</li>" in panel


def test_a_run_far_over_the_card_keeps_its_bar_on_one_line():
    """The text bar is 50 characters for the usable memory or for the largest peak, whichever is more
    (a run 100x over the card drew a 5,000-character bar), with '|' where usable memory ends."""
    from amem_alloc.report.verdict import text_lines

    def row(policy, parameters):
        return {"policy": policy, "parts": {"parameters": parameters, "cached but free": 0}, "says": "x"}

    v = {"card": "a card", "usable_bytes": MiB, "policies": [row("torch", 100 * MiB), row("amem", 50 * MiB)]}
    torch_line, amem_line = text_lines(v)[-2:]
    torch_bar, amem_bar = (ln[ln.index("[") + 1:ln.index("]")] for ln in (torch_line, amem_line))
    assert torch_bar == "|" + "P" * 50 and amem_bar == "|" + "P" * 25     # one scale: usable rounds to 0 of 50
    v["policies"] = [row("torch", MiB // 2)]
    (bar,) = (ln[ln.index("[") + 1:ln.index("]")] for ln in text_lines(v)[-1:])
    assert bar == "P" * 25 + " " * 25 + "|"                                  # fits: usable is the full width
