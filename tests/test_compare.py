"""`amem compare` without a GPU: the workload's CUDA allocations are predicted once, every
configuration replays them in a process of its own (checked by pid), and the table, JSON, PNG and
HTML say it was predicted without a GPU."""
import json
import os
import sys
import textwrap
from types import SimpleNamespace

import pytest

from amem_alloc import policies, replay
from amem_alloc.cli import main as amem
from amem_alloc.compare import compare, format_markdown, format_text
from amem_alloc.cli.parser import script_argv as _script


def _check_rows(result, names):
    assert [r["policy"] for r in result.rows] == list(names)
    assert all(not r.get("error") for r in result.rows), [r.get("error") for r in result.rows]
    pids = [r["pid"] for r in result.rows]
    assert len(set(pids)) == len(pids) and os.getpid() not in pids      # one fresh process each
    assert (result.recording or {}).get("pid") not in pids


def test_compare_a_bundled_workload_simulated(tmp_path):
    result = compare(workload="decode", steps=3, out_dir=tmp_path, progress=False)
    assert result.mode == "simulated"
    _check_rows(result, policies.DEFAULT_COMPARE)
    for row in result.rows:
        assert row["peak_reserved"] >= row["peak_allocated"] > 0 and row["ooms"] == 0
        assert 0 <= row["fragmentation_at_peak"] < 1 and row["device_mallocs"] >= 1 and row["timeline"]
        assert row["seconds_per_step"] > 0
    by = {r["policy"]: r for r in result.rows}
    assert by["amem"]["peak_reserved"] <= by["torch-expandable"]["peak_reserved"]  # amem's policy wastes no more
    assert result.recording["steps"] == 3 and result.recording["ops"] > 100
    assert result.recording["method"].startswith("prediction")
    text = format_text(result)
    assert "PREDICTED without a GPU" in text and "torch-expandable" in text
    assert format_markdown(result).count("\n") == len(result.rows) + 1
    saved = json.loads((tmp_path / "compare.json").read_text())
    assert saved["mode"] == "simulated" and len(saved["rows"]) == len(result.rows)
    assert (tmp_path / "compare.png").read_bytes()[:4] == b"\x89PNG"
    page = (tmp_path / "compare.html").read_text()
    assert "<svg class='compare-plot'" in page and "PREDICTED" in page
    assert page.count("<polyline") == 2 * len(result.rows) and page.count("class='mark'") == 3  # one rule a step
    from amem_alloc.introspection import format_bytes  # the page shows the text table's cells
    assert all(f"<td>{r['policy']}</td><td>{format_bytes(r['peak_allocated'])}</td>" in page for r in result.rows)
    assert not any(p.name.startswith("amem-compare-") for p in tmp_path.iterdir())  # work folder removed
    assert len(replay.Program.load(result.files["program"])) == result.recording["ops"]  # kept for amem replay


