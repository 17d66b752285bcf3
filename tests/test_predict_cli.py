"""`amem predict` end to end, in a fresh process each: scripts run unchanged and their torch.cuda
calls answer from the prediction; data-dependent code stops with one line naming file and line;
the user's own errors keep their traceback and status; bad input is one line; --json, --trace
(opened by torch's _memory_viz and amem's replay/report) and --report."""
import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import environment_without_amem, run_command

pytest.importorskip("torch")
MiB = 1 << 20


def amem(*args, timeout=300):
    return run_command([sys.executable, "-m", "amem_alloc", "predict", *map(str, args)], timeout=timeout)


def _one_line_error(proc, code, *needles):
    assert proc.returncode == code, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("amem predict:"), proc.stderr
    assert "Traceback" not in proc.stderr
    for n in needles:
        assert n in lines[0], lines[0]


# ---------------------------------------------------------------------------- bad input (no engine needed)
@pytest.mark.parametrize("args, needle", [
    (["--gpu", "H1000", "--workload", "mlp"], "unknown GPU 'H1000'"),
    (["--capacity-gb", "-3", "--workload", "mlp"], "capacity must be a positive number"),
    (["--capacity-gb", "1e-12", "--workload", "mlp"], "capacity must be a positive number"),
    (["--gpu", "H100", "--capacity-gb", "3", "--workload", "mlp"], "not allowed with argument"),
    (["--policy", "torch,bogus", "--workload", "mlp"], "unknown policy 'bogus'"),
    (["--workload", "bert"], "invalid choice: 'bert'"),
    (["--workload", "mlp", "--size", "0"], "--size must be an integer >= 1"),
    (["--workload", "mlp", "--steps", "0"], "--steps >= 1 for a workload"),
    (["--workload", "mlp", "--timeout", "-1"], "--timeout must be a number of seconds >= 0"),
    (["--", "python", "does_not_exist.py"], "does_not_exist.py: no such script"),
    (["--", "python", "-m", "no_such_module_here"], "no module named 'no_such_module_here'"),
    (["--", "no_such_command_here"], "'no_such_command_here': no such command (not on PATH"),
    (["--", "sh"], "'sh' is not a Python script"),
    ([], "give --workload NAME, or -- python script.py"),
    (["--workload", "mlp", "--json", "/no/such/dir/p.json"], "its folder does not exist"),
])
def test_bad_input_is_one_line(args, needle, capsys):
    from amem_alloc.cli import main

    try:
        rc = main(["predict", *args])
    except SystemExit as exit_:          # argparse's own checks
        rc = exit_.code
    err = capsys.readouterr().err
    _one_line_error(type("P", (), {"returncode": rc, "stderr": err, "stdout": ""})(), 2, needle)


def test_bad_input_in_a_fresh_process_has_no_traceback():
    _one_line_error(amem("--gpu", "H1000", "--workload", "mlp"), 2, "unknown GPU")


# ---------------------------------------------------------------------------- with the engine
engine = pytest.importorskip("amem_alloc.predict.engine.session")

SCRIPT = textwrap.dedent("""
    import sys
    import torch

    assert torch.cuda.is_available() and torch.cuda.device_count() == 1
    device = torch.device("cuda")
    props = torch.cuda.get_device_properties(0)
    print("card", props.name, props.total_memory, torch.cuda.get_device_capability())
    model = torch.nn.Linear(1024, 1024).to(device)           # 4 MiB weight, 4 KiB bias
    torch.cuda.synchronize()
    print("after model", torch.cuda.memory_allocated())
    torch.cuda.memory._record_memory_history(max_entries=10000)
    x = torch.randn(int(sys.argv[1]), 1024, device=device)
    model(x).square().mean().backward()
    torch.cuda.synchronize()
    print("peak", torch.cuda.max_memory_allocated(), "reserved", torch.cuda.memory_reserved())
    torch.cuda.memory._dump_snapshot(sys.argv[2])
    torch.cuda.reset_peak_memory_stats()
    print("after reset", torch.cuda.max_memory_allocated() == torch.cuda.memory_allocated())
""")


