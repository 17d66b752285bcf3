"""A user's own error is never relabelled as amem's: under `amem run`, `amem compare -- python
script.py` and AMEM_ENABLE=1 the script's exception keeps its traceback (file and line) and its
exit status; only amem's own problems (a bad AMEM_CONF, a bad AMEM_ENABLE value) are amem's, and
those stop the process with one line, as `amem run` does."""
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import ROOT, run_command, run_python

pytest.importorskip("torch")
AMEM = str(Path(sys.executable).parent / "amem")

FAILING = textwrap.dedent("""\
    print("step 1 done")
    def step():
        raise RuntimeError("shape mismatch")
    step()
""")


def _script(tmp_path, text, name="b.py"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_run_keeps_the_scripts_traceback_and_exit_status(tmp_path):
    script = _script(tmp_path, FAILING)
    proc = run_command([AMEM, "run", str(script)])
    assert proc.returncode == 1
    assert "step 1 done" in proc.stdout
    assert f'File "{script}", line 3, in step' in proc.stderr
    assert proc.stderr.rstrip().endswith("RuntimeError: shape mismatch")
    assert "amem: shape mismatch" not in proc.stderr and "amem_alloc/cli/" not in proc.stderr


def test_run_keeps_a_torch_out_of_memory_error_as_the_scripts(tmp_path):
    script = _script(tmp_path, "import torch\nraise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2 GiB')\n")
    proc = run_command([AMEM, "run", str(script)])
    assert proc.returncode == 1
    assert f'File "{script}", line 2' in proc.stderr and "torch.OutOfMemoryError: CUDA out of memory" in proc.stderr


@pytest.mark.parametrize("code, status", [("sys.exit(7)", 7), ("sys.exit('bye')", 1), ("raise KeyboardInterrupt", 130),
                                          ("os._exit(6)", 6)])
def test_run_gives_pythons_exit_status(tmp_path, code, status):
    script = _script(tmp_path, f"import os, sys\n{code}\n")
    proc = run_command([AMEM, "run", str(script)])
    assert proc.returncode == status, proc.stderr


def test_run_a_syntax_error_is_the_scripts(tmp_path):
    script = _script(tmp_path, "x = (\n")
    proc = run_command([AMEM, "run", str(script)])
    assert proc.returncode == 1 and "SyntaxError" in proc.stderr and str(script) in proc.stderr


def test_run_with_a_bad_amem_conf_is_amems_one_line(tmp_path):
    script = _script(tmp_path, "print('ran')\n")
    proc = run_command([AMEM, "run", str(script)], env={"AMEM_CONF": "max_split_size_mb:1"})
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and "ran" not in proc.stdout
    assert len(lines) == 1 and lines[0].startswith("amem run: ") and "max_split_size_mb" in lines[0]


@pytest.mark.parametrize("how", ["flag", "env"])
def test_run_with_an_unknown_policy_is_amems_one_line(tmp_path, how):
    script = _script(tmp_path, "print('ran')\n")
    argv = [AMEM, "run", "--policy", "fastest", str(script)] if how == "flag" else [AMEM, "run", str(script)]
    proc = run_command(argv, env={"AMEM_POLICY": "fastest"} if how == "env" else None)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and "ran" not in proc.stdout
    assert len(lines) == 1 and lines[0].startswith("amem run: ") and "unknown policy 'fastest'" in lines[0]


# ---------------------------------------------------------------------------- AMEM_ENABLE
def test_amem_enable_with_a_bad_conf_fails_like_amem_run():
    proc = run_python("print('ran')", env={"AMEM_ENABLE": "1", "AMEM_CONF": "max_split_size_mb:1"})
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and "ran" not in proc.stdout
    assert len(lines) == 1 and "AMEM_ENABLE=1 but amem could not be enabled" in lines[0]
    assert "max_split_size_mb" in lines[0] and "amem: amem" not in lines[0]


@pytest.mark.parametrize("value", ["true", "yes"])
def test_amem_enable_other_than_0_or_1_is_an_error(value):
    proc = run_python("print('ran')", env={"AMEM_ENABLE": value})
    assert proc.returncode == 1 and "ran" not in proc.stdout
    assert f"AMEM_ENABLE={value!r}: use 1" in proc.stderr


def test_the_pth_line_hands_any_non_zero_value_to_amem():
    """The start-up hook itself (site runs this line): AMEM_ENABLE=2 reaches the check, 0 does not."""
    line = (ROOT / "amem_alloc" / "amem_alloc_autoenable.pth").read_text()
    for value, code in (("2", 1), ("0", 0), ("", 0)):
        proc = run_python(line + "\nprint('ran')", env={"AMEM_ENABLE": value})
        assert proc.returncode == code, (value, proc.stderr)
    assert "AMEM_ENABLE='2'" in run_python(line, env={"AMEM_ENABLE": "2"}).stderr


def test_amem_enable_0_leaves_torchs_allocator():
    probe = "import amem_alloc; print('enabled:', amem_alloc.is_enabled())"
    assert "enabled: False" in run_python(probe, env={"AMEM_ENABLE": "0"}).stdout


def test_a_script_under_amem_enable_keeps_its_traceback(tmp_path):
    script = _script(tmp_path, FAILING)
    proc = run_command([sys.executable, str(script)], env={"AMEM_ENABLE": "1"})
    assert proc.returncode == 1 and f'File "{script}", line 3, in step' in proc.stderr
    assert "RuntimeError: shape mismatch" in proc.stderr


# ---------------------------------------------------------------------------- amem compare -- python
TRAIN = textwrap.dedent("""\
    import torch
    w = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(w.parameters(), lr=0.1)
    for i in range(3):
        w(torch.randn(32, 64)).sum().backward()
        opt.step()
        opt.zero_grad()
        print(f"trained step {i}")
""")


def test_compare_a_failing_script_shows_its_output_traceback_and_status(tmp_path):
    script = _script(tmp_path, FAILING.replace("raise RuntimeError", "import sys; sys.stdout.flush(); raise RuntimeError"))
    proc = run_command([AMEM, "compare", "--no-progress", "--out", str(tmp_path / "c"), "--", "python", str(script)],
                       timeout=300)
    assert proc.returncode == 1
    assert "step 1 done" in proc.stdout
    assert f'File "{script}", line 3, in step' in proc.stderr and "RuntimeError: shape mismatch" in proc.stderr
    assert "exited with status 1" in proc.stderr and "amem compare: recording" not in proc.stderr


def test_compare_a_script_counts_its_optimizer_steps_and_shows_its_output(tmp_path):
    script = _script(tmp_path, TRAIN, "train.py")
    out = tmp_path / "c"
    proc = run_command([AMEM, "compare", "--no-progress", "--policies", "torch", "--out", str(out),
                        "--", "python", str(script)], timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "trained step 2" in proc.stdout
    import json
    recording = json.loads((out / "compare.json").read_text())["recording"]
    assert recording["steps"] == 3 and len(recording["step_ops"]) == 3


def test_an_optimizer_container_stepping_its_parts_is_one_step(tmp_path):
    """torchtitan's OptimizersContainer is an Optimizer whose step() steps each part: one step of
    the training loop, not 1 + parts (prediction's --steps counts these)."""
    from amem_alloc import script_steps

    script = tmp_path / "container.py"
    script.write_text(textwrap.dedent("""
        import torch
        params = [torch.nn.Parameter(torch.zeros(2)) for _ in range(2)]
        class Container(torch.optim.Optimizer):
            def __init__(self):
                self.parts = [torch.optim.SGD([p], lr=0.1) for p in params]
                super().__init__(params, {})
            def step(self, closure=None):
                for part in self.parts:
                    part.step()
        opt = Container()
        for _ in range(3):
            opt.step()
        torch.optim.SGD(params, lr=0.1).step()
    """))
    seen = []
    assert script_steps.run_steps([str(script)], seen.append) == 4
    assert seen == [1, 2, 3, 4]


HOLDER = """
import torch
params = [torch.nn.Parameter(torch.zeros(2)) for _ in range(2)]
inner = torch.optim.SGD([{"params": [params[0]]}, {"params": [params[1]]}], lr=0.1)
class Zero:   # as DeepSpeed's ZeRO optimizers: no torch Optimizer; steps the one it holds per group
    def __init__(self, optimizer):
        self.optimizer = optimizer
    def step(self):
        for group in self.optimizer.param_groups:
            self.optimizer.step()
            print("group stepped", flush=True)
zero = Zero(inner)
for _ in range(3):
    zero.step()
inner.step()
"""


def test_the_steps_an_optimizers_holder_takes_of_it_in_its_step_are_one_step(tmp_path, capsys):
    """DeepSpeed's ZeRO optimizers step their torch optimizer once per parameter group from their
    own step(): one training step. Counted one by one, HF Trainer with ZeRO and two groups was
    stopped by --steps at half its steps, the last inside a step."""
    from amem_alloc import script_steps

    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    seen = []
    assert script_steps.run_steps([str(script)], seen.append) == 4
    assert seen == [1, 2, 3, 4]

    class Enough(Exception):
        pass

    def stop(n):
        raise Enough

    capsys.readouterr()
    with pytest.raises(Enough):   # stopped as the holder's step returns: both groups stepped
        script_steps.run_steps([str(script)], stop, reraise=(Enough,))
    assert capsys.readouterr().out.count("group stepped") == 2
    assert sys.getprofile() is None


def test_an_error_leaving_a_holders_step_is_the_scripts_own(tmp_path):
    """The holder's step raising (the script's own error) is no step: its error goes on as the
    script's, never replaced by the stop a count would raise."""
    from amem_alloc import script_steps
    from amem_alloc.user_script import ScriptFailed

    script = tmp_path / "raising.py"
    script.write_text(HOLDER.replace('print("group stepped", flush=True)', 'raise ValueError("the script\'s own")'))

    class Enough(Exception):
        pass

    def stop(n):
        raise Enough

    with pytest.raises(ScriptFailed):
        script_steps.run_steps([str(script)], stop, reraise=(Enough,))
    assert sys.getprofile() is None


def test_a_holders_step_that_runs_the_loop_counts_each_of_its_steps(tmp_path):
    """A method named step that holds the optimizer but runs the whole loop (a backward pass
    begins inside it) is no single step: each optimizer step still counts."""
    from amem_alloc import script_steps

    script = tmp_path / "loop.py"
    script.write_text(textwrap.dedent("""
        import torch
        class Trainer:
            def __init__(self):
                self.model = torch.nn.Linear(2, 2)
                self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
            def step(self):
                for _ in range(3):
                    self.model(torch.ones(1, 2)).sum().backward()
                    self.opt.step()
        Trainer().step()
    """))
    seen = []
    assert script_steps.run_steps([str(script)], seen.append) == 3
    assert seen == [1, 2, 3] and sys.getprofile() is None
