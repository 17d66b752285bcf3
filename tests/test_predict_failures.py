"""amem's failures are amem's (amem_alloc/predict/failures.py): a script that would run on a GPU but
stops under prediction because amem failed (its own code, or torch handed fake tensors) ends with one
line, `amem predict: cannot model <what> at <user file:line> (<library file:line>); please report it`,
and exit status 4, never "the script failed"; --debug adds the traceback. The user's own errors keep
their traceback and status. Each script below runs in a fresh `python -m amem_alloc predict`."""
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from helpers import ROOT, environment_without_amem, run_command

pytest.importorskip("torch")
pytest.importorskip("amem_alloc.predict.engine.session")

SCRIPT_FAILED = "the script failed"


def amem(*args, command="predict", timeout=300):
    return run_command([sys.executable, "-m", "amem_alloc", command, *map(str, args)], timeout=timeout)


def _script(tmp_path, body, name="s.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def _amems_line(proc, what, user, library=None):
    """One line on stderr (after whatever the script printed as a warning), exit 4, the exact form."""
    assert proc.returncode == 4, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr and SCRIPT_FAILED not in proc.stderr, proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("amem predict:")]
    assert len(lines) == 1 and proc.stderr.rstrip().endswith(lines[0]), proc.stderr[-3000:]
    lib = rf" \({re.escape(library)}[\w/.]*:\d+\)" if library else ""
    pattern = rf"amem predict: cannot model {re.escape(what)}.* at {re.escape(user)}{lib}; please report it"
    assert re.fullmatch(pattern, lines[0]), (pattern, lines[0])
    return lines[0]


# ---------------------------------------------------------------------------- amem's failures
# (name, script, what the line starts with, the user's line, the library's file prefix or None). Each
# script runs on a GPU: pickling a CUDA tensor, `.data =` a CPU
# tensor, copysign with a CPU scalar tensor, ... (clip_grad_norm_(foreach=True) and vmap were here
# until prediction modelled them: test_predict_kernels.py and test_predict_flex.py hold them now, as
# test_predict_legacy_types.py holds the legacy torch.cuda.FloatTensor and LongTensor)
AMEMS = [
    ("copy_out_of_meta", """\
        import pickle, torch
        x = torch.randn(4, device="cuda")
        blob = pickle.dumps(x)
        """, "NotImplementedError: Cannot copy out of meta tensor; no data!", "s.py:3", "torch/"),
    ("device_mismatch_naming_meta", """\
        import torch
        x = torch.randn(4, device="cuda")
        y = torch.copysign(x, torch.tensor(-1.0))
        """, "RuntimeError: Expected divisor (b) to be on the same device (meta)", "s.py:3", "torch/"),
    ("masked_fill_value_device", """\
        import torch
        x = torch.randn(4, device="cuda")
        x.masked_fill_(x > 0, torch.tensor(1.0))
        """, "RuntimeError: Expected `value` to be on same device as `a`", "s.py:3", "torch/_refs/"),
    ("no_meta_kernel", """\
        import torch
        a = torch.randn(6, 4, device="cuda")
        q = torch.geqrf(a)
        """, "NotImplementedError: aten::geqrf: attempted to run this operator with Meta tensors",
     "s.py:3", None),
    ("dlpack_of_meta", """\
        import torch
        capsule = torch.utils.dlpack.to_dlpack(torch.randn(4, device="cuda"))
        """, "BufferError: Cannot pack tensors on meta", "s.py:2", None),
    ("key_error_in_amems_code", """\
        import torch
        from amem_alloc.predict import state

        class Forgetful(dict):   # loses what amem stores in it: amem's next read of it fails
            def __setitem__(self, key, value):
                pass

        state.current().session.storages.addresses = Forgetful()
        x = torch.zeros(4, device="cuda")
        print(x.data_ptr())
        """, "KeyError: ", "s.py:10", None),
    ("a_stand_in_asked_for_what_torchs_object_has", """\
        import torch
        torch.cuda.Stream().a_method_amem_lacks()
        """, "AttributeError: 'FakeStream' object has no attribute 'a_method_amem_lacks'", "s.py:2", None),
    ("caught_and_raised_again_by_the_script", """\
        import pickle, torch
        try:
            pickle.dumps(torch.zeros(2, device="cuda"))
        except Exception as err:
            raise RuntimeError("could not save the model") from err
        """, "NotImplementedError: Cannot copy out of meta tensor; no data!", "s.py:3", "torch/"),
    ("caught_and_raised_again_while_handling_it", """\
        import pickle, torch
        try:
            pickle.dumps(torch.zeros(2, device="cuda"))
        except Exception:
            raise RuntimeError("could not save the model")
        """, "NotImplementedError: Cannot copy out of meta tensor; no data!", "s.py:3", "torch/"),
]


