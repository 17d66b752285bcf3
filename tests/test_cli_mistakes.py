"""Every user mistake on the `amem` command line is one line saying what was wrong and what to do,
with a non-zero exit status and no Python traceback; never a doubled "amem: amem:" prefix; sizes
in units a person reads. Most cases run in this process through cli.main (fast); those that need
a process of their own (amem run, Ctrl-C) run one."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import amem_alloc
from amem_alloc import cli

from helpers import ROOT, shared_traces_dir

TRACE = shared_traces_dir() / "small_train.pickle"
needs_trace = pytest.mark.skipif(not TRACE.exists(), reason="../shared/traces is not present")
AMEM = str(Path(sys.executable).parent / "amem")


def amem(argv, capsys):
    """(exit status, stdout, stderr) of one in-process command."""
    try:
        rc = cli.main([str(a) for a in argv])
    except SystemExit as done:  # argparse's mistakes
        rc = done.code
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_line(rc, err, *words):
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2, (rc, err)  # bad input exits 2 under every command (cli/main.py)
    assert len(lines) == 1, err
    assert "Traceback" not in err and "amem: amem" not in err and "amem replay: amem" not in err
    for word in words:
        assert word in lines[0], lines[0]


@pytest.fixture()
def a_file(tmp_path):
    """A plain file: a path beneath it can never be written, whoever runs the tests."""
    f = tmp_path / "plain-file"
    f.write_text("x")
    return f


# ---------------------------------------------------------------------------- output paths
@needs_trace
@pytest.mark.parametrize("argv, option", [
    (["report", TRACE, "-o", "{bad}/r.html"], "-o"),
    (["export", TRACE, "-o", "{bad}/t.json"], "-o"),
    (["replay", TRACE, "--json", "{bad}/r.json"], "--json"),
    (["replay", TRACE, "--plot", "{bad}/r.png"], "--plot"),
])
def test_an_output_in_a_missing_folder_is_one_line(argv, option, tmp_path, capsys):
    bad = tmp_path / "no-such-folder"
    rc, out, err = amem([str(a).format(bad=bad) for a in argv], capsys)
    assert_one_line(rc, err, option, "does not exist", "create it first")
    assert not bad.exists()


@needs_trace
def test_an_output_beneath_a_file_is_one_line(a_file, capsys):
    rc, _, err = amem(["report", TRACE, "-o", a_file / "r.html"], capsys)
    assert_one_line(rc, err, "is not a folder")


def test_compare_out_beneath_a_file_is_one_line_before_any_work(a_file, capsys, monkeypatch):
    from amem_alloc.compare import processes

    monkeypatch.setattr(processes.Children, "run", lambda *a, **k: pytest.fail("a child was started"))
    rc, _, err = amem(["compare", "--workload", "mlp", "--out", a_file / "c", "--no-progress"], capsys)
    assert_one_line(rc, err, "--out", "is a file, not a folder")  # said before recording anything


def test_tracer_to_json_to_a_missing_folder_says_so(tmp_path):
    t = amem_alloc.Tracer()
    with pytest.raises(ValueError, match="Tracer.to_json .*does not exist; create it first"):
        t.to_json(tmp_path / "nowhere" / "p.json")


# ---------------------------------------------------------------------------- numbers
@needs_trace
@pytest.mark.parametrize("value", ["-1", "inf", "nan", "lots"])
def test_replay_limit_gb_must_be_a_finite_capacity(value, capsys):
    rc, _, err = amem(["replay", TRACE, "--limit-gb", value], capsys)
    assert_one_line(rc, err, "--limit-gb", "GiB")


@needs_trace
def test_report_top_must_be_positive(tmp_path, capsys):
    rc, _, err = amem(["report", TRACE, "--top", "-3", "-o", tmp_path / "r.html"], capsys)
    assert_one_line(rc, err, "--top", ">= 1")
    assert not (tmp_path / "r.html").exists()


@pytest.mark.parametrize("argv", [["demo", "--steps", "0"], ["compare", "--workload", "mlp", "--steps", "0"]])
def test_steps_must_be_positive(argv, capsys):
    rc, _, err = amem(argv, capsys)
    assert_one_line(rc, err, "--steps", ">= 1")


def test_demo_limit_gb_must_not_be_negative(capsys):
    rc, _, err = amem(["demo", "--limit-gb", "-2"], capsys)
    assert_one_line(rc, err, "--limit-gb")


# ---------------------------------------------------------------------------- input files
def test_run_a_missing_script_is_one_line():
    proc = subprocess.run([AMEM, "run", "/nonexistent/train.py"], capture_output=True, text=True, timeout=120)
    assert_one_line(proc.returncode, proc.stderr, "/nonexistent/train.py", "no such file")


@pytest.mark.parametrize("content", [b"PK\x03\x04truncated", b"not a zip at all", "foreign"])
def test_a_program_file_that_is_not_amems_is_one_line(content, tmp_path, capsys):
    path = tmp_path / "program.npz"
    if content == "foreign":
        np.savez(path, weights=np.arange(4.0))  # a valid .npz, but someone else's
    else:
        path.write_bytes(content)
    rc, _, err = amem(["replay", path], capsys)
    assert_one_line(rc, err, "not a program recorded by amem compare")


def test_a_program_with_foreign_arrays_is_refused(tmp_path):
    path = tmp_path / "program.npz"
    np.savez(path, ops=np.arange(8.0), prologue=0, device=0)
    with pytest.raises(ValueError, match="not a program recorded by amem compare"):
        amem_alloc.replay.Program.load(path)


@needs_trace
@pytest.mark.parametrize("content, why", [
    ('{"x": 1}', '"format"'), ("[1, 2]", "JSON list"), ("{not json", "not valid JSON"),
    ('{"format": "amem_alloc.provenance/1", "activations": [{"step": 1}]}', "activations[0]"),
])
def test_provenance_of_the_wrong_shape_is_one_line(content, why, tmp_path, capsys):
    prov = tmp_path / "prov.json"
    prov.write_text(content)
    rc, _, err = amem(["report", TRACE, "--provenance", prov, "-o", tmp_path / "r.html"], capsys)
    assert_one_line(rc, err, why, "Tracer.to_json")
    assert not (tmp_path / "r.html").exists()


@needs_trace
def test_export_a_device_the_trace_does_not_have(tmp_path, capsys):
    out = tmp_path / "t.csv"
    rc, _, err = amem(["export", TRACE, "-f", "rmm", "--device", "5", "-o", out], capsys)
    assert_one_line(rc, err, "no events for device 5", "devices with events: 0")
    assert not out.exists()


# ---------------------------------------------------------------------------- wording
def test_messages_that_already_name_amem_are_not_prefixed_again(capsys):
    rc, _, err = amem(["compare", "--no-progress"], capsys)  # neither a workload nor a script
    assert_one_line(rc, err, "amem compare: give --workload")


def test_out_of_memory_messages_use_units_a_person_reads():
    a = amem_alloc.Allocator(backend="sim", limit_bytes=1 << 30)
    with pytest.raises(amem_alloc.OutOfMemoryError) as err:
        a.malloc(3 << 30)
    text = str(err.value)
    assert "3.00 GiB" in text and "1.00 GiB" in text and "MiB" not in text and "0.0%" in text


# ---------------------------------------------------------------------------- Ctrl-C
# Ctrl-C during amem compare (and at start-up, and kill): tests/test_cli_interrupts.py, which waits for
# a state before it signals instead of sleeping a guess.


def test_one_line_is_the_first_line_with_one_command_prefix():
    """cli/parser.one_line is every command's line, amem predict's failures included: the command
    once, never twice, and a user's file whose name starts with "amem" still gets it."""
    from amem_alloc.cli.parser import one_line

    assert one_line(ValueError("amem: bad value"), "amem replay") == "amem: bad value"
    assert one_line(ValueError("amem predict: stopped"), "amem predict") == "amem predict: stopped"
    assert one_line(RuntimeError("amem_train.py:3: .item()\n  more"), "amem predict") == \
        "amem predict: amem_train.py:3: .item()"
    assert one_line(FileNotFoundError(2, "No such file or directory", "x.pt")) == "amem: x.pt: No such file or directory"