def test_a_script_runs_unchanged_and_its_cuda_calls_answer(tmp_path):
    from amem_alloc.predict import gpus
    from amem_alloc.snapshot import load_snapshot

    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    dump, js = tmp_path / "mid.pickle", tmp_path / "p.json"
    proc = amem("--gpu", "A100-80GB", "--policy", "torch,amem-roundup4", "--json", js, "--", "python", script,
                "512", dump)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    card = gpus.get("A100-80GB")
    assert f"card {card.name} {card.total_memory} (8, 0)" in out
    assert f"after model {4 * MiB + 4096}" in out
    assert "after reset True" in out and "PREDICTION without a GPU" in out
    peak = int(out.split("peak ")[1].split()[0])
    assert peak >= 4 * MiB + 4096 + 512 * 1024 * 4                     # weights and the input at least
    data = json.loads(js.read_text())
    assert data["gpu"] == {**data["gpu"], "name": card.name, "capacity_bytes": card.total_memory}
    assert [r["policy"] for r in data["policies"]] == ["torch", "amem-roundup4"]
    assert data["policies"][0]["peak_allocated"] == peak and data["policies"][0]["fits"] is True  # live == replay
    assert data["at_peak"].get("parameter", 0) >= 4 * MiB
    snap = load_snapshot(dump)                                          # the script's own dump
    assert any(e["action"] == "alloc" for e in snap["device_traces"][0])


def test_workload_outputs_open_in_memory_viz_and_amem(tmp_path):
    trace, report, js = tmp_path / "t.pickle", tmp_path / "r.html", tmp_path / "p.json"
    proc = amem("--workload", "mlp", "--steps", "1", "--capacity-gb", "1", "--json", js, "--trace", trace,
                "--report", report)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(js.read_text())
    assert set(data) >= {"gpu", "policies", "at_peak"} and data["gpu"]["capacity_bytes"] == 1 << 30
    assert {"parameter", "gradient"} <= set(data["at_peak"])
    viz = run_command([sys.executable, "-m", "torch.cuda._memory_viz", "trace_plot", str(trace), "-o",
                       str(tmp_path / "viz.html")])
    assert viz.returncode == 0 and (tmp_path / "viz.html").stat().st_size > 1000, viz.stderr
    rep = run_command([sys.executable, "-m", "amem_alloc", "replay", str(trace), "--policy", "torch"])
    assert rep.returncode == 0, rep.stderr
    torch_peak = next(r["peak_reserved"] for r in data["policies"] if r["policy"] == "torch")
    from amem_alloc.introspection import format_bytes
    assert format_bytes(torch_peak) in rep.stdout                       # the replay gives the same peak
    assert "<html" in report.read_text()[:300].lower()


def test_strict_stops_at_a_value_read_with_file_and_line(tmp_path):
    script = tmp_path / "dd.py"
    script.write_text("import torch\nx = torch.randn(8, device='cuda')\nif x.sum() > 0:\n    print('positive')\n")
    proc = amem("--strict", "--", "python", script)
    _one_line_error(proc, 3, f"{script}:3")


def test_value_reads_get_stand_ins_listed_with_the_users_line(tmp_path):
    script = tmp_path / "dd.py"
    script.write_text("import torch\nx = torch.randn(8, device='cuda')\nfor i in range(3):\n"
                      "    if x.sum() > 0:\n        print('positive')\n    print(f'loss {x.mean().item():.2f}')\n")
    js = tmp_path / "p.json"
    proc = amem("--json", js, "--", "python", script)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("loss 0.00") == 3 and "positive" not in proc.stdout
    notes = json.loads(js.read_text())["notes"]   # the user's files relative to the script's folder
    assert {(n["kind"], n["where"], n["count"]) for n in notes} == {("stand-in", "dd.py:4", 3),
                                                                    ("stand-in", "dd.py:6", 3)}
    assert "at dd.py:6 x3" in proc.stdout and f"at {script}" not in proc.stdout