def test_compare_a_script_through_the_cli(tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import sys, torch
        n = int(sys.argv[1])
        device = "cuda" if torch.cuda.is_available() else "cpu"   # prediction says it is there
        w = torch.randn(256, 256, requires_grad=True, device=device)
        for i in range(n):
            x = torch.randn(64 * (i + 1), 256, device=device)
            (x @ w).relu().sum().backward()
    """))
    out = tmp_path / "out"
    rc = amem(["compare", "--policies", "torch,conf:garbage_collection_threshold:0.5", "--out", str(out),
               "--no-progress", "--", "python", str(script), "3"])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "PREDICTED" in text and "conf:garbage_collection_threshold:0.5" in text
    saved = json.loads((out / "compare.json").read_text())
    assert saved["recording"]["script"] == [str(script), "3"] and saved["recording"]["ops"] > 6
    assert len({r["pid"] for r in saved["rows"]}) == 2


def test_real_mode_without_a_gpu_fails_clearly(tmp_path):
    result = compare(workload="mlp", steps=1, policies=["torch"], mode="real", out_dir=tmp_path, progress=False)
    assert result.mode == "real" and "needs a CUDA device" in result.rows[0]["error"]
    assert "failed" in format_text(result)


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown workload"):
        compare(workload="resnet")
    with pytest.raises(ValueError, match="size"):
        compare(workload="gpt", size=0)
    with pytest.raises(ValueError, match="one of the two"):
        compare(workload="gpt", script=["x.py"])
    assert _script(["--", "python3", "a.py", "-x"]) == ["a.py", "-x"] and _script([]) is None
    with pytest.raises(ValueError, match="not a Python script"):
        _script(["--", "bash", "run.sh"])


def test_compare_without_a_gpu_models_cuda_allocations(tmp_path):
    """The recorded program is CUDA's: a matmul's cuBLAS workspace is in it, which no CPU run allocates."""
    from amem_alloc.compare.predicted_program import record

    meta = record(tmp_path, "mlp", 1, 1, None)
    program = replay.Program.load(tmp_path / "program.npz")
    sizes = program.ops[program.ops["kind"] == replay.ALLOC]["size"].tolist()
    assert meta["steps"] == 1 and len(sizes) == meta["allocations"] > 0
    assert (32 << 20) in sizes                  # cuBLAS's workspace on an H100 (the default card): 32 MiB


def test_code_whose_sizes_need_values_fails_with_one_line(tmp_path):
    script = tmp_path / "dd.py"     # a value read gets a stand-in; a size with no upper bound cannot
    script.write_text("import torch\nx = torch.randn(4, device='cuda')\nprint(float(x.sum()))\n"
                      "torch.bincount(x.long())\n")
    with pytest.raises(RuntimeError, match=rf"predicting the workload's allocations failed: cannot predict.*dd.py:4"):
        compare(script=[str(script)], policies=["torch"], out_dir=tmp_path / "out", progress=False)


def test_policy_lists():
    assert [p.name for p in policies.parse_list("torch, amem")] == ["torch", "amem"]
    assert [p.name for p in policies.parse_list("all")] == list(policies.POLICIES)
    mixed = policies.parse_list("amem,conf:max_split_size_mb:64,roundup_power2_divisions:2")
    assert mixed[-1].conf == "max_split_size_mb:64,roundup_power2_divisions:2" and not mixed[-1].native
    assert policies.get("torch-expandable").native and not policies.get("amem").native


def test_text_table_shows_failed_rows():
    result = SimpleNamespace(mode="real", target="workload gpt (size 1)", recording=None,
                             environment={"device": "GPU", "torch": "2", "date": "today"},
                             rows=[{"policy": "torch", "conf": "", "description": "d", "error": "boom"}])
    assert "failed: boom" in format_text(result)


def test_gpu_runs_read_their_timeline_from_the_allocator_trace():
    from amem_alloc.compare.child import trace_timeline

    MiB = 1 << 20
    def ev(action, size, addr=1 << 30):
        return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": 0, "frames": []}

    events = [ev("segment_alloc", 20 * MiB), ev("alloc", 3 * MiB + 1), ev("free_requested", 3 * MiB + 1),
              ev("alloc", MiB, 1 << 31), ev("free_completed", 3 * MiB + 1), ev("free_requested", MiB, 1 << 31),
              ev("free_completed", MiB, 1 << 31), ev("segment_free", 20 * MiB)]
    timeline, peak, at_peak = trace_timeline({"segments": [], "device_traces": [events]})
    # requests rounded to 512 B; a block is held until its free_completed (amem_alloc/timeline.py)
    assert peak == 20 * MiB and at_peak == 4 * MiB + 512
    assert timeline[-1] == [7, 0, 0] and len(timeline) == len(events)
    assert [p[1] for p in timeline] == [0, 3 * MiB + 512, 3 * MiB + 512, 4 * MiB + 512, MiB, MiB, 0, 0]


# ---------------------------------------------------------------------------- a script, as a new user runs it (issue 37)
LONG_TRAINING = textwrap.dedent("""\
    import torch
    w = torch.nn.Linear(64, 64).cuda()
    opt = torch.optim.SGD(w.parameters(), lr=0.1)
    for i in range(5000):                     # nanoGPT's max_iters: the run must not go to its end
        w(torch.randn(32, 64, device="cuda")).sum().backward()
        opt.step()
        opt.zero_grad()
        print(f"trained step {i}")
""")


class _Terminal:
    """A stderr that says it is a terminal, keeping what is written."""

    def __init__(self):
        self.text = ""

    def isatty(self):
        return True

    def write(self, text):
        self.text += text

    def flush(self):
        pass


def test_a_script_stops_after_steps_with_progress_and_a_plot_without_optional_installs(tmp_path, monkeypatch):
    import sys

    script = tmp_path / "train.py"
    script.write_text(LONG_TRAINING)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # neither installed: import fails
    monkeypatch.setitem(sys.modules, "tqdm", None)
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    result = compare(script=[str(script)], steps=2, policies=["torch", "amem"], out_dir=tmp_path / "c")
    assert result.recording["steps"] == 2 and result.recording["info"]["stopped_after_steps"] == 2
    assert "stopped after 2 optimizer steps" in format_text(result)
    assert "png" not in result.files and not (tmp_path / "c" / "compare.png").exists()
    page = (tmp_path / "c" / "compare.html").read_text()
    assert "<svg class='compare-plot'" in page and page.count("<polyline") == 4 and page.count("class='mark'") == 2
    assert "predicting the allocations: step 2 of 2" in terminal.text    # the recording's steps as they go
    assert "3/3 runs done" in terminal.text and terminal.text.endswith("\r\x1b[K")  # then the runs; cleared


def test_compare_on_a_script_prints_its_output_then_only_its_table(tmp_path):
    from helpers import run_command

    script = tmp_path / "train.py"
    script.write_text(LONG_TRAINING)
    proc = run_command([sys.executable, "-m", "amem_alloc", "compare", "--policy", "torch", "--out", str(tmp_path / "c"),
                        "--", "python", str(script)], timeout=600)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    assert out[:4] == [f"trained step {i}" for i in range(4)] and "trained step 4" not in proc.stdout  # 5 steps
    assert out[4].startswith("amem compare: script ") and not [ln for ln in out if ln.lstrip().startswith("{")]
    assert proc.stderr == ""  # no note about matplotlib, no progress off a terminal
    recording = json.loads((tmp_path / "c" / "compare.json").read_text())["recording"]
    assert recording["steps"] == 5 and recording["info"]["stopped_after_steps"] == 5


def test_amems_own_failure_inside_the_script_is_amems_line_not_the_scripts(tmp_path):
    """Pickling a CUDA tensor runs on a GPU; under prediction amem cannot (predict/failures.py): amem
    compare ends with amem's one line and status 4, never "train.py exited with status 1"."""
    from helpers import run_command

    script = tmp_path / "train.py"
    script.write_text("import pickle, torch\nx = torch.randn(4, device='cuda')\nblob = pickle.dumps(x)\n")
    proc = run_command([sys.executable, "-m", "amem_alloc", "compare", "--policy", "torch", "--out", str(tmp_path / "c"),
                        "--", "python", str(script)], timeout=600)
    assert proc.returncode == 4, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "exited with status" not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.rstrip().splitlines()[-1]
    assert last.startswith("amem compare: cannot model NotImplementedError: Cannot copy out of meta tensor") \
        and " at train.py:3 " in last and last.endswith("please report it; nothing was compared"), last