# ---------------------------------------------------------------------------- near names (issue 37)
@pytest.mark.parametrize("argv, line", [
    (["predict", "--gpus", "H100", "--workload", "mlp"],
     "amem predict: unrecognized arguments: --gpus (did you mean --gpu?)"),
    (["compare", "--workload", "mlp", "--stepz=3"],
     "amem compare: unrecognized arguments: --stepz=3 (did you mean --steps?)"),
    (["fit", "--arg", "batch", "--hii=8", "--", "python", "t.py"],
     "amem fit: unrecognized arguments: --hii=8 (did you mean --hi?)"),
    (["doctor", "--verbose"], "amem doctor: unrecognized arguments: --verbose"),
])
def test_an_unknown_flag_is_the_commands_mistake_and_names_the_nearest(argv, line, capsys):
    rc, _, err = amem(argv, capsys)
    assert_one_line(rc, err)
    assert err.startswith(line), err
    assert "did you mean" not in line or line.count("did you mean") == 1


@pytest.mark.parametrize("argv, near", [
    (["predict", "--workload", "gtp"], "(did you mean gpt?)"),
    (["prdict", "--workload", "gpt"], "(did you mean predict?)"),
    (["predict", "--gpu", "RTX-4900", "--workload", "mlp"], "unknown GPU 'RTX-4900' (did you mean RTX-4090?)"),
    (["predict", "--policy", "torch-expandible", "--workload", "mlp"],
     "unknown policy 'torch-expandible' (did you mean torch-expandable?)"),
    (["compare", "--workload", "mlp", "--policy", "amem_roundup4"], "(did you mean amem-roundup4?)"),
    (["predict", "--workload", "mlp", "--what-if", "checkpoint=block"],
     "unknown what-if 'checkpoint=block' (did you mean checkpoint=blocks?)"),
])
def test_a_mistyped_name_names_the_nearest(argv, near, capsys):
    rc, _, err = amem(argv, capsys)
    assert_one_line(rc, err, near)