def test_a_script_is_stopped_after_its_steps_and_says_so(tmp_path):
    script = tmp_path / "loop.py"
    script.write_text("import torch\nm = torch.nn.Linear(64, 64).cuda()\nopt = torch.optim.SGD(m.parameters())\n"
                      "for i in range(10000):\n    m(torch.randn(8, 64, device='cuda')).sum().backward()\n"
                      "    opt.step()\n    opt.zero_grad()\n")
    js = tmp_path / "p.json"
    proc = amem("--steps", "3", "--json", js, "--", "python", script)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(js.read_text())
    assert [name for _, name in data["program"]["markers"]] == ["step"] * 3
    assert "stopped after 3 optimizer steps" in data["stopped_after"] and "stopped after 3" in proc.stdout


def test_optimizer_steps_in_a_backward_pass_are_one_step(tmp_path):
    """An optimizer per parameter, stepped by its gradient hook (torchtune's `optimizer_in_bwd`):
    the steps of one backward pass are one training step, counted as the backward ends. Counted
    one by one, --steps 3 stopped the script inside its first backward, before a whole step ran."""
    script = tmp_path / "in_backward.py"
    script.write_text(textwrap.dedent("""
        import torch
        m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64)).cuda()
        optimizers = {p: torch.optim.AdamW([p]) for p in m.parameters()}

        def step(p):
            optimizers[p].step()
            optimizers[p].zero_grad()

        for p in m.parameters():
            p.register_post_accumulate_grad_hook(step)
        for i in range(10000):
            m(torch.randn(8, 64, device="cuda")).sum().backward()
            print("iteration", i, "done")
    """))
    js = tmp_path / "p.json"
    proc = amem("--steps", "3", "--json", js, "--", "python", script)
    assert proc.returncode == 0, proc.stderr
    assert "iteration 1 done" in proc.stdout and "iteration 2 done" not in proc.stdout, proc.stdout[-2000:]
    data = json.loads(js.read_text())
    assert [name for _, name in data["program"]["markers"]] == ["step"] * 3
    assert "stopped after 3 optimizer steps" in data["stopped_after"]


MANUAL_UPDATES = textwrap.dedent("""
    import torch
    model = torch.nn.Linear(256, 256).cuda()
    {before}
    for i in range(10000):
        loss = model(torch.randn(32, 256, device="cuda")).square().mean()
        model.zero_grad()
        loss.backward()
        torch.autograd.grad(model(torch.randn(4, 256, device="cuda")).sum(), model.weight)   # not a step
        with torch.no_grad():
            for p in model.parameters():
                p.add_(p.grad, alpha=-0.1)
        {step}
        print("iteration", i, "done")
""")


@pytest.mark.parametrize("optimizer", [False, True])
def test_a_script_without_an_optimizer_counts_its_backward_passes_as_steps(tmp_path, optimizer):
    """PyTorch's word_language_model updates its parameters itself: no optimizer ever steps, so
    --steps never stopped it (an epoch of 661 batches ran into the 600 s timeout: no prediction).
    Without an optimizer each backward pass is a step, said in a note; with one (here made but
    stepped every 4th iteration, as gradient accumulation does), only its steps count."""
    script = tmp_path / "manual.py"
    before = "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)" if optimizer else ""
    step = "if i % 4 == 3: optimizer.step()" if optimizer else ""
    script.write_text(MANUAL_UPDATES.format(before=before, step=step))
    js = tmp_path / "p.json"
    proc = amem("--steps", "3", "--json", js, "--", "python", script)
    assert proc.returncode == 0, proc.stderr[-2000:]
    last = 11 if optimizer else 2
    assert f"iteration {last - 1} done" in proc.stdout and f"iteration {last} done" not in proc.stdout
    data = json.loads(js.read_text())
    said = [n for n in data["notes"] if n["kind"] == "assumed" and "no torch.optim optimizer" in n["what"]]
    assert len(said) == (0 if optimizer else 1) and all(n["where"].endswith("manual.py:8") for n in said), said
    # the stop says what was counted (it said "optimizer steps" of a script that made none)
    unit = "3 optimizer steps" if optimizer else "3 backward passes"
    assert f"stopped after {unit} (--steps 3" in data["stopped_after"], data["stopped_after"]


