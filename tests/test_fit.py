"""`amem fit` and amem_alloc.fit(...): the largest value of an argument that fits a card, per
policy, by bisection over predictions.

* consistency: under each policy the answer fits and the next value does not, each checked by a
  prediction of its own (not the search's cached trial);
* the argument is set the ways scripts read it (--NAME V, --NAME=V, added when absent);
* the CLI prints a progress line per trial and writes the issue's JSON;
* no answer to find (memory that does not grow with the argument, a run that fails or does not fit
  at the smallest value): one line, exit status 2, no traceback.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import amem_alloc  # noqa: E402
from amem_alloc.predict import fit as fit_mod  # noqa: E402

PROGRAMS = Path(__file__).resolve().parent / "whatif_programs"
sys.path.insert(0, str(PROGRAMS))
import mlp_stack  # noqa: E402

CARD_GB = 0.75


def step(units: int) -> None:
    """Forward and backward of a small stack on a batch of 256 * units rows."""
    model = mlp_stack.Stack(256, 4).cuda()
    model(torch.randn(256 * units, 256, device="cuda")).backward()


@pytest.mark.parametrize("argv, expected", [
    (["t.py", "--batch", "4", "--x", "1"], ["t.py", "--batch", "9", "--x", "1"]),
    (["t.py", "--batch=4"], ["t.py", "--batch=9"]),
    (["t.py", "config.py", "--lr=1"], ["t.py", "config.py", "--lr=1", "--batch=9"]),
    (["t.py", "--batch_size=4", "--batch=2"], ["t.py", "--batch_size=4", "--batch=9"]),
])
def test_the_argument_is_set_as_scripts_read_it(argv, expected):
    assert fit_mod.with_value(argv, "batch", 9) == expected


def test_the_answer_fits_and_the_next_value_does_not_under_each_policy():
    lines = []
    result = amem_alloc.fit(step, "units", capacity_gb=CARD_GB, progress=lines.append)
    assert len(lines) == len(result.trials) >= 3
    assert len(result.policies) == len(amem_alloc.predict.resolve_policies())
    for p in result.policies:
        assert p.largest is not None and p.first_failing == p.largest + 1, p
        at = amem_alloc.predict(step, p.largest, capacity_gb=CARD_GB, policies=p.policy).row(p.policy)
        nxt = amem_alloc.predict(step, p.largest + 1, capacity_gb=CARD_GB, policies=p.policy).row(p.policy)
        assert at.fits and not nxt.fits, (p, at, nxt)
        assert p.peak_reserved == at.peak_reserved and p.needed_at_first_failing == nxt.min_capacity
        assert p.needed == at.min_capacity <= CARD_GB * 2**30 < p.needed_at_first_failing
        assert nxt.min_capacity > CARD_GB * 2**30


def test_the_cli_prints_each_trial_and_writes_the_json(tmp_path):
    out = tmp_path / "fit.json"
    proc = subprocess.run([sys.executable, "-m", "amem_alloc", "fit", "--capacity-gb", "1", "--arg", "batch",
                           "--lo", "1024", "--policy", "torch,amem", "--steps", "1", "--json", str(out), "--",
                           "python", str(PROGRAMS / "mlp_stack.py"), "--depth", "4", "--batch", "64"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["arg"] == "batch" and data["gpu"]["usable_bytes"] == 2**30
    assert data["margin_bytes"] == int(0.05 * 2**30)  # amem fit's default margin: 5% of usable memory
    assert [p["policy"] for p in data["policies"]] == ["torch", "amem"]
    for p in data["policies"]:
        assert set(p) >= {"policy", "largest", "peak_reserved", "headroom", "first_failing", "needed_at_first_failing"}
        assert p["first_failing"] == p["largest"] + 1
        assert p["needed"] + data["margin_bytes"] <= 2**30 < p["needed_at_first_failing"] + data["margin_bytes"]
    trials = [ln for ln in proc.stdout.splitlines() if ln.startswith("  trial ")]
    assert len(trials) == len(data["trials"])
    assert f"torch: --batch {data['policies'][0]['largest']} " in proc.stdout


def _one_line(args, script_body, tmp_path):
    script = tmp_path / "s.py"
    script.write_text(script_body)
    proc = subprocess.run([sys.executable, "-m", "amem_alloc", "fit", *args, "--", "python", str(script)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    ours = [ln for ln in proc.stderr.splitlines() if ln.startswith("amem")]   # the script's own output stays
    assert "Traceback" not in proc.stderr and len(ours) == 1, proc.stderr
    return ours[0]


FLAT = """import argparse, torch
ap = argparse.ArgumentParser(); ap.add_argument("--batch", type=int, default=1); a = ap.parse_args()
x = torch.zeros(1024, 1024, device="cuda")
"""
GROWS = """import argparse, torch
ap = argparse.ArgumentParser(); ap.add_argument("--batch", type=int, default=1); a = ap.parse_args()
x = torch.zeros(a.batch, 1024, 1024, device="cuda")
"""
FAILS = """import argparse
ap = argparse.ArgumentParser(); ap.add_argument("--batch", type=int, default=1); a = ap.parse_args()
raise SystemExit("needs a dataset")
"""


@pytest.mark.parametrize("script, args, needle", [
    (FLAT, ["--capacity-gb", "1"], "does not grow with --batch"),
    (GROWS, ["--capacity-gb", "1", "--lo", "2048"], "does not fit even at the smallest value, --batch 2048"),
    (FAILS, ["--capacity-gb", "1"], "fails at the smallest value, --batch 1"),
    (GROWS, ["--capacity-gb", "1", "--lo", "0"], "--lo must be >= 1"),
])
def test_no_answer_to_find_is_one_line(script, args, needle, tmp_path):
    assert needle in _one_line(["--arg", "batch", "--policy", "torch", *args], script, tmp_path)


def test_an_option_the_script_does_not_take_is_said_to_be_the_likely_cause(tmp_path):
    """`--arg batch_size` on a script whose option is `--batch` (timm's `-b`/`--batch-size`): argparse
    refuses it with status 2, which read as if the run failed for its memory."""
    line = _one_line(["--arg", "batch_size", "--policy", "torch", "--capacity-gb", "1"], GROWS, tmp_path)
    assert "fails at the smallest value, --batch_size 1" in line and "is --batch_size the script's own?" in line
    assert "is --batch the script's own?" not in _one_line(["--arg", "batch", "--policy", "torch", "--capacity-gb",
                                                             "1"], FAILS, tmp_path)


def test_a_script_that_grows_gets_its_largest_value(tmp_path):
    """4 MiB per unit (float32 1024 x 1024), one tensor, on a 1 GiB device: 256 units fill it
    exactly; 257 need 1 GiB + 4 MiB."""
    script = tmp_path / "s.py"
    script.write_text(GROWS)
    path, argv = list(sys.path), sys.argv
    result = amem_alloc.fit([str(script)], "batch", capacity_gb=1, policies="torch")
    assert (sys.path, sys.argv) == (path, argv)   # the caller's again after each trial
    p = result.policies[0]
    assert (p.largest, p.first_failing, p.peak_reserved) == (256, 257, 2**30)
    assert p.needed_at_first_failing == 2**30 + 4 * 2**20