def test_a_name_with_nothing_near_gets_no_guess(capsys):
    rc, _, err = amem(["predict", "--gpu", "zzz", "--workload", "mlp"], capsys)
    assert_one_line(rc, err, "unknown GPU 'zzz'; choose one of")
    assert "did you mean" not in err


def test_a_cards_dashes_and_case_do_not_matter():
    from amem_alloc.predict import gpus

    assert gpus.get("RTX4090") is gpus.get("rtx_4090") is gpus.GPUS["RTX-4090"]
    assert gpus.get("h100nvl") is gpus.GPUS["H100-NVL"] and gpus.get("A100-40gb") is gpus.GPUS["A100-40GB"]
    # an alias too: "H100-SXM" was offered as a choice ("did you mean H100-SXM?") and refused
    assert gpus.get("H100-SXM") is gpus.get("h100_sxm5") is gpus.get("h100 sxm") is gpus.GPUS["H100-80GB"]


def test_near_names_compares_without_case_or_dashes():
    from amem_alloc.near_names import did_you_mean, nearest

    assert nearest("RTX4080", ["RTX-4090", "RTX-3090", "L4"]) == "RTX-4090"
    assert nearest("--gpus", ["--gpu", "--json", "-h"]) == "--gpu"
    assert nearest("qqq", ["torch", "amem"]) is None and did_you_mean("qqq", ["torch"]) == ""
    assert did_you_mean("torch", ["torch"]) == ""  # an exact name is not a mistake


# ---------------------------------------------------------------------------- amem run without a GPU
@pytest.mark.skipif(__import__("amem_alloc.cuda", fromlist=["x"]).gpu_problem() is None, reason="a GPU is here")
def test_run_without_a_gpu_says_amem_is_not_active_and_why(tmp_path):
    script = tmp_path / "gpu.py"
    script.write_text("import torch\nx = torch.ones(3, device='cuda')\nprint('ran')\n")
    proc = subprocess.run([sys.executable, "-m", "amem_alloc", "run", str(script)], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and "ran" not in proc.stdout, proc.stderr
    assert lines[0].startswith("amem run: amem is not active: ") and "the script runs on the CPU only" in lines[0]
    assert len(lines) == 2 and lines[1].startswith(f"amem run: the script needs a GPU: {script}:2: ")
    assert f"amem predict -- python {script}" in lines[1]
    cpu = tmp_path / "cpu.py"
    cpu.write_text("print('ran on the CPU')\nraise SystemExit(3)\n")
    proc = subprocess.run([sys.executable, "-m", "amem_alloc", "run", str(cpu)], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert proc.returncode == 3 and "ran on the CPU" in proc.stdout
    assert proc.stderr.strip().splitlines() == [lines[0]]
