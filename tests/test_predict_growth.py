"""Memory that grows every step (amem_alloc/predict/analysis/growth.py): a prediction of a few
steps says so, with what keeps it and how many more steps each policy's spare lasts; a loop that
holds the same at each step's end, or holds a batch of a new size each step, says nothing."""
from __future__ import annotations

import json
import sys

from amem_alloc.report.verdict import growth_lines
from helpers import run_command

MiB = 1 << 20


LOOP = """\
import torch
model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
history = []
for step in range({steps}):
    batch = torch.randn({rows}, 1024, device="cuda")
    model(batch).square().mean().backward()
    opt.step()
    opt.zero_grad()
    if {keep}:   # the first layer's output, with the input its graph saved: 2 x 512 x 1024 x 4 B a step
        history.append(model[0](torch.ones(512, 1024, device="cuda")))
"""
KEPT_AT = "loop.py:11"


def _loop(tmp_path, keep: bool, rows: str = "512", steps: int = 5) -> dict:
    script, out = tmp_path / "loop.py", tmp_path / "p.json"
    script.write_text(LOOP.format(keep=keep, rows=rows, steps=steps))
    proc = run_command([sys.executable, "-m", "amem_alloc", "predict", "--gpu", "H100", "--policy", "torch",
                        "--json", out, "--", "python", script], timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    v = json.loads(out.read_text())["verdict"]
    assert v["growth"] is None or growth_lines(v)[0] in proc.stdout   # the text says what the JSON does
    return v


def test_a_loop_that_keeps_a_tensor_each_step_grows_by_it_and_says_what_keeps_it(tmp_path):
    v = _loop(tmp_path, keep=True)
    g = v["growth"]
    assert g["bytes_per_step"] == 4 * MiB and g["steps"] == [2, 5]
    assert [s["bytes_per_step"] for s in g["sites"]] == [4 * MiB]
    assert g["sites"][0]["where"] == KEPT_AT
    row = v["policies"][0]
    assert row["steps_left"] == row["spare"] // (4 * MiB)
    line = growth_lines(v)[0]
    assert "grows every step: +4.00 MiB a step, steps 2 to 5" in line and f"{row['steps_left']:,} more steps" in line


def test_a_loop_that_ends_each_step_with_the_same_memory_does_not_grow(tmp_path):
    v = _loop(tmp_path, keep=False)
    assert v["growth"] is None and v["policies"][0]["steps_left"] is None and growth_lines(v) == []


def test_a_larger_batch_each_step_held_only_by_its_step_is_no_growth(tmp_path):
    assert _loop(tmp_path, keep=False, rows="256 << step")["growth"] is None


def test_two_steps_are_too_few_to_tell(tmp_path):
    assert _loop(tmp_path, keep=True, steps=2)["growth"] is None