@pytest.mark.parametrize("name, body, what, user, library", AMEMS, ids=[a[0] for a in AMEMS])
def test_amems_failure_is_one_line_and_status_4(tmp_path, name, body, what, user, library):
    script = _script(tmp_path, body)
    _amems_line(amem("--", "python", script), what, user, library)


def test_a_modules_failure_names_its_file_from_the_working_folder(tmp_path):
    """`-- python -m pkg.train` run from the folder that holds pkg: the line names pkg/train.py as
    python -m finds it, relative to the working folder."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    _script(tmp_path / "pkg", AMEMS[0][1], name="train.py")   # pickling a CUDA tensor
    env = environment_without_amem()
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-m", "amem_alloc", "predict", "--", "python", "-m", "pkg.train"],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    _amems_line(proc, AMEMS[0][2], "pkg/train.py:3", "torch/")


def test_debug_adds_the_traceback_with_amems_frames_above_the_line(tmp_path):
    body = next(a[1] for a in AMEMS if a[0] == "key_error_in_amems_code")   # raised in amem's own frame
    script = _script(tmp_path, body)
    proc = amem("--debug", "--", "python", script)
    assert proc.returncode == 4, proc.stderr[-3000:]
    before, _, line = proc.stderr.rstrip().rpartition("\n")
    assert line.startswith("amem predict: cannot model KeyError: ")
    assert "Traceback (most recent call last)" in before and f'File "{script}", line 10, in <module>' in before
    assert "amem_alloc/predict/engine/storages.py" in before and "runpy" not in before
    assert before.rstrip().splitlines()[-1].startswith("KeyError: ")


def test_a_ranks_failure_is_the_same_line(tmp_path):
    """Ranks recorded in worker processes (3 ranks on a machine with cores) or in turn: rank 2's
    amem failure ends the job with the line one process gives."""
    script = _script(tmp_path, """\
        import os, torch
        x = torch.randn(4, device="cuda")
        if os.environ["RANK"] == "2":
            import pickle; blob = pickle.dumps(x)
        """)
    proc = amem("--nproc-per-node", "3", "--", "python", script)
    _amems_line(proc, "NotImplementedError: Cannot copy out of meta tensor; no data!", "s.py:4", "torch/")
    debug = amem("--debug", "--nproc-per-node", "3", "--", "python", script)
    assert debug.returncode == 4 and "Traceback (most recent call last)" in debug.stderr, debug.stderr[-3000:]


def test_fit_names_amems_failure_and_exits_4(tmp_path):
    script = _script(tmp_path, """\
        import argparse, torch
        p = argparse.ArgumentParser(); p.add_argument("--batch", type=int); args = p.parse_args()
        x = torch.randn(args.batch, 4, device="cuda")
        import pickle; blob = pickle.dumps(x)
        """)
    proc = amem("--arg", "batch", "--", "python", script, command="fit")
    assert proc.returncode == 4, proc.stderr[-3000:]
    assert "trial 1: 1: could not be predicted (cannot model NotImplementedError: Cannot copy out of meta" in proc.stdout
    last = proc.stderr.rstrip().splitlines()[-1]
    assert re.fullmatch(r"amem fit: the run fails at the smallest value, --batch 1: cannot model NotImplementedError: "
                        r"Cannot copy out of meta tensor; no data! at s\.py:4 \(torch/[\w/.]*:\d+\); please report it",
                        last), last
    assert "Traceback" not in proc.stderr
    assert "Traceback (most recent call last)" in amem("--debug", "--arg", "batch", "--", "python", script,
                                                       command="fit").stderr


# ---------------------------------------------------------------------------- the user's own errors
# (name, script, the exception's last line (its start), the line of the user's file that raised it)
USERS = [
    ("value_error", """\
        import torch
        def check(n):
            if n < 0:
                raise ValueError("n must be >= 0")
        check(-1)
        """, "ValueError: n must be >= 0", 4),
    ("shape_mismatch", """\
        import torch
        a, b = torch.randn(2, 3, device="cuda"), torch.randn(4, 5, device="cuda")
        c = a @ b
        """, "RuntimeError: a and b must have same reduction dim, but got [2, 3] X [4, 5].", 3),
    ("type_error_in_a_torch_call", """\
        import torch
        x = torch.zeros(4, device="cuda")
        y = torch.cat(x, 0)
        """, "TypeError: cat(): argument 'tensors' (position 1) must be tuple of Tensors, not Tensor", 3),
    ("key_error_in_the_users_dict", """\
        import torch
        config = {"lr": 0.1}
        x = torch.zeros(4, device="cuda")
        print(config["batch_size"])
        """, "KeyError: 'batch_size'", 4),
    ("the_users_raise_naming_meta", """\
        import torch
        x = torch.zeros(4, device="cuda")
        raise RuntimeError("Cannot copy out of meta tensor: the meta device is mine")
        """, "RuntimeError: Cannot copy out of meta tensor: the meta device is mine", 3),
    ("the_users_own_meta_tensors", """\
        import torch
        m = torch.nn.Linear(4, 4, device="meta")
        for p in m.parameters():
            p.grad = torch.zeros_like(p)
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0, foreach=True)
        """, "RuntimeError: foreach=True was passed, but can't use the foreach API on meta tensors", 5),
    ("shape_mismatch_raised_while_amem_handles_its_own_exception", """\
        import torch
        a = torch.randn(2, 3, dtype=torch.cfloat, device="cuda")
        b = torch.randn(4, 5, dtype=torch.cfloat, device="cuda")
        c = a.add(b, alpha=2j)   # amem's meta cache cannot key a complex alpha: it runs the op in its handler
        """, "RuntimeError: Attempting to broadcast a dimension of length 5 at -1! Mismatching argument at index 1 "
             "had torch.Size([4, 5]); but expected shape should be broadcastable to [2, 3]", 4),
    ("the_users_own_class_named_like_a_stand_in", """\
        import torch
        class FakeStreamOfMine:
            pass
        FakeStreamOfMine().flush()
        """, "AttributeError: 'FakeStreamOfMine' object has no attribute 'flush'", 4),
    ("a_device_string_torch_does_not_know", """\
        import torch
        device = torch.device("cudaa")   # torch's message lists meta among the types it knows
        """, "RuntimeError: Expected one of cpu, cuda, ", 2),
    ("a_memory_fraction_as_torch_refuses_it", """\
        import torch
        torch.cuda.set_per_process_memory_fraction(2.0)
        """, "ValueError: Invalid fraction value: 2.0. Allowed range: 0~1", 2),
    ("an_invalid_device_as_torch_says_it", """\
        import torch
        torch.cuda.set_device(3)
        """, "AssertionError: Invalid device id 3 (predicting 1 device)", 2),
    ("no_sdpa_kernel_as_torch_says_it", """\
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
        q = torch.randn(1, 2, 8, 16, device="cuda")
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):   # flash takes no float32: a GPU refuses it too
            torch.nn.functional.scaled_dot_product_attention(q, q, q)
        """, "RuntimeError: No available kernel. Aborting execution.", 5),
]


@pytest.mark.parametrize("name, body, last, line", USERS, ids=[u[0] for u in USERS])
def test_the_users_own_error_keeps_its_traceback_and_status(tmp_path, name, body, last, line):
    script = _script(tmp_path, body)
    proc = amem("--", "python", script)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback (most recent call last)" in proc.stderr and "cannot model" not in proc.stderr
    assert f'File "{script}", line {line}' in proc.stderr, proc.stderr[-3000:]
    lines = proc.stderr.rstrip().splitlines()
    assert lines[-1] == f"amem predict: {SCRIPT_FAILED} (exit status 1); no prediction"
    assert lines[-2].startswith(last), lines[-2]
    if name == "no_sdpa_kernel_as_torch_says_it":   # raised in amem's rules, as torch raises it: no frame of amem's
        assert "amem_alloc" not in proc.stderr, proc.stderr[-3000:]


# ---------------------------------------------------------------------------- the line's parts
def test_what_is_the_type_and_the_first_sentence_of_the_first_line():
    from amem_alloc.predict.failures import what

    assert what(KeyError("x")) == "KeyError: 'x'"
    assert what(RuntimeError("Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU "
                             "and installed a driver from http://www.nvidia.com/Download/index.aspx")) == \
        "RuntimeError: Found no NVIDIA driver on your system"
    assert what(RuntimeError("first line.\nsecond line")) == "RuntimeError: first line"
    assert what(ValueError()) == "ValueError"
    long = what(RuntimeError("x" * 500))
    assert len(long) < 200 and long.endswith("...")


def test_pipelinings_refusal_under_the_fake_process_group_is_amems():
    """torch.distributed.pipelining refuses to infer a stage's shapes across the ranks of a fake
    process group (prediction's); on the GPU's real group the stages exchange them. Under
    `amem predict -- torchrun` the pipelining tutorial's manual split read "the script failed"."""
    from amem_alloc.predict.failures import _signature

    refusal = RuntimeError("Stage 0 requires dynamic shape inference, which is not supported with a fake process "
                           "group. Provide complete static metadata (inputs/outputs, ...) to the PipelineStage "
                           "constructor.")
    assert _signature(refusal) is not None and not _signature(refusal).meta
    assert _signature(RuntimeError("Stage 0 requires dynamic shape inference")) is None


def test_a_failure_inside_a_compiled_graphs_replay_is_amems():
    """Rule 7 (failures.py): torch's error raised while amem replays inductor's wrapper (here a
    shape mismatch, which names nothing fake) is amem's: only the graph's ops run there, and
    torch's trace of the graph succeeded. The same error from a frame of the library is the user's."""
    import torch

    from amem_alloc.predict.failures import AmemFailure, amems_failure

    namespace = {"torch": torch}
    exec(compile("def call(a, b):\n    return torch.mm(a, b)\n", "<inductor_wrapper_forward>", "exec"), namespace)
    try:
        namespace["call"](torch.zeros(2, 3), torch.zeros(2, 3))
    except RuntimeError as e:
        replayed = e
    try:
        torch.mm(torch.zeros(2, 3), torch.zeros(2, 3))
    except RuntimeError as e:
        direct = e
    failure = amems_failure(replayed, None)
    assert isinstance(failure, AmemFailure)
    assert str(failure).startswith("cannot model RuntimeError: mat1 and mat2 shapes cannot be multiplied"), str(failure)
    assert amems_failure(direct, None) is None


# ---------------------------------------------------------------------------- --json without a prediction
def test_json_says_why_there_is_no_prediction(tmp_path):
    """A caller reading --json found no file when the run failed; now it finds the failure: its
    kind, the exit status and the line printed (the script's, and amem's own, told apart)."""
    import json

    users = _script(tmp_path, USERS[0][1], name="users.py")
    out = tmp_path / "users.json"
    proc = amem("--json", out, "--", "python", users)
    assert proc.returncode == 1
    data = json.loads(out.read_text())
    error = data["failure"].pop("script_error")   # the script's own exception, where its code raised it
    assert error.endswith("users.py:4: ValueError: n must be >= 0") and error.startswith(str(tmp_path)), error
    assert data == {"predicted": False, "failure": {
        "kind": "script_failed", "exit_status": 1, "says": [f"amem predict: {SCRIPT_FAILED} (exit status 1); no prediction"]}}
    ours = _script(tmp_path, AMEMS[0][1], name="ours.py")
    out = tmp_path / "ours.json"
    proc = amem("--json", out, "--nproc-per-node", "2", "--", "python", ours)
    data = json.loads(out.read_text())
    assert proc.returncode == 4 and data["failure"]["kind"] == "amem_failed" and data["failure"]["exit_status"] == 4
    assert data["failure"]["says"] == [proc.stderr.rstrip().splitlines()[-1]]


# ---------------------------------------------------------------------------- arithmetic on a zero stand-in
ZERO_DIVISION = """\
    import math, torch
    m = torch.nn.Linear(128, 10).cuda()
    labels = torch.randint(-1, 10, (32,), device="cuda")
    valid = (labels >= 0).sum().item()
    loss = m(torch.randn(32, 128, device="cuda")).sum()
    print({use})
    """


@pytest.mark.parametrize("use, error", [("loss.item() / valid", "ZeroDivisionError: float division by zero"),
                                        ("math.log(valid)", "ValueError: math domain error")])
def test_arithmetic_on_a_zero_stand_in_is_amems_limit_not_the_scripts_failure(tmp_path, use, error):
    """A count read as the zero stand-in and divided by ended the script as its own failure ("the
    script failed"); a GPU's value would not have been zero. It is amem's limit: one line naming
    the error and the zero reads before it, status 4."""
    script = _script(tmp_path, ZERO_DIVISION.format(use=use))
    proc = amem("--", "python", script)
    last = proc.stderr.rstrip().splitlines()[-1]
    assert proc.returncode == 4 and SCRIPT_FAILED not in proc.stderr, proc.stderr[-2000:]
    assert last.startswith(f"amem predict: s.py:6: {error}, computed from values prediction does not compute"), last
    assert "item() of a CUDA tensor: 0 at" in last and "s.py:4" in last and "is_predicting()" in last


def test_arithmetic_on_a_zero_stand_in_after_steps_keeps_the_steps_predicted(tmp_path):
    """pytorch/examples' super_resolution trains, then computes PSNR as 10 log10(1 / mse.item()):
    the zero stand-in ended it as not modelled, and the training steps predicted before were lost.
    After optimizer steps the prediction stands for them, status 0, and says where and why the
    script stopped (text and JSON); before any step it is not modelled, as above."""
    script = _script(tmp_path, """\
        import math, torch
        m = torch.nn.Linear(128, 10).cuda()
        opt = torch.optim.Adam(m.parameters())
        for step in range(2):
            m(torch.randn(32, 128, device="cuda")).square().mean().backward()
            opt.step()
        print("PSNR", 10 * math.log10(1 / m(torch.randn(4, 128, device="cuda")).square().mean().item()))
        """)
    out = tmp_path / "p.json"
    proc = amem("--json", out, "--", "python", script)
    assert proc.returncode == 0, proc.stderr[-2000:]
    said = json.loads(out.read_text())["stopped_after"]
    assert said.startswith("the script ran 2 optimizer steps, then stopped at s.py:7: ZeroDivisionError"), said
    assert said.endswith("the figures cover the steps it ran, not what it would have done after")
    assert "The script ran 2 optimizer steps, then stopped at s.py:7" in proc.stdout and "Traceback" not in proc.stderr


def test_a_division_by_zero_of_the_scripts_own_stays_its_failure(tmp_path):
    script = _script(tmp_path, """\
        import torch
        x = torch.ones(4, device="cuda")
        print(1 / (len(x) - 4))
        """)
    proc = amem("--", "python", script)
    assert proc.returncode == 1 and proc.stderr.rstrip().endswith(f"{SCRIPT_FAILED} (exit status 1); no prediction")
    assert "ZeroDivisionError: division by zero" in proc.stderr
