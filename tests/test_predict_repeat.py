"""Steps that repeat are written out, not run (--write-repeats; amem_alloc/predict/repeat.py): the extended program
is the one the script would have recorded had it run every step — checked op for op against the
same script run to the same step count with the shortcut off."""
from __future__ import annotations

import textwrap

import pytest

pytest.importorskip("torch")

from amem_alloc.predict import api, repeat  # noqa: E402
from amem_alloc.predict import script as script_mod  # noqa: E402
from amem_alloc.replay import ALLOC  # noqa: E402

TRAIN = textwrap.dedent("""
    import torch
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256)).cuda()
    opt = torch.optim.AdamW(model.parameters())
    prev = None
    for step in range(20):
        x = torch.randn(64, 256, device="cuda")
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        prev = loss.detach()        # kept across a step: freed in the next one
""")


def _record(tmp_path, steps, monkeypatch=None, shortcut=True):
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    if not shortcut:
        monkeypatch.setattr(repeat, "last_steps_repeat", lambda ops, markers: False)
    run = api.predicting("H100", policies=["torch"])
    with run:
        done = script_mod.run([str(script)], run, steps, 600, write_repeats=True)
    return run, done


def _normalised(ops):
    """Ops with keys renumbered by first appearance (fresh keys differ, the sequence must not)."""
    names: dict[int, int] = {}
    return [(kind, names.setdefault(key, len(names)) if kind <= 1 else key, size, stream)
            for kind, key, size, stream in ops]


def test_repeating_steps_are_written_out_exactly_as_running_them_records(tmp_path, monkeypatch):
    short, done = _record(tmp_path, 8)
    # step boundaries fall at optimizer.step: the loss kept in `prev` is freed two steps on, and the
    # first step (model, optimizer state) is unlike the others, so steps 4 and 5 are the first pair
    # whose frees reach only steps alike: 5 run, 3 written out
    assert done == 8 and short.written_out == 3
    full, full_done = _record(tmp_path, 8, monkeypatch, shortcut=False)
    assert full_done == 8 and full.written_out == 0
    assert _normalised(short.recorded.ops) == _normalised(full.recorded.ops)
    assert [m for m in short.recorded.markers] == [m for m in full.recorded.markers]
    assert short.result.rows[0].peak_reserved == full.result.rows[0].peak_reserved
    line = script_mod.stopped_after_line(done, 8, short.written_out)
    assert "ran 5 optimizer steps; steps 6-8 repeat step 5" in line


def test_steps_that_differ_are_run(tmp_path):
    script = tmp_path / "grow.py"
    script.write_text(textwrap.dedent("""
        import torch
        w = torch.nn.Parameter(torch.zeros(8, device="cuda"))
        opt = torch.optim.SGD([w], lr=0.1)
        for step in range(10):
            x = torch.randn(1024 * (step + 1), device="cuda")   # a larger batch every step
            (w.sum() * x.sum()).backward()
            opt.step()
    """))
    run = api.predicting("H100", policies=["torch"])
    with run:
        done = script_mod.run([str(script)], run, 5, 600, write_repeats=True)
    assert done == 5 and run.written_out == 0
    assert sum(1 for op in run.recorded.ops if op[0] == ALLOC and op[2] % 4096 == 0) >= 5


def test_without_the_option_every_step_runs(tmp_path):
    run = api.predicting("H100", policies=["torch"])
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    with run:
        done = script_mod.run([str(script)], run, 8, 600)
    assert done == 8 and run.written_out == 0