def test_notes_made_in_backward_name_the_line_that_called_it(tmp_path):
    """A note made in backward names the line that called backward(), as the forward's names the
    forward's: no frame of amem's between the two may end the search for the user's line (a
    wrapper in the script runner's own file did, and every backward note read "at ?")."""
    script = tmp_path / "convs.py"
    script.write_text(textwrap.dedent("""\
        import torch
        torch.backends.cudnn.benchmark = True
        net = torch.nn.Conv2d(3, 16, 3).cuda()
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        out = net(torch.randn(8, 3, 64, 64, device="cuda", requires_grad=True))
        out.mean().backward()
        opt.step()
    """))
    js = tmp_path / "p.json"
    proc = amem("--json", js, "--", "python", script)
    assert proc.returncode == 0, proc.stderr[-2000:]
    search = {n["what"].split(" (")[0]: n["where"] for n in json.loads(js.read_text())["notes"]
              if "benchmark search workspace" in n["what"]}
    assert search["cuDNN benchmark search workspace, forward"].startswith("convs.py:5")
    assert search["cuDNN benchmark search workspace, backward data"] == "convs.py:6"
    assert search["cuDNN benchmark search workspace, backward filter"] == "convs.py:6"


def test_a_script_past_its_timeout_ends_with_one_line(tmp_path):
    script = tmp_path / "forever.py"
    script.write_text("import torch\nx = torch.randn(8, device='cuda')\nwhile True:\n    x = x * 2\n")
    _one_line_error(amem("--timeout", "2", "--", "python", script), 124, "--timeout 2 s", "forever.py:")


def test_the_timeout_is_not_lost_when_its_first_raise_is(tmp_path):
    """The deadline raises again while the script runs on: a raise swallowed once (a script's bare
    except here; Python itself swallows one raised inside a weakref callback) does not make it hang."""
    script = tmp_path / "swallows.py"
    script.write_text("import torch\nx = torch.randn(8, device='cuda')\ntry:\n    while True:\n        x = x * 2\n"
                      "except BaseException:\n    pass\nwhile True:\n    x = x * 2\n")
    _one_line_error(amem("--timeout", "1", "--", "python", script), 124, "--timeout 1 s", "swallows.py:")


def test_make_graphed_callables_is_amems_limit_in_one_line(tmp_path):
    script = tmp_path / "graphs.py"
    script.write_text("import torch\nx = torch.randn(4, device='cuda')\n"
                      "f = torch.cuda.make_graphed_callables(torch.nn.Linear(4, 4).cuda(), (x,))\n")
    _one_line_error(amem("--", "python", script), 4, "make_graphed_callables", f"{script}:3", "cannot be predicted")


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_a_child_process_using_cuda_is_amems_limit_in_one_line(tmp_path, method):
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(f"""\
        import torch, torch.multiprocessing as mp
        def work(i):
            return torch.randn(4, device="cuda")
        if __name__ == "__main__":
            p = mp.get_context("{method}").Process(target=work, args=(0,))
            p.start(); p.join()
            print("child exit", p.exitcode)
        """))
    _one_line_error(amem("--", "python", script), 4, "a child process", "child.py:3", "cannot be predicted")


def test_the_trace_names_the_users_files_relative_and_no_frame_of_amems(tmp_path):
    """Started as the `amem` console script starts it (a launcher file outside amem_alloc/), the
    trace's frames are the script's own, relative to its folder: not the launcher, not amem's."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "model.py").write_text("import torch\ndef make():\n    return torch.zeros(1024, device='cuda')\n")
    script = tmp_path / "train.py"
    script.write_text("import sys, torch\nsys.path.insert(0, sys.path[0])\nfrom pkg.model import make\n"
                      "x = make()\ny = torch.ones(2048, device='cuda')\n")
    launcher = tmp_path / "bin" / "amem"
    launcher.parent.mkdir()
    launcher.write_text("import sys\nfrom amem_alloc.cli import main\nsys.exit(main())\n")
    trace, js = tmp_path / "t.pickle", tmp_path / "p.json"
    proc = run_command([sys.executable, str(launcher), "predict", "--trace", str(trace), "--json", str(js), "--",
                        "python", str(script)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    from amem_alloc.snapshot import load_snapshot
    events = [e for e in load_snapshot(trace)["device_traces"][0] if e["action"] == "alloc"]
    files = {(f["filename"], f["line"]) for e in events for f in e["frames"]}
    assert files == {("pkg/model.py", 3), ("train.py", 4), ("train.py", 5)}, files
    largest = json.loads(js.read_text())["at_peak_largest"]
    assert {x["where"] for x in largest} == {"pkg/model.py:3", "train.py:5"}


def test_cuda_rng_state_is_a_stand_in(tmp_path):
    script = tmp_path / "rng.py"
    script.write_text("import torch\ns = torch.cuda.get_rng_state()\ntorch.cuda.set_rng_state(s)\n"
                      "x = torch.randn(4, device='cuda')\n")
    js = tmp_path / "p.json"
    assert amem("--json", js, "--", "python", script).returncode == 0
    assert {n["where"] for n in json.loads(js.read_text())["notes"]} == {"rng.py:2", "rng.py:3"}


def test_the_scripts_syntax_error_keeps_its_own_traceback(tmp_path):
    """(Its KeyboardInterrupt is the command's "interrupted", as Ctrl-C is: tests/test_cli_interrupts.py.)"""
    script = tmp_path / "syn.py"
    script.write_text("import torch\nx = (\n")
    proc = amem("--", "python", script)
    assert proc.returncode == 1 and "SyntaxError" in proc.stderr and "amem_alloc" not in proc.stderr


def test_the_users_own_error_keeps_its_traceback_and_status(tmp_path):
    script = tmp_path / "bad.py"
    script.write_text("import torch\n\ndef f():\n    raise KeyError('mine')\n\nf()\n")
    proc = amem("--", "python", script)
    assert proc.returncode == 1
    assert "Traceback (most recent call last)" in proc.stderr and "KeyError: 'mine'" in proc.stderr
    assert f'File "{script}", line 4, in f' in proc.stderr and "amem_alloc" not in proc.stderr.split("KeyError")[0]
    script.write_text("import sys\nsys.exit(7)\n")
    assert amem("--", "python", script).returncode == 7


OS_EXIT = textwrap.dedent("""\
    import multiprocessing, os, torch
    x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    child = os.fork()
    if child == 0:
        os._exit(9)   # a forked child ends as Python ends it
    assert os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) == 9
    worker = multiprocessing.get_context("fork").Process(target=print, args=("in the child",))
    worker.start(); worker.join()
    assert worker.exitcode == 0
    y = torch.empty(32 << 20, dtype=torch.uint8, device="cuda")
    os._exit({status})
    raise AssertionError("os._exit returned")
""")


@pytest.mark.parametrize("status", [0, 5])
def test_a_script_ending_with_os_exit_ends_as_sys_exit_would(tmp_path, status):
    """os._exit (a script skipping its libraries' teardown) ends the script, not amem: with 0 the
    prediction is printed and its JSON written, with 5 the JSON says the script failed; its
    folders are removed as at any end."""
    script, out, scratch = tmp_path / "ends.py", tmp_path / "p.json", tmp_path / "scratch"
    script.write_text(OS_EXIT.format(status=status))
    scratch.mkdir()
    proc = run_command([sys.executable, "-m", "amem_alloc", "predict", "--json", out, "--", "python", script],
                       env={**os.environ, "TMPDIR": str(scratch)}, timeout=300)
    assert proc.returncode == status, proc.stderr[-2000:]
    assert "os._exit returned" not in proc.stderr and "in the child" in proc.stdout
    if status == 0:
        torch_policy = next(r for r in json.loads(out.read_text())["policies"] if r["policy"] == "torch")
        assert torch_policy["peak_allocated"] == 96 * MiB
    else:   # no prediction: the JSON says why (cli/predict_exits.py)
        assert "exit status 5" in proc.stderr
        assert json.loads(out.read_text())["failure"] == {"kind": "script_failed", "exit_status": 5, "says": [
            "amem predict: the script failed (exit status 5); no prediction"]}
    assert [p.name for p in scratch.iterdir() if p.name.startswith("amem-")] == []


SILENCED = textwrap.dedent("""\
    import builtins, os, sys, torch, torch.distributed as dist
    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    if dist.get_rank() != 0:
        builtins.print = lambda *args, **kwargs: None   # torchvision's setup_for_distributed
    else:
        sys.stdout = open(os.path.join(os.path.dirname(__file__), "train.log"), "w")   # a logger's tee
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(256, 256).cuda())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        model(torch.randn(8, 256, device="cuda")).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    print("trained")
""")


@pytest.mark.parametrize("launch", [["python"], ["torchrun", "--nproc_per_node", "2"]])
def test_a_print_or_standard_output_the_script_replaced_does_not_swallow_the_prediction(tmp_path, launch):
    """torchvision's references replace builtins.print on every rank but 0, and the prediction of a
    torchrun job printed nothing at all (exit 0): the ranks run in this process, one after the
    other. The builtins and standard streams are put back after the script; what it printed into
    its own log stays there."""
    script = tmp_path / "silenced.py"
    script.write_text(SILENCED)
    proc = run_command([sys.executable, "-m", "amem_alloc", "predict", "--policy", "torch", "--", *launch, str(script)],
                       timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "peak allocated" in proc.stdout and "trained" not in proc.stdout
    assert "trained" in (tmp_path / "train.log").read_text()


def test_a_module_runs_as_python_m_runs_it_and_its_package_is_the_users_code(tmp_path):
    """`-- python -m pkg.train` (and torchrun -m): the working folder on the path as python -m puts
    it, sys.argv as the module sees it, and the package's lines named as the user's in the notes.
    Run through the `amem` console script, whose own folder, not the working one, is first on its
    path: finding the module must not depend on it, nor run the package's __init__ outside the run."""
    import subprocess

    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("print('package initialised')\n")
    (pkg / "train.py").write_text(textwrap.dedent("""
        import sys
        import torch
        x = torch.zeros(1024, 1024, device="cuda")
        print("argv", sys.argv[1:], "loss", x.sum().item())
    """))
    env = environment_without_amem()
    proc = subprocess.run([str(Path(sys.executable).parent / "amem"), "predict", "--gpu", "H100", "--", "python",
                           "-m", "pkg.train", "--lr", "1"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("package initialised") == 1
    assert "argv ['--lr', '1']" in proc.stdout
    assert "4.00 MiB" in proc.stdout
    stand_in = next(line for line in proc.stdout.splitlines() if "item() of a CUDA tensor" in line)
    assert "train.py:5" in stand_in and "bin/amem" not in stand_in and "__main__" not in stand_in


def test_a_python_command_on_path_runs_as_its_script(tmp_path):
    """`-- litgpt finetune ...`, `-- tune run ...`: a command pip installed (its first line runs
    Python, no .py) is the script, found on PATH as the shell finds it; its arguments are its own."""
    import os

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    command = bin_dir / "my-trainer"
    command.write_text("#!/usr/bin/env python3\n" + textwrap.dedent("""
        import sys
        import torch
        x = torch.zeros(1024, 1024, device="cuda")
        print("argv", sys.argv[1:])
    """))
    command.chmod(0o755)
    proc = run_command([sys.executable, "-m", "amem_alloc", "predict", "--gpu", "H100", "--", "my-trainer", "--lr", "1"],
                       env={"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "argv ['--lr', '1']" in proc.stdout and "4.00 MiB" in proc.stdout


def test_a_pip_installed_commands_package_is_the_users_code(tmp_path):
    """A command pip installed (`from PACKAGE.cli import main`) runs its package as the program, as
    `python -m` does: the notes' lines are the package's, not the command's file with the package
    as the library line below it."""
    import site

    user_base = tmp_path / "user"
    packages = Path(site.getusersitepackages().replace(site.getuserbase(), str(user_base), 1))
    (packages / "ctool").mkdir(parents=True)
    (packages / "ctool" / "__init__.py").write_text("")
    (packages / "ctool" / "cli.py").write_text(textwrap.dedent("""\
        import torch

        def main():
            loss = torch.randn(1024, device="cuda").sum()
            print("loss", loss.item())
    """))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    command = bin_dir / "ctool"
    command.write_text(f"#!{sys.executable}\nimport sys\nfrom ctool.cli import main\n"
                       "if __name__ == '__main__':\n    sys.exit(main())\n")
    command.chmod(0o755)
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONUSERBASE": str(user_base),
           "PYTHONPATH": str(packages)}
    proc = run_command([sys.executable, "-m", "amem_alloc", "predict", "--gpu", "H100", "--", "ctool"], env=env,
                       timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    note = next(line for line in proc.stdout.splitlines() if "item() of a CUDA tensor" in line)
    assert note.rstrip().endswith("at ctool/cli.py:5"), note


def test_a_warning_torch_raises_for_the_script_is_shown_at_the_scripts_line(tmp_path):
    """torch's warnings name their caller's line; under prediction that frame was amem's device
    mode (`device_mode.py:161: UserWarning: dropout2d: ...`). It is the script's line again."""
    script = tmp_path / "warns.py"
    script.write_text("import torch\nimport torch.nn.functional as F\n"
                      "F.dropout2d(torch.randn(4, 8, device='cuda'), 0.5, training=True)\n")
    proc = amem("--", "python", script)
    assert proc.returncode == 0, proc.stderr[-2000:]
    warned = [line for line in proc.stderr.splitlines() if "UserWarning: dropout2d" in line]
    assert len(warned) == 1 and warned[0].startswith(f"{script}:3: UserWarning"), proc.stderr[-2000:]


ONE_STEP = """
import sys, torch
model = torch.nn.Linear(256, 256).cuda()
opt = torch.optim.AdamW(model.parameters())
for step in range(int(sys.argv[1])):   # one epoch of a tiny dataset: a step or two
    model(torch.randn(64, 256, device="cuda")).sum().backward()
    opt.step()
    opt.zero_grad()
"""


def test_a_script_that_ends_after_one_optimizer_step_is_said_to(tmp_path):
    """Its figures miss the second step's peak, with the optimizer's state held beside the step's
    activations (ultralytics' one epoch of a small dataset: 272 MiB, against 284 MiB from the second
    step on); the header said nothing."""
    script = tmp_path / "one.py"
    script.write_text(ONE_STEP)
    said = "ended after 1 optimizer step"
    one = amem("--gpu", "H100", "--", "python", script, "1")
    two = amem("--gpu", "H100", "--", "python", script, "2")
    assert one.returncode == two.returncode == 0, one.stderr + two.stderr
    assert said in one.stdout.splitlines()[2] and said not in two.stdout, one.stdout[:600]
    # the table's last column is said what it is (read as fragmentation at the allocated peak)
    assert "frag. at peak: the share of reserved memory not allocated when reserved memory peaked" in two.stdout


EXPORT = """import torch
m = torch.nn.Linear(64, 64).cuda()
x = torch.randn(4, 64, device="cuda")
{guard}ep = torch.export.export(m, (x,))
print("exported", type(ep).__name__)
"""


def test_torch_export_where_autograd_would_ask_the_driver_is_said_in_one_line(tmp_path):
    """torch.export of a module whose parameters require grad (torch.distributed.pipelining's
    pipeline() exports so) traces on torch's own fake CUDA tensors; autograd asked the CUDA driver
    for a stream and the process aborted (status 134, no message). It is now refused in one line,
    status 4; exported under no_grad it runs."""
    script = tmp_path / "export.py"
    script.write_text(EXPORT.format(guard=""))
    proc = amem("--", "python", script)
    _one_line_error(proc, 4, "torch.export of Linear", "export.py:4", "torch.no_grad()")
    script.write_text(EXPORT.format(guard="with torch.no_grad():\n    "))
    proc = amem("--", "python", script)
    assert proc.returncode == 0 and "exported ExportedProgram" in proc.stdout, proc.stderr[-2000:]
